"""vLLM KV caches -> a kvlayout geometry, from what a KV connector is handed.

Duck-typed: nothing from vLLM or torch is imported. Inputs, with their names in vLLM's source:

- ``kv_caches``: ``{layer_name: tensor}``, the argument of
  ``KVConnectorBase_V1.register_kv_caches(kv_caches)`` (``vllm/distributed/kv_transfer/
  kv_connector/v1/base.py``; ``NixlConnector.register_kv_caches`` in ``.../v1/nixl_connector.py``
  reads the same tensors). Per attention layer one tensor:
  FlashAttention ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (K blocks, then V
  blocks), FlashInfer ``[num_blocks, 2, block_size, num_kv_heads, head_size]`` (per block a K
  plane then a V plane), either with HND strides (heads outside the block's tokens) when
  ``kv_cache_layout`` is HND; MLA ``[num_blocks, block_size, head_size]`` (576 elements, or 656
  ``uint8`` for ``fp8_ds_mla``); the DeepSeek-V3.2 indexer (``DeepseekV32IndexerCache`` in
  ``vllm/model_executor/models/deepseek_v2.py``, layer ``model.layers.N.self_attn.indexer.k_cache``:
  any layer whose name holds ``indexer``; spec ``MLAAttentionSpec(num_kv_heads=1, head_size=132,
  dtype=uint8)``) ``[num_blocks, block_size, 132]`` ``uint8`` (128 e4m3 keys + one f32 scale per
  128), or ``bfloat16`` ``[num_blocks, block_size, 128]`` where the indexer keeps bf16 keys.
- vLLM >= 0.30 (tested on 0.33.0): ``kv_caches[layer]`` is one ``[B, H, N, C]`` view per layer
  (``vllm/v1/worker/utils.py`` ``allocate_kv_cache`` -> ``create_kv_cache_views``) in the physical
  order of a ``KVCacheLayout`` (``vllm/v1/kv_cache_layout.py``: LBNHC, LBHNC as ``layer_first``,
  BLNHC, BLHNC as ``page_first``, LHBNC as ``layer_head``, BHLNC as ``page_head``; the layer
  stride, block stride and head stride checked against the memory layout's placement), C the
  per-(token, head) content (attention: K then V,
  ``head_size + head_size_v``), placed by ``KVCacheConfig.kv_cache_tensors`` (``KVCacheTensor``:
  ``size``, ``layers``, ``layer_stride``, ``block_stride``, ``offset``, in bytes); the layout name
  comes from ``geometry(..., kv_cache_layout=)`` or ``KVCacheConfig.kv_cache_layout``. A Mamba
  layer is one raw ``int8`` ``[B, 1, 1, bytes]`` tensor, split by the ``MambaSpec`` as
  ``bind_kv_cache`` splits it. Hybrid groups overlay one allocation: :func:`allocated_bytes`
  counts it once (``Geometry.total_bytes`` counts each group's buffers).
- ``kv_cache_config``: ``KVCacheConfig`` (``vllm/v1/kv_cache_interface.py``) with
  ``num_blocks`` and ``kv_cache_groups``, each a ``KVCacheGroupSpec`` with ``layer_names`` and
  ``kv_cache_spec``; or a ``{layer_name: KVCacheSpec}`` mapping (``get_kv_cache_spec()``), grouped
  here by equal spec. Specs read: ``FullAttentionSpec`` (``block_size``, ``num_kv_heads``,
  ``head_size``, ``head_size_v``, ``dtype``, ``sliding_window``, ``attention_chunk_size``,
  ``page_size_padded``), ``SlidingWindowSpec`` (``sliding_window``),
  ``ChunkedLocalAttentionSpec`` (``attention_chunk_size``), ``MLAAttentionSpec``
  (``cache_dtype_str``), ``MambaSpec`` (``shapes``, ``dtypes``, ``page_size_padded``: per layer
  a list of state tensors ``[num_blocks, *shape]`` sharing one block, as vLLM's model runner
  views the raw cache; one ``state`` buffer per state tensor).

Buffer names follow ``kvlayout describe`` (and the SGLang adapter), so ``compare`` works across
them: ``kv`` for the KV cache (FlashInfer's block of K and V planes, MLA's latent), ``index_k``
for the DeepSeek-V3.2 indexer (any layer whose name holds ``indexer``); FlashAttention's split
layout keeps K blocks and V blocks in two regions, so it gives two buffers ``k`` and ``v``, as
SGLang's MHA device pool (``k_buffer`` / ``v_buffer``) does. A hybrid model's groups are named by
their attention, as ``describe`` names them: ``full``, ``swa`` (sliding window), ``chunked``
(chunked local attention), ``state`` (Mamba / linear attention, one ``state.state{j}`` buffer
per state tensor); a second group of the same kind gets its index (``swa1``), a split
FlashAttention group ``swa.k`` / ``swa.v``. A hybrid group carries its layers as ``layer_ids``
(the integer in each layer name), its block size as the buffer's ``page_size_tokens`` and
sliding / chunked windows as its ``attention`` (geometry v2).

``tp`` / ``rank``: the worker's tensor-parallel size and rank. Given (``tp=1`` too: a TP1 side
must say so to compare with a sharded one), every buffer carries a
``shard``: KV heads split (``heads_total = num_kv_heads x tp``) for MHA caches, replicated for MLA
and the indexer, so a TP1 prefill and a TP2 decode compare at level ``token``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from .._kvlayout import Geometry
from ..errors import InvalidGeometry, KvLayoutError, TensorMismatch
from ..tensors import TensorBuffer, check_pieces, geometry_from_tensors, tensor_facts

__all__ = ["geometry", "transfer_guard", "allocated_bytes", "KV_CACHE_LAYOUTS"]

_WIDE = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
_FP8 = {"fp8": "f8e4m3", "fp8_e4m3": "f8e4m3", "fp8_e5m2": "f8e5m2", "fp8_inc": "f8e4m3"}
_TORCH_FP8 = {"float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2", "float8_e4m3fnuz": "f8e4m3fnuz"}


def _name(d: Any) -> str:
    s = str(d)
    return s[len("torch."):] if s.startswith("torch.") else s


def _elem_dtype(spec_dtype: Any, kv_cache_dtype: str, what: str) -> str:
    """The meaning of an element: the spec's dtype, or for uint8 storage ``kv_cache_dtype``."""
    n = _name(spec_dtype)
    if n in _WIDE:
        return _WIDE[n]
    if n in _TORCH_FP8:
        return _TORCH_FP8[n]
    if n == "uint8":
        if kv_cache_dtype in _FP8:
            return _FP8[kv_cache_dtype]
        raise KvLayoutError(f"{what}: uint8 storage with kv_cache_dtype {kv_cache_dtype!r}: "
                            f"pass kv_cache_dtype (one of {', '.join(_FP8)}) to say what it holds")
    raise KvLayoutError(f"{what}: dtype {n!r} is not modelled")


def _by_equal_spec(specs: Mapping[str, Any]) -> list[tuple[list[str], Any]]:
    """``{layer: spec}`` grouped by equal spec, in layer order."""
    out: list[tuple[list[str], Any]] = []
    for layer, spec in specs.items():
        for names, s in out:
            if s == spec:
                names.append(layer)
                break
        else:
            out.append(([layer], spec))
    return out


def _groups(kv_cache_config: Any) -> list[tuple[list[str], Any]]:
    groups = getattr(kv_cache_config, "kv_cache_groups", None)
    if groups is not None:
        out: list[tuple[list[str], Any]] = []
        for g in groups:
            per_layer = getattr(g.kv_cache_spec, "kv_cache_specs", None)
            if isinstance(per_layer, Mapping):
                # UniformTypeKVCacheSpecs: one group of layers whose specs differ (DeepSeek-V3.2's
                # MLA and indexer layers: other page sizes, same token count); each spec its own
                # buffer, as if vLLM had made two groups.
                missing = [n for n in g.layer_names if n not in per_layer]
                if missing:
                    raise KvLayoutError(f"kv_cache_groups: layer {missing[0]} has no spec in "
                                        "its group's kv_cache_specs")
                out += _by_equal_spec({n: per_layer[n] for n in g.layer_names})
            else:
                out.append((list(g.layer_names), g.kv_cache_spec))
        return out
    if isinstance(kv_cache_config, Mapping):
        return _by_equal_spec(kv_cache_config)
    raise KvLayoutError("kv_cache_config: expected a KVCacheConfig (kv_cache_groups) or a "
                        "{layer_name: KVCacheSpec} mapping")


def _layer_id(name: str) -> Optional[int]:
    m = re.search(r"\.(\d+)\.", f".{name}.")
    return int(m.group(1)) if m else None


def _attention(spec: Any) -> Any:
    """What the cache keeps. Only a ``SlidingWindowSpec`` (or ``SlidingWindowMLASpec``) keeps a
    window and only a ``ChunkedLocalAttentionSpec`` a chunk: a ``FullAttentionSpec`` that carries
    ``sliding_window`` / ``attention_chunk_size`` (vLLM without the hybrid allocator promotes
    those layers to full attention and merges the group's windows into one spec) allocates
    blocks for every token (vllm ``v1/kv_cache_interface.py``), so it is full."""
    kind = type(spec).__name__
    if "SlidingWindow" in kind and getattr(spec, "sliding_window", None):
        return {"sliding_window_tokens": int(spec.sliding_window)}
    if "ChunkedLocal" in kind and getattr(spec, "attention_chunk_size", None):
        return {"chunk_tokens": int(spec.attention_chunk_size)}
    if "Mamba" in kind:
        return "state"
    return None


def _kind(layers: list[str], spec: Any) -> str:
    """What a group holds, named as ``kvlayout describe`` names its buffers."""
    if any("indexer" in n for n in layers):
        return "index_k"
    if getattr(spec, "shapes", None) is not None:
        return "state"
    att = _attention(spec)
    if isinstance(att, dict):
        return "swa" if "sliding_window_tokens" in att else "chunked"
    return "full"


def _names(groups: list[tuple[list[str], Any]]) -> tuple[list[str], bool]:
    """Each group's buffer name, and whether the groups split layers by attention (hybrid)."""
    kinds = [_kind(layers, spec) for layers, spec in groups]
    hybrid = len([k for k in kinds if k != "index_k"]) > 1
    names: list[str] = []
    seen: dict[str, int] = {}
    for k in kinds:
        n = seen.get(k, 0)
        seen[k] = n + 1
        base = "kv" if k != "index_k" and not hybrid else k
        names.append(base if n == 0 else f"{base}{n}")
    return names, hybrid


def _shard(tp: Optional[int], rank: int, heads: Optional[int]) -> Optional[dict]:
    if tp is None:
        return None
    if heads is None:
        return {"split": "replicated", "tp_size": tp, "rank": rank}
    return {"split": "heads", "tp_size": tp, "rank": rank, "heads_total": heads * tp}


def _group_buffers(base: str, layers: list[str], spec: Any, kv_caches: Mapping[str, Any],
                   kv_cache_dtype: str, qk_rope_head_dim: int, hybrid: bool,
                   tp: Optional[int] = None, rank: int = 0,
                   placement: Optional["_Placement"] = None) -> list[TensorBuffer]:
    what = f"{base} ({type(spec).__name__}, layers {layers[0]}..)"
    missing = [n for n in layers if n not in kv_caches]
    if missing:
        raise KvLayoutError(f"{what}: kv_caches has no tensor for {missing[0]}")
    if getattr(spec, "shapes", None) is not None:
        return _state_buffers(base, what, layers, spec, kv_caches, hybrid)
    tensors = [kv_caches[n] for n in layers]
    block = int(spec.block_size)
    extra: dict = {"page_size_tokens": block}
    ids = [_layer_id(n) for n in layers]
    if hybrid and all(x is not None for x in ids) and len(set(ids)) == len(ids):
        extra["layer_ids"] = ids
    att = _attention(spec)
    if att is not None:
        extra["attention"] = att
    padded = getattr(spec, "page_size_padded", None)
    if padded:
        extra["page_stride_bytes"] = int(padded)
    f = tensor_facts(tensors[0])
    heads, head = int(spec.num_kv_heads), int(spec.head_size)
    if len(f.shape) == 4:  # vLLM >= 0.30: [B, H, N, C] per layer in a KVCacheLayout
        return _layer_view_buffers(base, what, layers, spec, tensors, kv_cache_dtype,
                                   qk_rope_head_dim, extra, placement, tp, rank)
    if len(f.shape) == 3:  # MLA or the indexer: [num_blocks, block_size, head_size]
        shard = _shard(tp, rank, None)
        if shard is not None:
            extra["shard"] = shard
        sections, arrangement = _mla_sections(what, layers, spec, head, kv_cache_dtype,
                                              qk_rope_head_dim)
        return [TensorBuffer(f"{base}", tensors, axes=("page", "page_token", "dim"),
                             sections=sections, arrangement=arrangement, extra=extra)]
    if len(f.shape) != 5:
        raise KvLayoutError(f"{what}: tensor shape {list(f.shape)} is neither MLA [blocks, "
                            "block_size, head_size], attention [2, blocks, block_size, heads, "
                            "head_size] / [blocks, 2, block_size, heads, head_size] nor a "
                            "[blocks, heads, block_size, C] layer view")
    return _split_kv_buffers(base, what, spec, tensors, kv_cache_dtype, extra, tp, rank)


def _mla_sections(what: str, layers: list[str], spec: Any, head: int, kv_cache_dtype: str,
                  qk_rope_head_dim: int) -> tuple[list[dict], str]:
    """An MLA (or indexer) row of ``head`` elements: its sections and arrangement."""
    cache = getattr(spec, "cache_dtype_str", None)
    is_indexer = any("indexer" in n for n in layers)
    sections: list[dict]
    if is_indexer:
        # uint8 rows of head_size = dim + dim // 128 * 4 bytes: e4m3 keys, then f32 scales.
        dim = head * 128 // 132
        if _name(spec.dtype) == "uint8" and dim + dim // 128 * 4 == head:
            sections = [{"name": "values", "dtype": "f8e4m3", "shape": [dim]},
                        {"name": "scale", "dtype": "f32", "shape": [dim // 128],
                         "scales": "values", "block_elems": 128}]
        else:
            sections = [{"name": "values", "shape": [head],
                         "dtype": _elem_dtype(spec.dtype, kv_cache_dtype, what)}]
        arrangement = "section_major"
    elif cache == "fp8_ds_mla":
        rank = head - qk_rope_head_dim
        sections = [{"name": "nope", "dtype": "f8e4m3", "shape": [rank]},
                    {"name": "nope_scale", "dtype": "f32", "shape": [rank // 128],
                     "scales": "nope", "block_elems": 128},
                    {"name": "rope", "dtype": "bf16", "shape": [qk_rope_head_dim]}]
        arrangement = "token_major"
    else:
        d = _elem_dtype(spec.dtype, kv_cache_dtype, what)
        sections = [{"name": "latent", "dtype": d, "shape": [head - qk_rope_head_dim]},
                    {"name": "rope", "dtype": d, "shape": [qk_rope_head_dim]}]
        arrangement = "token_major"
    return sections, arrangement


def _split_kv_buffers(base: str, what: str, spec: Any, tensors: list, kv_cache_dtype: str,
                      extra: dict, tp: Optional[int], rank: int) -> list[TensorBuffer]:
    """vLLM <= 0.25: FlashAttention ``[2, blocks, ...]`` or FlashInfer ``[blocks, 2, ...]``."""
    f = tensor_facts(tensors[0])
    heads, head = int(spec.num_kv_heads), int(spec.head_size)
    shard = _shard(tp, rank, heads)
    if shard is not None:
        extra["shard"] = shard
    d = _elem_dtype(spec.dtype, kv_cache_dtype, what)
    head_v = int(getattr(spec, "head_size_v", None) or head)
    kv_first = f.shape[0] == 2 and f.shape[1] != 2
    block_first = f.shape[1] == 2 and f.shape[0] != 2
    if kv_first and f.strides_bytes[0] < f.strides_bytes[1]:
        # vLLM 0.20 with attention and Mamba groups (GPUModelRunner.
        # _update_hybrid_attention_mamba_layout): the [2, blocks, ...] view re-strided so that a
        # block holds its K plane then its V plane: FlashInfer's [blocks, 2, ...] bytes.
        tensors = [_swap01(t) for t in tensors]
        kv_first, block_first = False, True
    if not (kv_first or block_first):
        raise KvLayoutError(f"{what}: tensor shape {list(f.shape)}: cannot tell the K/V axis "
                            "(both of the first two dimensions are 2)")
    # Heads outside the block's tokens. One head per rank (Llama-3.1-70B at TP 8) lays the same
    # bytes either way: NHD then, so it compares equal with the NHD form of the same cache.
    hnd = f.shape[3] > 1 and f.strides_bytes[3] > f.strides_bytes[2]
    if kv_first:  # FlashAttention: K blocks, then V blocks: two token-major buffers
        arrangement = "head_major" if hnd else "token_major"
        return [TensorBuffer(side if base == "kv" else f"{base}.{side}", [t[j] for t in tensors],
                             axes=("page", "page_token", "head", "dim"),
                             sections=[{"name": side, "dtype": d, "shape": [heads, width]}],
                             arrangement=arrangement, extra=dict(extra))
                for j, (side, width) in enumerate((("k", head), ("v", head_v)))]
    # FlashInfer: per block [K plane][V plane]: one section-major buffer over the whole block.
    return [TensorBuffer(f"{base}", [_Block(t) for t in tensors],
                         axes=("page", "page_bytes"),
                         sections=[{"name": "k", "dtype": d, "shape": [heads, head]},
                                   {"name": "v", "dtype": d, "shape": [heads, head_v]}],
                         arrangement="head_major" if hnd else "section_major", extra=extra)]


# vLLM >= 0.30 (vllm/v1/kv_cache_layout.py): the logical cache is [L, B, H, N, C]; each
# KVCacheLayout names the physical order: -> (kvlayout memory layout, heads outside the tokens).
# Heads outside the block: LHBNC ([L][H][B][N][C]) is layer_head, BHLNC ([B][H][L][N][C]) is
# page_head, byte for byte.
KV_CACHE_LAYOUTS = {
    "LBHNC": ("layer_first", True), "LBNHC": ("layer_first", False),
    "BLHNC": ("page_first", True), "BLNHC": ("page_first", False),
    "LHBNC": ("layer_head", True), "BHLNC": ("page_head", True),
}


class _View:
    """A strided view read by duck typing (numpy's protocol: ``dtype``, ``shape``, ``strides`` in
    bytes, ``itemsize``)."""

    def __init__(self, dtype: str, shape: tuple, strides: tuple, itemsize: int):
        self.dtype, self.shape, self.strides, self.itemsize = dtype, shape, strides, itemsize


class _Placement:
    """Where vLLM placed each layer: ``KVCacheConfig.kv_cache_tensors`` (``KVCacheTensor``:
    ``size``, ``layers`` in L order, ``layer_stride``, ``block_stride``, ``offset``, all bytes)
    and the resolved ``kv_cache_layout`` name."""

    def __init__(self, kv_cache_config: Any, layout: Optional[str]):
        self.layout = layout
        self.of: dict[str, tuple[Any, int]] = {}
        for t in getattr(kv_cache_config, "kv_cache_tensors", None) or ():
            if getattr(t, "layer_stride", None) is None:
                continue  # vLLM < 0.30: KVCacheTensor(size, shared_by)
            for i, n in enumerate(t.layers):
                self.of[n] = (t, i)


def _layer_view_buffers(base: str, what: str, layers: list[str], spec: Any, tensors: list,
                        kv_cache_dtype: str, qk_rope_head_dim: int, extra: dict,
                        placement: Optional[_Placement], tp: Optional[int],
                        rank: int) -> list[TensorBuffer]:
    """vLLM >= 0.30: one ``[B, H, N, C]`` view per layer (``create_kv_cache_views``), C the
    per-(token, head) content: attention ``head_size + head_size_v`` elements (K then V side by
    side: FlashAttention splits ``kv_cache.transpose(1, 2).split(head_size, dim=-1)``), MLA the
    latent row (``state_content_bytes`` for ``fp8_ds_mla``: 656 B), the indexer 132 B. Layers
    that share one ``KVCacheTensor`` are read as one ``[L, B, H, N, C]`` tensor whose layer
    stride is the ``KVCacheTensor``'s (each view's address is checked against ``offset + l x
    layer_stride``), so a block-outermost layout (``BLNHC``) is a page-first pool, ``BHLNC`` a
    ``page_head`` pool and ``LHBNC`` a ``layer_head`` pool."""
    if placement is None or placement.layout is None:
        raise KvLayoutError(f"{what}: a [B, H, N, C] layer view and no kv_cache_layout: pass "
                            "kv_cache_layout= (CacheConfig.kv_cache_layout) or a KVCacheConfig "
                            "that carries it")
    layout = str(getattr(placement.layout, "name", placement.layout))
    if layout not in KV_CACHE_LAYOUTS:
        raise KvLayoutError(f"{what}: kv_cache_layout {layout!r} is not modelled (expected one "
                            f"of {', '.join(KV_CACHE_LAYOUTS)})")
    hnd = KV_CACHE_LAYOUTS[layout][1]
    f = tensor_facts(tensors[0])
    heads_view, content = f.shape[1], f.shape[3]
    heads, head = int(spec.num_kv_heads), int(spec.head_size)
    if heads_view != heads:
        raise TensorMismatch(f"{base}.heads", f"spec num_kv_heads {heads}, tensor {heads_view} "
                             f"({f.describe()})")
    # HND: heads outside the block's tokens.
    if heads > 1 and (f.strides_bytes[1] > f.strides_bytes[2]) != hnd:
        raise TensorMismatch(f"{base}.kv_cache_layout", f"declared {layout}, tensor strides "
                             f"{list(f.strides_bytes)} B place heads "
                             f"{'inside' if hnd else 'outside'} the tokens")
    is_mla = getattr(spec, "cache_dtype_str", None) is not None or "MLA" in type(spec).__name__ \
        or any("indexer" in n for n in layers)
    if is_mla:
        sections, arrangement = _mla_sections(what, layers, spec, head, kv_cache_dtype,
                                              qk_rope_head_dim)
        shard = _shard(tp, rank, None)
    else:
        d = _elem_dtype(spec.dtype, kv_cache_dtype, what)
        head_v = int(getattr(spec, "head_size_v", None) or head)
        if content != head + head_v:
            raise TensorMismatch(f"{base}.content", f"spec head_size {head} + head_size_v "
                                 f"{head_v} = {head + head_v} elements, tensor {content} "
                                 f"({f.describe()})")
        # One section: per head K (head_size) then V (head_size_v): vLLM's C axis.
        sections = [{"name": "kv", "dtype": d, "shape": [heads, head + head_v]}]
        arrangement = "head_major" if hnd and heads > 1 else "token_major"
        shard = _shard(tp, rank, heads)
    if shard is not None:
        extra["shard"] = shard
    axes = ("page", "head", "page_token", "dim")
    runs = _layer_runs(base, layers, tensors, placement)
    in_order = [placement.of[n][1] for n in layers] == list(range(len(layers)))
    if len(runs) == 1 and len(layers) > 1 and in_order:
        t, first = runs[0]
        stride = int(t.layer_stride)
        view = _View(f.dtype, (len(layers), *f.shape), (stride, *f.strides_bytes), f.itemsize_bytes)
        return [TensorBuffer(base, view, axes=("layer", *axes), sections=sections,
                             arrangement=arrangement, extra=extra)]
    if KV_CACHE_LAYOUTS[layout][0] in ("page_first", "page_head") and len(layers) > 1:
        raise KvLayoutError(f"{what}: the group's layers are not one KVCacheTensor's layers "
                            f"0..{len(layers) - 1} in order ({len(runs)} KVCacheTensors) under "
                            f"the block-outermost layout {layout}: not modelled")
    return [TensorBuffer(base, tensors, axes=axes, sections=sections, arrangement=arrangement,
                         extra=extra)]


def _layer_runs(base: str, layers: list[str], tensors: list,
                placement: _Placement) -> list[tuple[Any, int]]:
    """The ``KVCacheTensor`` runs holding the group's layers, each view's address checked
    against ``offset + index x layer_stride`` relative to the run's first layer."""
    runs: list[tuple[Any, int]] = []
    for n, t in zip(layers, tensors):
        where = placement.of.get(n)
        if where is None:
            raise KvLayoutError(f"{base}: layer {n} is in no KVCacheTensor of kv_cache_config")
        kt, i = where
        if not runs or runs[-1][0] is not kt:
            runs.append((kt, i))
            first_ptr, first_i = _address(t), i
        else:
            addr = _address(t)
            if addr is not None and first_ptr is not None:
                expect = first_ptr + (i - first_i) * int(kt.layer_stride)
                if addr != expect:
                    raise TensorMismatch(f"{base}.layer_stride_bytes",
                                         f"KVCacheTensor layer_stride {int(kt.layer_stride)} B "
                                         f"puts layer {n} at {expect - first_ptr} B, its view "
                                         f"starts at {addr - first_ptr} B")
    return runs


def _address(t: Any) -> Optional[int]:
    ptr = getattr(t, "data_ptr", None)
    return int(ptr()) if callable(ptr) else None


def _raw_states(what: str, layer: str, raw: Any, shapes: list, files: list) -> list:
    """vLLM >= 0.30 hands a Mamba layer one raw ``int8`` ``[B, 1, 1, C]`` tensor; the layer's
    ``bind_kv_cache`` packs its states one after another in each block's ``C`` bytes
    (``vllm/model_executor/layers/mamba/abstract.py``). The same split, read from the spec."""
    f = tensor_facts(raw)
    if len(f.shape) != 4 or f.shape[1] != 1 or f.shape[2] != 1:
        raise KvLayoutError(f"{what}: kv_caches[{layer!r}]: expected a list of state tensors or "
                            f"one raw [blocks, 1, 1, bytes] tensor, got {f.describe()}")
    item = {"f32": 4, "bf16": 2, "f16": 2}
    names = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}
    used = 0
    views = []
    for fd, shape in zip(files, shapes):
        shape = tuple(int(x) for x in shape)
        strides = []
        inner = item[fd]
        for d in reversed(shape):
            strides.append(inner)
            inner *= d
        views.append(_View(names[fd], (f.shape[0], *shape),
                           (f.strides_bytes[0], *reversed(strides)), item[fd]))
        used += inner
    have = f.shape[3] * f.itemsize_bytes
    if used > have:
        raise TensorMismatch(f"{layer}.bytes", f"the spec's states take {used} B per block, the "
                             f"raw tensor holds {have} B ({f.describe()})")
    return views


def allocated_bytes(kv_caches: Mapping[str, Any]) -> int:
    """Bytes of memory behind ``kv_caches``, each allocation counted once: vLLM's hybrid groups
    alias one allocation (vLLM 0.20: ``KVCacheTensor.shared_by``; 0.33: every ``KVCacheTensor``
    in one backing allocation, groups overlaid), so the sum of the geometry's buffers
    (``Geometry.total_bytes``) counts that memory once per group. Reads torch's
    ``untyped_storage()`` (``data_ptr()``, ``nbytes()``); a list of Mamba state views counts its
    storages likewise."""
    seen: dict[int, int] = {}
    for t in kv_caches.values():
        for x in (t if isinstance(t, (list, tuple)) else (t,)):
            st = x.untyped_storage()
            seen[int(st.data_ptr())] = int(st.nbytes())
    return sum(seen.values())


def _state_buffers(base: str, what: str, layers: list[str], spec: Any,
                   kv_caches: Mapping[str, Any], hybrid: bool) -> list[TensorBuffer]:
    """``MambaSpec``: per layer a list of state tensors ``[num_blocks, *shapes[j]]`` in
    ``dtypes[j]``, all sharing one block of ``page_size_bytes`` (``page_size_padded`` when set):
    one ``state`` buffer per state tensor, its slot stride the block."""
    shapes, dtypes = list(spec.shapes), list(spec.dtypes)
    item = {"f32": 4, "bf16": 2, "f16": 2}
    maybe = [_WIDE.get(_name(d)) for d in dtypes]
    files = [f for f in maybe if f is not None]
    if len(files) != len(maybe):
        raise KvLayoutError(f"{what}: state dtypes {[_name(d) for d in dtypes]}: only "
                            f"{', '.join(_WIDE)} are modelled")
    payload = sum(item[f] * _prod(sh) for f, sh in zip(files, shapes))
    block = int(getattr(spec, "page_size_padded", None) or payload)
    ids = [_layer_id(n) for n in layers]
    out = []
    for j, (f, shape) in enumerate(zip(files, shapes)):
        per_layer = []
        for n in layers:
            states = kv_caches[n]
            if not isinstance(states, (list, tuple)):
                states = _raw_states(what, n, states, shapes, files)
            if len(states) != len(shapes):
                raise KvLayoutError(f"{what}: kv_caches[{n!r}] should be {len(shapes)} state "
                                    f"tensors (MambaSpec.shapes), got {type(states).__name__}")
            per_layer.append(states[j])
        extra: dict = {"attention": "state", "page_stride_bytes": block}
        if hybrid and all(x is not None for x in ids) and len(set(ids)) == len(ids):
            extra["layer_ids"] = ids
        out.append(TensorBuffer(
            f"{base}.state{j}", per_layer,
            axes=("slot", *[f"d{k}" for k in range(len(shape))]),
            sections=[{"name": f"state{j}", "dtype": f, "shape": [int(x) for x in shape]}],
            extra=extra))
    return out


def _prod(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _swap01(t: Any) -> _View:
    """``t`` with its first two axes swapped (a strided view read by duck typing)."""
    f = tensor_facts(t)
    return _View(f.dtype, (f.shape[1], f.shape[0], *f.shape[2:]),
                 (f.strides_bytes[1], f.strides_bytes[0], *f.strides_bytes[2:]), f.itemsize_bytes)


class _Block:
    """A FlashInfer ``[blocks, 2, block_size, heads, head_size]`` tensor seen as
    ``[blocks, block_bytes]`` (the block's K and V planes), for the byte checks; the block must be
    packed (one run of ``2 * block_size * heads * head_size`` elements)."""

    def __init__(self, t: Any):
        f = tensor_facts(t)
        inner = f.itemsize_bytes
        for dim, stride in sorted(zip(f.shape[1:], f.strides_bytes[1:]), key=lambda x: x[1]):
            if dim > 1 and stride != inner:
                raise KvLayoutError(f"FlashInfer block not packed: {f.describe()}")
            inner *= dim
        self.dtype = f.dtype
        self.shape = (f.shape[0], inner // f.itemsize_bytes)
        self.strides = (f.strides_bytes[0], f.itemsize_bytes)
        self.itemsize = f.itemsize_bytes


def geometry(kv_caches: Mapping[str, Any], kv_cache_config: Any, *, kv_cache_dtype: str = "auto",
             qk_rope_head_dim: int = 64, tp: Optional[int] = None, rank: int = 0,
             kv_cache_layout: Any = None, name: Optional[str] = None) -> Geometry:
    """The geometry of a vLLM worker's KV caches (module docs for the inputs).

    ``kv_cache_dtype``: vLLM's ``--kv-cache-dtype`` (``auto``, ``fp8``, ``fp8_e4m3``,
    ``fp8_e5m2``), the meaning of ``uint8`` storage. ``qk_rope_head_dim``: the MLA RoPE width
    (64 for DeepSeek / Kimi). ``tp``, ``rank``: the worker's tensor-parallel size and rank
    (``vllm.distributed.get_tensor_model_parallel_world_size()`` / ``_rank()``); given, each
    buffer carries its ``shard`` (module docs). Raises ``TensorMismatch`` where a tensor disagrees with its spec
    (bytes per token, page stride), ``KvLayoutError`` for what is not modelled."""
    groups = _groups(kv_cache_config)
    if not groups:
        raise KvLayoutError("kv_cache_config: no KV cache groups")
    if tp is not None and (isinstance(tp, bool) or not isinstance(tp, int) or tp < 1):
        raise InvalidGeometry("tp", f"{tp!r}: expected an int >= 1")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < (tp or 1):
        raise InvalidGeometry("rank", f"{rank!r}: expected an int in 0..{tp or 1}")
    names, hybrid = _names(groups)
    layout = kv_cache_layout or getattr(kv_cache_config, "kv_cache_layout", None)
    placement = _Placement(kv_cache_config, layout)
    buffers: list[TensorBuffer] = []
    for base, (layers, spec) in zip(names, groups):
        buffers.extend(_group_buffers(base, layers, spec, kv_caches, kv_cache_dtype,
                                      qk_rope_head_dim, hybrid, tp, rank, placement))
    token_groups = [s for _, s in groups if getattr(s, "shapes", None) is None]
    pool_block = int((token_groups or [groups[0][1]])[0].block_size)
    for b in buffers:
        if b.extra.get("page_size_tokens") == pool_block:
            del b.extra["page_size_tokens"]
    num_blocks = getattr(kv_cache_config, "num_blocks", None)
    memory_layout = "layer_first"
    if layout is not None and str(getattr(layout, "name", layout)) in KV_CACHE_LAYOUTS:
        memory_layout = KV_CACHE_LAYOUTS[str(getattr(layout, "name", layout))][0]
    g = geometry_from_tensors(buffers, page_size_tokens=pool_block, memory_layout=memory_layout,
                              pages=int(num_blocks) if num_blocks else None,
                              name=name or "vllm: register_kv_caches")
    if memory_layout == "page_head":
        # BHLNC: every stride against page_head's placement (geometry_from_tensors checks only
        # a page_head page's total, for SGLang's [page][head][token][layer] host tensor).
        check_pieces(g, buffers)
    return g


def transfer_guard(device_kv_caches: Mapping[str, Any], host_kv_caches: Mapping[str, Any],
                   kv_cache_config: Any, **kw: Any):
    """A :class:`kvlayout.TransferGuard` between a worker's device caches and an offload
    (host) copy built from the same ``kv_cache_config``; raises ``Incompatible`` on any
    difference. ``checksum="off" | "all" | "sampled:N"`` (keyword) sets the guard's page
    checksum mode."""
    from .._kvlayout import TransferGuard

    checksum = kw.pop("checksum", "off")
    return TransferGuard(geometry(device_kv_caches, kv_cache_config, **kw),
                         geometry(host_kv_caches, kv_cache_config, **kw), checksum=checksum)

