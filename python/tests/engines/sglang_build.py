"""SGLang 0.5.23 pools built with SGLang's own constructors on the CPU (../shared/ENGINES.md,
"Exact steps"): device pools of ``size=448`` tokens in pages of 64 (``size + page_size = 512``
token slots: 8 pages per layer), host pools at ``host_to_device_ratio=2.0`` with
``pin_memory=False`` (SGLang would otherwise ``cudaHostRegister``)."""

from __future__ import annotations

import contextlib
import os

import torch
from sglang.srt.mem_cache.hybrid_cache import hybrid_pool_assembler as asm
from sglang.srt.mem_cache.memory_pool import (
    DSATokenToKVPool,
    MHATokenToKVPool,
    MHATokenToKVPoolMXFP8,
    MLATokenToKVPool,
    MLATokenToKVPoolFP4,
)
from sglang.srt.mem_cache.pool_host.dsa import DSAIndexerPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.runtime_context import get_parallel

SIZE_TOKENS = 448
PAGE_TOKENS = 64
HOST = dict(host_to_device_ratio=2.0, host_size=0, allocator_type="default", pool_label="kv",
            pin_memory=False)


@contextlib.contextmanager
def env(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def mha(dtype=torch.bfloat16, *, layers=2, heads=2, head_dim=64, v_head_dim=None,
        page=PAGE_TOKENS, size=SIZE_TOKENS, cls=MHATokenToKVPool):
    kw = {} if v_head_dim is None else {"v_head_dim": v_head_dim}
    return cls(size=size, page_size=page, dtype=dtype, head_num=heads, head_dim=head_dim,
               layer_num=layers, device="cpu", enable_memory_saver=False, **kw)


def mha_host(device, layout: str, **extra):
    cls, info, kw = asm._mha_host_inputs(device)
    return cls(info, page_size=device.page_size, layout=layout, **HOST, **kw, **extra)


def mla(dtype=torch.bfloat16, *, layers=2, cls=MLATokenToKVPool):
    return cls(size=SIZE_TOKENS, page_size=PAGE_TOKENS, kv_lora_rank=512, dtype=dtype,
               qk_rope_head_dim=64, layer_num=layers, device="cpu", enable_memory_saver=False)


def dsa(dtype=torch.float8_e4m3fn, *, kv_cache_dim=656, layers=3, page=PAGE_TOKENS, **kw):
    with get_parallel().override(attn_dcp_size=1):
        return DSATokenToKVPool(size=SIZE_TOKENS, page_size=page, kv_lora_rank=512, dtype=dtype,
                                qk_rope_head_dim=64, layer_num=layers, device="cpu",
                                index_head_dim=128, enable_memory_saver=False,
                                kv_cache_dim=kv_cache_dim, **kw)


def mla_host(device, layout: str):
    return MLATokenToKVPoolHost(
        device.get_device_pool_infos()[0].buffer_info, device_capacity_tokens=device.size,
        start_layer=device.start_layer, end_layer=device.end_layer,
        target_layer_num=device.layer_num, override_kv_cache_dim=device.kv_cache_dim,
        page_size=device.page_size, layout=layout, **HOST)


def indexer_host(device, anchor):
    decl = [d for d in device.host_pool_decls() if d.host_pool_builder is not None][0]
    return DSAIndexerPoolHost(decl=decl, anchor_host=anchor, pin_memory=False)


__all__ = ["MHATokenToKVPoolMXFP8", "MLATokenToKVPoolFP4", "env", "mha", "mha_host", "mla",
           "mla_host", "dsa", "indexer_host", "SIZE_TOKENS", "PAGE_TOKENS"]
