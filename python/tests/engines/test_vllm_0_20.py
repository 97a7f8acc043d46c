"""kvlayout's vLLM adapter on vLLM 0.20.0's own allocation code (scripts/engines-ci.sh runs this
file alone with the unpacked 0.20.0 wheel first on PYTHONPATH).

The tensors come from the real ``GPUModelRunner._allocate_kv_cache_tensors`` and
``_reshape_kv_cache_tensors`` (and ``_update_hybrid_attention_mamba_layout`` for attention +
Mamba), called on a minimal runner holding ``device``, ``runner_only_attn_layers``,
``kv_cache_config``, ``cache_config`` and ``attn_groups`` of real ``AttentionGroup`` objects with
the real backend classes, inside ``set_current_vllm_config`` (../shared/ENGINES.md, "vLLM
0.20")."""

from __future__ import annotations

import json
import types
import warnings

import pytest
import torch

import kvlayout
from kvlayout.adapters import vllm as kvl

warnings.filterwarnings("ignore")
import vllm  # noqa: E402

assert vllm.__version__ == "0.20.0", vllm.__version__

from vllm.config import CacheConfig, DeviceConfig, ModelConfig, VllmConfig, set_current_vllm_config  # noqa: E402,E501
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator  # noqa: E402
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # noqa: E402
from vllm.v1.attention.backends.gdn_attn import GDNAttentionBackend  # noqa: E402
from vllm.v1.core import kv_cache_utils  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec  # noqa: E402
from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # noqa: E402
from vllm.v1.worker.utils import AttentionGroup  # noqa: E402

from vllm_build import TINY_LLAMA  # noqa: E402


def config(tmp_path, *, hybrid_manager: bool):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY_LLAMA))
    vc = VllmConfig(model_config=ModelConfig(model=str(model), skip_tokenizer_init=True,
                                             max_model_len=512, dtype="bfloat16"),
                    cache_config=CacheConfig(block_size=16), device_config=DeviceConfig(device="cpu"))
    vc.scheduler_config.disable_hybrid_kv_cache_manager = not hybrid_manager
    return vc


def allocate(vc, specs, backends, memory_bytes):
    groups = kv_cache_utils.get_kv_cache_groups(vc, specs)
    cfg = kv_cache_utils.get_kv_cache_config_from_groups(vc, groups, memory_bytes)
    runner = types.SimpleNamespace(
        device=torch.device("cpu"), runner_only_attn_layers=set(), kv_cache_config=cfg,
        cache_config=vc.cache_config,
        attn_groups=[[AttentionGroup(backend=backends[type(g.kv_cache_spec).__name__],
                                     layer_names=g.layer_names, kv_cache_spec=g.kv_cache_spec,
                                     kv_cache_group_id=i)] for i, g in enumerate(cfg.kv_cache_groups)])
    for name in ("_kv_cache_spec_attn_group_iterator", "_update_hybrid_attention_mamba_layout"):
        setattr(runner, name, types.MethodType(getattr(GPUModelRunner, name), runner))
    with set_current_vllm_config(vc):
        raw = GPUModelRunner._allocate_kv_cache_tensors(runner, cfg)
        block_sizes = [g.kv_cache_spec.block_size for g in cfg.kv_cache_groups]
        kv = GPUModelRunner._reshape_kv_cache_tensors(runner, raw, block_sizes)
    return cfg, kv


def attn(n):
    return f"model.layers.{n}.self_attn.attn"


def buf(g, name):
    return next(b for b in g.buffers if b["name"] == name)


def full(block=16):
    return FullAttentionSpec(block_size=block, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)


def test_dense_flash_attention(tmp_path):
    vc = config(tmp_path, hybrid_manager=False)
    # 2 layers x 10 blocks x 16 tokens x (2 x 2 x 64 x 2 B = 512 B) = 163840 B.
    cfg, kv = allocate(vc, {attn(0): full(), attn(1): full()},
                       {"FullAttentionSpec": FlashAttentionBackend}, 163840)
    t = kv[attn(0)]
    assert tuple(t.shape) == (2, cfg.num_blocks, 16, 2, 64)
    g = kvl.geometry(kv, cfg)
    assert buf(g, "k")["bytes_per_token"] == 2 * 64 * 2 == t.stride(2) * t.element_size()
    assert buf(g, "k")["page_stride_bytes"] == 16 * 256 == t.stride(1) * t.element_size()


def test_hybrid_manager_aliased_groups_counted_once(tmp_path):
    vc = config(tmp_path, hybrid_manager=True)
    swa = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16,
                            sliding_window=128)
    specs = {attn(0): swa, attn(1): full(), attn(2): swa, attn(3): full()}
    backends = {"SlidingWindowSpec": FlashAttentionBackend, "FullAttentionSpec": FlashAttentionBackend}
    cfg, kv = allocate(vc, specs, backends, 163840)
    assert len(cfg.kv_cache_groups) == 2
    # KVCacheTensor.shared_by: layer 0 (swa) and layer 1 (full) share one allocation.
    assert kv[attn(0)].data_ptr() == kv[attn(1)].data_ptr()
    g = kvl.geometry(kv, cfg)
    allocated = sum(t.size for t in cfg.kv_cache_tensors)
    assert kvl.allocated_bytes(kv) == allocated
    assert g.total_bytes == 2 * allocated  # each group's buffers as if they had their own memory
    assert buf(g, "swa.k")["layer_ids"] == [0, 2]


def test_qwen3_next_attention_and_mamba(tmp_path):
    vc = config(tmp_path, hybrid_manager=True)
    conv, temporal = MambaStateShapeCalculator.gated_delta_net_state_shape(1, 2, 4, 32, 32, 4)
    mamba = MambaSpec(block_size=64, shapes=(conv, temporal),
                      dtypes=(torch.bfloat16, torch.bfloat16), page_size_padded=32768)
    specs = {f"model.layers.{i}.linear_attn": mamba for i in range(3)}
    specs[attn(3)] = FullAttentionSpec(block_size=64, num_kv_heads=2, head_size=64,
                                       dtype=torch.bfloat16, page_size_padded=32768)
    backends = {"MambaSpec": GDNAttentionBackend, "FullAttentionSpec": FlashAttentionBackend}
    cfg, kv = allocate(vc, specs, backends, 10 * 32768)
    t = kv[attn(3)]
    # (2, blocks, 64, 2, 64) re-strided K/V-adjacent: K axis 64 x 2 x 64 = 8192 elements apart,
    # blocks 2 x 8192 = 16384 elements (32768 B) apart.
    assert t.shape[0] == 2 and t.stride()[:2] == (8192, 16384)
    g = kvl.geometry(kv, cfg)
    b = buf(g, "full")
    # per block the K plane then the V plane: section-major K, V of 2 x 64 bf16 each.
    assert b["arrangement"] == "section_major"
    assert b["bytes_per_token"] == 2 * 2 * 64 * 2 == 512
    assert b["page_stride_bytes"] == 32768 == t.stride(1) * t.element_size()
    conv_bytes = conv[0] * conv[1] * 2
    assert buf(g, "state.state0")["bytes_per_token"] == conv_bytes
    assert buf(g, "state.state0")["page_stride_bytes"] == 32768


def test_dense_flash_attention_hnd(tmp_path, monkeypatch):
    from vllm.v1.attention.backends.utils import get_kv_cache_layout

    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", "HND")
    get_kv_cache_layout.cache_clear()  # vLLM caches the layout for the process (functools.lru_cache)
    try:
        vc = config(tmp_path, hybrid_manager=False)
        cfg, kv = allocate(vc, {attn(0): full(), attn(1): full()},
                           {"FullAttentionSpec": FlashAttentionBackend}, 163840)
    finally:
        get_kv_cache_layout.cache_clear()
    t = kv[attn(0)]
    # (2, blocks, 16 tokens, 2 heads, 64) with heads outside the tokens: head stride 16 x 64.
    assert t.stride(3) == 16 * 64 and t.stride(2) == 64
    g = kvl.geometry(kv, cfg)
    assert buf(g, "k")["arrangement"] == "head_major"
    assert buf(g, "k")["page_stride_bytes"] == 16 * 2 * 64 * 2 == t.stride(1) * t.element_size()


def test_mla_triton(tmp_path):
    from vllm.v1.attention.backends.mla.triton_mla import TritonMLABackend
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    vc = config(tmp_path, hybrid_manager=False)
    spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    # 2 layers x 10 blocks x 64 tokens x 1152 B.
    cfg, kv = allocate(vc, {attn(0): spec, attn(1): spec}, {"MLAAttentionSpec": TritonMLABackend},
                       2 * 10 * 64 * 1152)
    t = kv[attn(0)]
    assert tuple(t.shape) == (cfg.num_blocks, 64, 576)
    g = kvl.geometry(kv, cfg)
    assert buf(g, "kv")["bytes_per_token"] == 576 * 2 == t.stride(1) * t.element_size()
    assert buf(g, "kv")["page_stride_bytes"] == 64 * 1152 == t.stride(0) * t.element_size()
    assert [s["name"] for s in buf(g, "kv")["sections"]] == ["latent", "rope"]
