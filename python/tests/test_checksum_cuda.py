"""Page checksums of CUDA tensors, computed on their device by the Rust NVRTC kernel
(kvlayout.checksum/v1), bit for bit the CPU's: ``TransferGuard.page_checksums``,
``record_backup`` / ``verify_load`` and ``page_checksum`` take a CUDA tensor in place. Skipped,
saying why, without torch or without a CUDA GPU (the H200 runs of scripts/gpu-check.sh run
them with the GPU required)."""

from __future__ import annotations

import os

import pytest

import kvlayout

# scripts/gpu-check.sh sets KVLAYOUT_REQUIRE_GPU=1: there a missing torch or GPU fails the run.
if os.environ.get("KVLAYOUT_REQUIRE_GPU") == "1":
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("KVLAYOUT_REQUIRE_GPU=1, but torch sees no CUDA GPU")
else:
    torch = pytest.importorskip("torch", reason="torch not installed: CUDA tensors not tested")
pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA GPU: CUDA-tensor checksums are tested on the H200 runs (scripts/gpu-check.sh)")

# DeepSeek-V3.2: kv 656 B per token (64-token pages: 41,984 B, ten 4-KiB chunks and a
# 1,024-byte one), index_k bf16 256 B per token (16,384 B, four chunks).
GEOMETRY = kvlayout.describe("deepseek-v3.2-exp", index_k="bf16")
PAGES = 8
TOKEN_BYTES = {"kv": 656, "index_k": 256}


def _layer(buffer: str, seed: int) -> torch.Tensor:
    """One layer of `buffer` on the CPU, [tokens][token bytes] (SGLang's per-layer tensor), random."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (PAGES * 64, TOKEN_BYTES[buffer]), dtype=torch.uint8,
                         generator=g)


@pytest.mark.parametrize("buffer", ["kv", "index_k"])
def test_cuda_page_checksums_equal_the_cpu_bit_for_bit(buffer):
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="all")
    cpu = _layer(buffer, 1)
    gpu = cpu.to("cuda")
    pages = [7, 0, 3, 3, 5]
    want = guard.page_checksums(buffer, 2, cpu, pages)
    assert guard.page_checksums(buffer, 2, gpu, pages) == want
    assert len(set(want)) == 4  # pages 7, 0, 3, 5 differ; page 3 twice
    # One payload: a contiguous slice of the CUDA tensor, read at its own address.
    assert kvlayout.page_checksum(GEOMETRY, buffer, 2, gpu[3 * 64:4 * 64]) == want[2]
    # Seeded by the layer: another layer gives other values on the device too.
    assert guard.page_checksums(buffer, 3, gpu, [7])[0] != want[0]


def test_cuda_pages_at_an_unaligned_address_equal_the_cpu():
    # The layer starts 8 bytes into the allocation: not 16-byte aligned, so the kernel reads
    # every chunk word by word; the values are the same.
    stride = 64 * 656
    cpu = _layer("kv", 2).reshape(-1)
    gpu = torch.zeros(PAGES * stride + 8, dtype=torch.uint8, device="cuda")
    gpu[8:] = cpu.to("cuda")
    shifted = gpu[8:]
    assert shifted.data_ptr() % 16 == 8
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY)
    assert guard.page_checksums("kv", 0, shifted, list(range(PAGES))) == \
        guard.page_checksums("kv", 0, cpu, list(range(PAGES)))


def test_a_corrupted_cuda_load_is_refused_naming_the_page():
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY, checksum="all")
    device = _layer("index_k", 3).to("cuda")
    assert guard.record_backup("index_k", 0, device, [0, 1], [4, 5]) == 2
    loaded = torch.zeros_like(device)
    loaded[2 * 64:3 * 64] = device[0:64]  # host page 4 -> device page 2
    loaded[6 * 64:7 * 64] = device[64:128]  # host page 5 -> device page 6
    assert guard.verify_load("index_k", 0, loaded, [4, 5], [2, 6]) == 2
    loaded[6 * 64 + 10, 100] ^= 1  # one bit of device page 6, on the device
    with pytest.raises(kvlayout.TransferRefused) as e:
        guard.verify_load("index_k", 0, loaded, [4, 5], [2, 6])
    assert e.value.kind == "checksum_mismatch"
    assert e.value.pages == [(5, 6)]


def test_cuda_tensors_are_refused_by_name_when_not_contiguous_or_too_short():
    guard = kvlayout.TransferGuard(GEOMETRY, GEOMETRY)
    gpu = _layer("index_k", 4).to("cuda")
    with pytest.raises(ValueError, match="data: a non-contiguous tensor"):
        guard.page_checksums("index_k", 0, gpu[:, ::2], [0])
    with pytest.raises(ValueError, match=r"data: page 8 \(16384 B stride, 16384 B payload\) "
                                         r"ends past the 131072 bytes given"):
        guard.page_checksums("index_k", 0, gpu, [8])
    with pytest.raises(ValueError, match="16384 bytes given to a checksum of a 41984-byte"):
        kvlayout.page_checksum(GEOMETRY, "kv", 0, gpu[0:64])
