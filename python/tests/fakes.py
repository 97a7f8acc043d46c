"""Fake SGLang / vLLM pool objects with the engines' attribute names and tensor shapes, built
from numpy + ml_dtypes arrays (the shapes are SGLang's and vLLM's, written out in each
constructor; see kvlayout/adapters/*.py for the source files)."""

from __future__ import annotations

import types

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
FP8 = ml_dtypes.float8_e4m3fn


class FakeTorchDtype:
    """Stands for torch.float8_e4m3fn etc.: str() gives the torch spelling."""

    def __init__(self, name: str):
        self.name = name

    def __str__(self) -> str:
        return f"torch.{self.name}"


def mha_device(layers=2, pages=8, page=64, heads=8, dim=128, dtype=BF16, logical=None):
    """MHATokenToKVPool: k_buffer/v_buffer per layer [size + page_size, head_num, head_dim]."""
    size = pages * page - page
    shape = (size + page, heads, dim)
    return types.SimpleNamespace(
        page_size=page, size=size, head_num=heads, head_dim=dim, layer_num=layers,
        dtype=logical or np.dtype(dtype), store_dtype=np.dtype(dtype),
        k_buffer=[np.zeros(shape, dtype) for _ in range(layers)],
        v_buffer=[np.zeros(shape, dtype) for _ in range(layers)])


def mha_mxfp8_device(layers=2, pages=8, page=64, heads=8, dim=128):
    """MHATokenToKVPoolMXFP8: e4m3 k_buffer/v_buffer per layer [size + page_size, head_num,
    head_dim] plus k_scale_buffer/v_scale_buffer [size + page_size, head_num, head_dim // 32] in
    float8_e8m0fnu (one scale per 32 elements)."""
    pool = mha_device(layers, pages, page, heads, dim, dtype=FP8,
                      logical=FakeTorchDtype("float8_e4m3fn"))
    shape = (pages * page, heads, dim // 32)
    pool.k_scale_buffer = [np.zeros(shape, ml_dtypes.float8_e8m0fnu) for _ in range(layers)]
    pool.v_scale_buffer = [np.zeros(shape, ml_dtypes.float8_e8m0fnu) for _ in range(layers)]
    return pool


def mha_host(device, pages=16, layout="layer_first"):
    """MHATokenToKVPoolHost.init_kv_buffer dims per layout."""
    page, L, H, D = device.page_size, device.layer_num, device.head_num, device.head_dim
    size = pages * page
    dims = {
        "layer_first": (2, L, size, H, D),
        "page_first": (2, size, L, H, D),
        "page_first_direct": (2, pages, L, page, H, D),
        "page_head": (2, pages, H, page, L, D),
    }[layout]
    kv = np.zeros(dims, device.store_dtype)
    return types.SimpleNamespace(
        device_pool=device, layout=layout, page_size=page, size=size, page_num=pages,
        layer_num=L, head_num=H, head_dim=D, dtype=device.store_dtype, kv_buffer=kv,
        token_stride_size=H * D * kv.itemsize)


def dsa_device(layers=3, pages=8, page=64, index_k="bf16", kv_dim=656):
    """NSATokenToKVPool (DeepSeek-V3.2, fp8 KV): kv_buffer per layer [size + page_size, 1, 656]
    uint8 (FlashMLA sparse row), index_k_with_scale_buffer per layer [num_pages, page_bytes]:
    bf16 variant page_size * 128 bf16, fp8 page_size * (128 + 128 // 128 * 4) uint8."""
    size = pages * page - page
    num_pages = (size + page + 1) // page
    if index_k == "bf16":
        idx = [np.zeros((num_pages, page * 128), BF16) for _ in range(layers)]
    else:
        idx = [np.zeros((num_pages, page * (128 + 128 // 128 * 4)), np.uint8) for _ in range(layers)]
    return types.SimpleNamespace(
        page_size=page, size=size, layer_num=layers, kv_lora_rank=512, qk_rope_head_dim=64,
        dtype=FakeTorchDtype("float8_e4m3fn"), store_dtype=np.dtype(np.uint8),
        kv_cache_dim=kv_dim, index_head_dim=128, quant_block_size=128,
        kv_buffer=[np.zeros((size + page, 1, kv_dim), np.uint8) for _ in range(layers)],
        index_k_with_scale_buffer=idx)


def dsa_host(device, pages=16, layout="layer_first"):
    """NSATokenToKVPoolHost: MLA host kv_buffer plus the index-K mirror sized by the fp8
    formula, indexer_page_stride_size = page_size * (128 + 128 // 128 * 4) = 8448 B."""
    page, L = device.page_size, device.layer_num
    size = pages * page
    dim = device.kv_cache_dim
    kv_dims = {"layer_first": (L, size, 1, dim), "page_first": (size, L, 1, dim)}[layout]
    stride = page * (128 + 128 // 128 * 4)
    idx_pages = (size + page + 1) // page
    idx_dims = {"layer_first": (L, idx_pages, stride), "page_first": (idx_pages, L, 1, stride)}[layout]
    return types.SimpleNamespace(
        device_pool=device, layout=layout, page_size=page, size=size, page_num=pages,
        layer_num=L, kv_lora_rank=512, qk_rope_head_dim=64, kv_cache_dim=dim,
        dtype=np.dtype(np.uint8), kv_buffer=np.zeros(kv_dims, np.uint8),
        token_stride_size=dim, index_head_dim=128, indexer_quant_block_size=128,
        indexer_page_stride_size=stride, indexer_dtype=np.dtype(np.uint8),
        index_k_with_scale_buffer=np.zeros(idx_dims, np.uint8))


# vLLM (vllm/v1/kv_cache_interface.py): the spec classes by name, with their fields.
class FullAttentionSpec(types.SimpleNamespace):
    pass


class SlidingWindowSpec(types.SimpleNamespace):
    pass


class MLAAttentionSpec(types.SimpleNamespace):
    pass


class MambaSpec(types.SimpleNamespace):
    pass


class UniformTypeKVCacheSpecs(types.SimpleNamespace):
    """One group of layers whose specs differ but keep the same token slots:
    ``kv_cache_specs: dict[str, KVCacheSpec]`` per layer."""


def spec(cls=FullAttentionSpec, block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, **kw):
    return cls(block_size=block_size, num_kv_heads=num_kv_heads, head_size=head_size,
               dtype=np.dtype(dtype), **kw)


def kv_cache_config(num_blocks, groups):
    """KVCacheConfig(num_blocks, kv_cache_groups=[KVCacheGroupSpec(layer_names, kv_cache_spec)])."""
    return types.SimpleNamespace(
        num_blocks=num_blocks, kv_cache_tensors=[],
        kv_cache_groups=[types.SimpleNamespace(layer_names=names, kv_cache_spec=s) for names, s in groups])


def flashinfer_cache(num_blocks, s):
    """FlashInfer: [num_blocks, 2, block_size, num_kv_heads, head_size]."""
    return np.zeros((num_blocks, 2, s.block_size, s.num_kv_heads, s.head_size), s.dtype)
