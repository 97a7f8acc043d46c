"""Compare the GPU fp8 index-K quantizer's output with PyTorch's own float8_e4m3fn conversion.

Usage: python3 torch_check.py DIR   (DIR written by `gpu_bench --dump DIR`)

Inputs: DIR/keys_bf16.bin (tokens x 128 bf16, little-endian), DIR/cache_{f32,ue8m0}.bin (index-K
pages of 64 tokens, section_major: [64 x 128 B e4m3][64 x 4 B f32 scales], slots 0..tokens).
The reference follows DeepSeek-V3.2-Exp's act_quant in float32 on the CPU:
amax = max(|x|) clamped below at 1e-4; s = amax * f32(1/448) (ue8m0: 2^ceil(log2 s) by exponent
bits); q = clamp(x / s, -448, 448).to(torch.float8_e4m3fn). Exits 1 on any differing byte.
"""
import sys

import numpy as np
import torch

P = 64
d = sys.argv[1]
raw = np.fromfile(f"{d}/keys_bf16.bin", dtype=np.uint16).reshape(-1, 128)
x = torch.from_numpy(raw.view(np.int16).copy()).view(torch.bfloat16).float()
n = x.shape[0]
ok = True
for fmt in ["f32", "ue8m0"]:
    pages = np.fromfile(f"{d}/cache_{fmt}.bin", dtype=np.uint8).reshape(-1, P * 132)
    vals = pages[:, : P * 128].reshape(-1, 128)[:n]
    scales = pages[:, P * 128 :].copy().view(np.float32).reshape(-1)[:n]
    amax = x.abs().amax(dim=1).clamp(min=1e-4)
    s = amax * torch.tensor(1.0 / 448.0, dtype=torch.float32)
    if fmt == "ue8m0":
        bits = s.view(torch.int32)
        e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
        s = ((e + 127) << 23).to(torch.int32).view(torch.float32)
    q = (x / s[:, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    val_diff = int((q != vals).sum())
    scale_diff = int((s.numpy().view(np.uint32) != scales.view(np.uint32)).sum())
    print(f"torch {torch.__version__} float8_e4m3fn, scale {fmt}: {n} tokens, "
          f"{val_diff} differing value bytes of {n * 128}, {scale_diff} differing scales of {n}")
    ok = ok and val_diff == 0 and scale_diff == 0
print("torch check:", "IDENTICAL" if ok else "DIFFERENT")
sys.exit(0 if ok else 1)
