"""SGLang pools -> kvlayout geometries, and a guard for SGLang's HiCache transfer ops.

Duck-typed: nothing from SGLang or torch is imported; the pool objects' attributes are read.
Attribute names are those of SGLang's public source:

Device pools, ``python/sglang/srt/mem_cache/memory_pool.py``:

- ``MHATokenToKVPool``: ``k_buffer`` / ``v_buffer``, one tensor per layer of shape
  ``[size + page_size, head_num, head_dim]`` in ``store_dtype`` (``uint8`` when ``dtype`` is an
  fp8 type); ``page_size``, ``head_num``, ``head_dim``, ``v_head_dim`` (where present),
  ``dtype``.
- ``MLATokenToKVPool``: ``kv_buffer``, one tensor per layer ``[size + page_size, 1,
  kv_cache_dim]``; ``kv_lora_rank``, ``qk_rope_head_dim``, ``dtype``. With fp8 DeepSeek sparse
  attention the row is FlashMLA's 656 B (``kv_cache_dim`` 656 of ``uint8``: 512 e4m3, 4 f32
  scales, 64 bf16 RoPE).
- ``DSATokenToKVPool`` (SGLang 0.5.23; ``NSATokenToKVPool`` in older releases; subclasses of
  the MLA pool): the index-K sidecar ``index_k_with_scale_buffer``, one tensor per layer
  ``[num_pages, index_page_size * (index_head_dim + index_head_dim // quant_block_size * 4)]``
  ``uint8`` (fp8 keys then f32 scales: 132 B per key for 128 dims); ``index_page_size`` is
  ``page_size // index_kpool`` (one key per ``index_kpool`` tokens), read here as the buffer's
  own page size. SGLang 0.5.23 has no bf16 index-K (``index_k_with_scale_buffer_dtype`` is
  ``torch.uint8``); a bf16 index-K tensor (a fork's ``index_cache_is_bf16``, as in this
  project's seed case) is read as bf16 keys ``[index_head_dim]``.
- HND (``SGLANG_USE_HND_KVCACHE=1``, ``pool.use_hnd``): ``k_buffer[i]`` is ``[pages, head_num,
  page_size, head_dim]``, read as ``head_major`` pages.
- ``MHATokenToKVPoolMXFP8``: ``k_scale_buffer`` / ``v_scale_buffer``, ue8m0 per 32 elements:
  ``[size + page_size, head_num, head_dim // 32]``, or at ``page_size == 128``
  (``mxfp8_sf_interleaved``) FA4's ``BlockScaledBasicChunk`` atom ``[pages, head_num, 32,
  page_size // 32, head_dim // 32]``: read as head-major pages whose token order is named
  ``fa4_sf_atom_32x4`` (section ``order``).
- ``MLATokenToKVPoolFP4``: ``kv_buffer[i]`` ``[size + page_size, 1, kv_cache_dim // 2]`` ``uint8``
  (two e2m1 values per byte) and ``kv_scale_buffer[i]`` ``[size + page_size, kv_cache_dim // 16]``
  ``uint8`` ue8m0 scales (``FP4MXBlock16KVQuantizeUtil``: exponent + 127 per 16 values): buffers
  ``kv`` (f4e2m1) and ``kv_scale`` (ue8m0).

Host pools, ``python/sglang/srt/mem_cache/memory_pool_host.py`` (newer releases:
``mem_cache/pool_host/{mha,mla,dsa}.py``):

- ``MHATokenToKVPoolHost``: ``kv_buffer`` of shape ``(2, layer_num, size, head_num,
  head_dim)`` (``layout == "layer_first"``), ``(2, size, layer_num, ...)`` (``page_first``),
  ``(2, page_num, layer_num, page_size, head_num, head_dim)`` (``page_first_direct``) or
  ``(2, page_num, head_num, page_size, layer_num, head_dim)`` (``page_head``); ``token_stride_size``
  is the item size its transfer ops use. SGLang's ``page_head`` keeps a head's tokens outside
  its layers (``[page][head][token][layer][dim]``): kvlayout's ``page_head_token`` memory layout
  (kvlayout's ``page_head``, ``[page][head][layer][token][dim]``, is vLLM's BHLNC), its strides
  checked against the layout.
- ``MLATokenToKVPoolHost``: ``kv_buffer`` ``(layer_num, size, 1, kv_cache_dim)``,
  ``(size, layer_num, 1, kv_cache_dim)`` or ``(page_num, layer_num, page_size, 1, kv_cache_dim)``.
- ``AsymmetricMHATokenToKVPoolHost`` (``head_dim != v_head_dim``): ``kv_buffer`` is a tuple
  ``(k, v)`` of two tensors (``page_first``: ``(size, layer_num, head_num, head_dim)`` and
  ``... v_head_dim``; ``page_first_direct`` likewise per page); ``v_head_dim`` on the pool.
- ``page_unified`` (``pool_host/page_unified.py``, ``PageUnifiedLayout.page_dims``): MHA
  ``(page_num, head_group_num, layer_num, 2, page_size, heads_per_group, head_dim)`` with
  ``heads_per_group = head_num // head_group_num`` (``head_group_num`` on the host), read as
  kvlayout's ``page_unified`` memory layout (``{"page_unified": {"heads_per_group": N}}``, buffers
  ``k`` = ``kv_buffer[:, :, :, 0]`` and ``v`` = ``kv_buffer[:, :, :, 1]``, their strides and the
  distance between them checked against the layout); MLA ``(page_num, layer_num, page_size,
  dim)``, byte for byte ``page_first_direct``'s and read as that memory layout.
- ``NSATokenToKVPoolHost`` (older releases: ``index_head_dim``, ``indexer_quant_block_size``,
  ``indexer_dtype``) / ``DSAIndexerPoolHost`` (``pool_host/dsa.py``, SGLang 0.5.23: a pool of its
  own beside the MLA host, passed as ``indexer=``; it reads the index format from its
  ``device_pool``): the host index-K ``index_k_with_scale_buffer`` ``(layer_num,
  indexer_page_num, indexer_page_stride_size)`` or ``(indexer_page_num, layer_num, 1,
  indexer_page_stride_size)`` in ``uint8``, sized in SGLang 0.5.23 by the same formula as the
  device (``dsa_indexer_bytes_per_token_per_layer``); ``indexer_page_stride_size`` is its item
  size. The host takes that formula from class constants rather than from the device tensor, so
  a device that stored other index-K bytes (a fork's bf16 keys: this project's seed case, not an
  SGLang release) would be mirrored by a host of the wrong size: the pairing refuses it.

The host pools keep no ``device_pool`` and store fp8 as ``uint8``: their meaning (fp8 e4m3 or
e5m2, the MLA row's sections) comes from the device pool they mirror, passed as
``device_pool=`` (``transfer_guard`` passes it) or found on the host as ``device_pool``.

Transfer ops, ``sgl_kernel.kvcacheio`` (imported by the host pool module behind ``if _is_cuda``):
``transfer_kv_per_layer(src_k, dst_k, src_v, dst_v, src_indices, dst_indices, item_size)``,
``transfer_kv_per_layer_pf_lf(..., layer_id, item_size, src_layout_dim)``,
``transfer_kv_per_layer_mla(src, dst, src_indices, dst_indices, item_size)``,
``transfer_kv_per_layer_mla_pf_lf(src, dst, src_indices, dst_indices, layer_id, item_size,
src_layout_dim)``, ``transfer_kv_all_layer_lf_pf(src_k_layers, dst_k, src_v_layers, dst_v,
src_indices, dst_indices, item_size, dst_layout_dim, num_layers)``,
``transfer_kv_all_layer_mla_lf_pf(src_layers, dst, src_indices, dst_indices, item_size,
dst_layout_dim, num_layers)``. Each copies ``item_size`` bytes per index and uses it as the
stride on both sides, checking only ``item_size % 8``.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, MutableMapping, Optional

from .._kvlayout import Geometry
from ..errors import Incompatible, KvLayoutError, TensorMismatch, TransferRefused
from ..tensors import TensorBuffer, dtype_name, geometry_from_tensors, tensor_facts

__all__ = [
    "device_geometry",
    "host_geometry",
    "transfer_guard",
    "check_item_sizes",
    "guard_transfer_ops",
    "TRANSFER_OPS",
]

_FP8 = {"float8_e4m3fn": "f8e4m3", "float8_e4m3fnuz": "f8e4m3fnuz", "float8_e5m2": "f8e5m2",
        "float8_e5m2fnuz": "f8e5m2fnuz"}
_WIDE = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}
# torch's packed fp4 (two e2m1 values per byte): MLATokenToKVPoolFP4's dtype.
_FP4 = {"float4_e2m1fn_x2": "f4e2m1"}
_BITS = {"f4e2m1": 4}


def _torch_name(d: Any) -> str:
    name = str(d)
    return name[len("torch."):] if name.startswith("torch.") else name


def _logical_dtype(pool: Any, store: Any) -> str:
    """The meaning of the stored bits: ``pool.dtype`` (SGLang's logical dtype; ``store_dtype`` is
    ``uint8`` for fp8), else the tensor's own dtype."""
    d = getattr(pool, "dtype", None)
    name = _torch_name(d)
    if d is None or name in ("uint8", "int8"):
        name = dtype_name(store)
    return name


def _file_dtype(name: str, what: str) -> str:
    for table in (_FP8, _WIDE, _FP4):
        if name in table:
            return table[name]
    raise KvLayoutError(f"{what}: dtype {name!r} is not a KV dtype kvlayout models "
                        f"(expected one of {', '.join([*_WIDE, *_FP8, *_FP4])})")


def _mla_sections(pool: Any, dtype: str, row_bytes: int) -> list[dict]:
    """The MLA row's sections from ``kv_lora_rank`` / ``qk_rope_head_dim`` and the dtype."""
    rank, rope = int(pool.kv_lora_rank), int(pool.qk_rope_head_dim)
    d = _file_dtype(dtype, "kv_buffer")
    if d in ("bf16", "f16", "f32"):
        return [{"name": "latent", "dtype": d, "shape": [rank]},
                {"name": "rope", "dtype": d, "shape": [rope]}]
    plain = (rank + rope) * _BITS.get(d, 8) // 8
    # FlashMLA sparse fp8 row (DeepSeek-V3.2): e4m3 NoPE, one f32 scale per 128, bf16 RoPE.
    sparse = rank + rank // 128 * 4 + rope * 2
    if row_bytes == plain:
        return [{"name": "latent", "dtype": d, "shape": [rank]},
                {"name": "rope", "dtype": d, "shape": [rope]}]
    if row_bytes == sparse and d not in _BITS:
        return [{"name": "nope", "dtype": d, "shape": [rank]},
                {"name": "nope_scale", "dtype": "f32", "shape": [rank // 128], "scales": "nope",
                 "block_elems": 128},
                {"name": "rope", "dtype": "bf16", "shape": [rope]}]
    raise KvLayoutError(
        f"kv_buffer: {row_bytes} B per token matches no {d} MLA row for kv_lora_rank {rank}, "
        f"qk_rope_head_dim {rope} (plain {plain} B, FlashMLA sparse {sparse} B)")


def _index_k_sections(pool: Any, store: Any) -> list[dict]:
    """Index-K meaning: bf16 keys when the tensor is bf16 (a fork's variant, not SGLang
    0.5.23's), else SGLang's fp8 formula (e4m3 keys, one f32 scale per ``quant_block_size``)."""
    dim = getattr(pool, "index_head_dim", None)
    if dim is None:
        raise KvLayoutError(f"{type(pool).__name__}: no index_head_dim: cannot read index-K "
                            "(pass the host's DSAIndexerPoolHost as indexer=, whose device_pool "
                            "has it)")
    dim = int(dim)
    name = dtype_name(store)
    if name in _WIDE:
        return [{"name": "values", "dtype": _WIDE[name], "shape": [dim]}]
    block = getattr(pool, "quant_block_size", None) or getattr(pool, "indexer_quant_block_size", None)
    if block is None:
        raise KvLayoutError(f"{type(pool).__name__}: uint8 index-K without quant_block_size "
                            "(device pool) or indexer_quant_block_size (host pool)")
    block = int(block)
    return [{"name": "values", "dtype": "f8e4m3", "shape": [dim]},
            {"name": "scale", "dtype": "f32", "shape": [dim // block], "scales": "values",
             "block_elems": block}]


def _index_page_extra(pool: Any) -> dict:
    """``index_kpool > 1``: one index key per ``index_kpool`` tokens, ``index_page_size`` keys
    per page: the index-K buffer's own page size (``page_size_tokens``); the compressed kpool
    variant is refused by name."""
    if getattr(pool, "index_kpool_compress", False) and int(getattr(pool, "index_kpool", 1)) > 1:
        raise KvLayoutError(f"{type(pool).__name__}.index_kpool_compress: the compressed index-K "
                            "pool is not modelled")
    page = int(pool.page_size)
    index_page = int(getattr(pool, "index_page_size", None) or page)
    return {} if index_page == page else {"page_size_tokens": index_page}


def _row_bytes(t: Any) -> int:
    f = tensor_facts(t)
    n = f.itemsize_bytes
    for d in f.shape[1:]:
        n *= d
    return n


class _PageBytes:
    """A tensor whose leading axis is pages, seen as ``[pages, page_bytes]`` (``uint8``) for the
    byte checks: the rest of each page must be one packed run."""

    def __init__(self, t: Any, what: str):
        f = tensor_facts(t)
        inner = f.itemsize_bytes
        for dim, stride in sorted(zip(f.shape[1:], f.strides_bytes[1:]), key=lambda x: x[1]):
            if dim > 1 and stride != inner:
                raise TensorMismatch(f"{what}.strides", f"page not packed ({f.describe()})")
            inner *= dim
        self.dtype = "uint8"
        self.shape = (f.shape[0], inner)
        self.strides = (f.strides_bytes[0], 1)
        self.itemsize = 1


# Per-layer scale tensors of an MXFP8 MHA device pool (``MHATokenToKVPoolMXFP8``).
_MXFP8_SCALES = ("k_scale_buffer", "v_scale_buffer")
# FA4's BlockScaledBasicChunk: a page's 128 tokens as [32][4], token 32 * c + r at [r][c].
MXFP8_INTERLEAVED_ORDER = "fa4_sf_atom_32x4"


def _mxfp8_scale_buffers(pool: Any) -> list[TensorBuffer]:
    """Buffers ``k_scale`` / ``v_scale`` (ue8m0, one per 32 elements) of an MXFP8 pool; none for
    a pool without scale tensors. A host that does not mirror them fails the pairing (the
    buffer sets differ) instead of being taken for a plain fp8 mirror."""
    out = []
    for attr in _MXFP8_SCALES:
        tensors = getattr(pool, attr, None)
        if tensors is None:
            continue
        shape = list(tensor_facts(tensors[0]).shape)
        side = attr[: -len("_buffer")]
        if len(shape) == 5:  # [pages, heads, 32, page_size // 32, dim // 32]
            pages, heads, rows, chunks, sf = shape
            if rows * chunks != int(pool.page_size):
                raise TensorMismatch(f"{side}.shape", f"interleaved scale page {rows} x {chunks} "
                                     f"tokens, page_size {int(pool.page_size)}")
            out.append(TensorBuffer(
                side, [_PageBytes(t, side) for t in tensors], axes=("page", "page_bytes"),
                sections=[{"name": side, "dtype": "ue8m0", "shape": [heads, sf],
                           "order": MXFP8_INTERLEAVED_ORDER}],
                arrangement="head_major"))
        else:
            out.append(TensorBuffer(side, list(tensors), axes=("token", "head", "dim"),
                                    sections=[{"name": side, "dtype": "ue8m0", "shape": shape[1:]}]))
    return out


def _refuse_unmodelled_scales(pool: Any, modelled: tuple[str, ...]) -> None:
    """Any other ``*_scale_buffer`` attribute holds bytes the geometry would not describe:
    refused by name, never dropped."""
    modelled = (*modelled, "index_k_with_scale_buffer")  # read by both geometries
    for attr in sorted(vars(pool) if hasattr(pool, "__dict__") else ()):
        if attr.endswith("_scale_buffer") and attr not in modelled and getattr(pool, attr) is not None:
            raise KvLayoutError(f"{type(pool).__name__}.{attr}: a scale buffer this adapter "
                                "does not model; its bytes would be dropped from the geometry")


def _is_mha(pool: Any) -> bool:
    return getattr(pool, "k_buffer", None) is not None and getattr(pool, "kv_buffer", None) is None


def device_geometry(pool: Any, *, name: Optional[str] = None) -> Geometry:
    """The geometry of an SGLang device pool (MHA, HND MHA, MXFP8 MHA, MLA, FP4 MLA, or MLA +
    DSA index-K), read from its tensors; ``pages`` is the fewest pages any buffer holds
    (``size // page_size + 1`` with the padded slot).

    # Errors
    ``TensorMismatch`` where a tensor contradicts the pool's attributes (buffer, quantity, both
    numbers); ``KvLayoutError`` naming what is not modelled (a scale buffer, a dtype)."""
    page = int(pool.page_size)
    buffers = []
    modelled: tuple[str, ...] = ()
    if _is_mha(pool):
        heads, dim = int(pool.head_num), int(pool.head_dim)
        v_dim = int(getattr(pool, "v_head_dim", None) or dim)
        d = _file_dtype(_logical_dtype(pool, pool.k_buffer[0]), "k_buffer")
        hnd = bool(getattr(pool, "use_hnd", False)) or len(tensor_facts(pool.k_buffer[0]).shape) == 4
        for side, tensors, width in (("k", pool.k_buffer, dim), ("v", pool.v_buffer, v_dim)):
            if hnd:  # [pages, head_num, page_size, head_dim]
                buffers.append(TensorBuffer(
                    side, list(tensors), axes=("page", "head", "page_token", "dim"),
                    sections=[{"name": side, "dtype": d, "shape": [heads, width]}],
                    arrangement="head_major"))
            else:
                buffers.append(TensorBuffer(
                    side, list(tensors), axes=("token", "head", "dim"),
                    sections=[{"name": side, "dtype": d, "shape": [heads, width]}]))
        buffers += _mxfp8_scale_buffers(pool)
        modelled = _MXFP8_SCALES
    elif getattr(pool, "kv_buffer", None) is not None:
        t0 = pool.kv_buffer[0]
        sections = _mla_sections(pool, _logical_dtype(pool, t0), _row_bytes(t0))
        buffers.append(TensorBuffer("kv", list(pool.kv_buffer), axes=("token", "one", "dim"),
                                    sections=sections))
        scales = getattr(pool, "kv_scale_buffer", None)
        if scales is not None and sections[0]["dtype"] == "f4e2m1":
            # FP4MXBlock16: one ue8m0 exponent per 16 values of the row.
            n = tensor_facts(scales[0]).shape[-1]
            buffers.append(TensorBuffer("kv_scale", list(scales), axes=("token", "dim"),
                                        sections=[{"name": "kv_scale", "dtype": "ue8m0",
                                                   "shape": [n]}]))
            modelled = ("kv_scale_buffer",)
    else:
        raise KvLayoutError(f"{type(pool).__name__}: neither k_buffer/v_buffer (MHA) nor "
                            "kv_buffer (MLA): not an SGLang device KV pool")
    index_k = getattr(pool, "index_k_with_scale_buffer", None)
    if index_k is not None:
        buffers.append(TensorBuffer("index_k", list(index_k), axes=("page", "page_bytes"),
                                    sections=_index_k_sections(pool, index_k[0]),
                                    arrangement="section_major", extra=_index_page_extra(pool)))
    elif getattr(pool, "index_k_scale_buffer", None) is not None:
        raise KvLayoutError(f"{type(pool).__name__}: index_k_buffer + index_k_scale_buffer "
                            "(split fp4 indexer) is not modelled by this adapter")
    _refuse_unmodelled_scales(pool, modelled)
    return geometry_from_tensors(buffers, page_size_tokens=page,
                                 name=name or f"sglang device: {type(pool).__name__}")


_MHA_HOST_AXES = {
    "layer_first": ("layer", "token", "head", "dim"),
    "page_first": ("token", "layer", "head", "dim"),
    "page_first_direct": ("page", "layer", "page_token", "head", "dim"),
    "page_head": ("page", "head", "page_token", "layer", "dim"),  # read as page_head_token
    # (page_num, head_group_num, layer_num, page_size, heads_per_group, head_dim) per side.
    "page_unified": ("page", "group", "layer", "page_token", "head", "dim"),
}
_MLA_HOST_AXES = {
    "layer_first": ("layer", "token", "one", "dim"),
    "page_first": ("token", "layer", "one", "dim"),
    "page_first_direct": ("page", "layer", "page_token", "one", "dim"),
    # (page_num, layer_num, page_size, dim): page_first_direct's bytes (page_unified.py).
    "page_unified": ("page", "layer", "page_token", "dim"),
}
_INDEX_HOST_AXES = {
    "layer_first": ("layer", "page", "page_bytes"),
    "page_first": ("page", "layer", "one", "page_bytes"),
    "page_first_direct": ("page", "layer", "one", "page_bytes"),
}


def _axes(table: dict, layout: str, what: str) -> tuple:
    if layout not in table:
        raise KvLayoutError(f"{what}: host layout {layout!r} is not modelled "
                            f"(expected one of {', '.join(table)})")
    return table[layout]


def _meaning_pool(host_pool: Any, device_pool: Any) -> Any:
    """The device pool that gives a host its meaning: passed, else ``host.device_pool``."""
    return device_pool if device_pool is not None else getattr(host_pool, "device_pool", None)


def _host_dtype(host_pool: Any, device: Any, store: Any) -> str:
    """A typed host tensor (bf16, fp16, fp8) says what it holds; a ``uint8`` one (SGLang's fp8
    storage) holds what the device pool's ``dtype`` says."""
    name = dtype_name(store)
    if name not in ("uint8", "int8"):
        return name
    if device is None:
        raise KvLayoutError(f"{type(host_pool).__name__}.kv_buffer: {name} storage and no "
                            "device pool to say what it holds: pass device_pool=")
    return _logical_dtype(device, store)


def host_geometry(host_pool: Any, *, device_pool: Any = None, indexer: Any = None,
                  name: Optional[str] = None) -> Geometry:
    """The geometry of an SGLang host (HiCache) pool, read from its tensors: MHA (symmetric or
    ``AsymmetricMHATokenToKVPoolHost``), MLA, and the DSA index-K sidecar, either on the same
    object (``NSATokenToKVPoolHost``) or as a separate ``indexer`` pool (``DSAIndexerPoolHost``).

    The host stores fp8 as ``uint8`` and keeps no device pool: what its bytes mean (fp8 kind, the
    MLA row's sections, index-K format) comes from ``device_pool`` (the device pool it mirrors;
    :func:`transfer_guard` passes it), else a ``device_pool`` attribute of the host, else the
    host's own dtype.

    # Errors
    ``KvLayoutError``: a ``uint8`` host with no device pool to say what it holds, a host layout
    not modelled, a scale buffer not modelled; ``TensorMismatch`` where a tensor contradicts the
    attributes (a ``page_unified`` tensor whose strides are not ``heads_per_group``'s)."""
    layout = str(host_pool.layout)
    page = int(host_pool.page_size)
    device = _meaning_pool(host_pool, device_pool)
    buffers = []
    kv = host_pool.kv_buffer
    # SGLang's page_head is kvlayout's page_head_token ([page][head][token][layer][dim]).
    memory_layout: Any = "page_head_token" if layout == "page_head" else layout
    if getattr(host_pool, "head_num", None) is not None and getattr(host_pool, "kv_lora_rank", None) is None:
        heads, dim = int(host_pool.head_num), int(host_pool.head_dim)
        v_dim = int(getattr(host_pool, "v_head_dim", None) or dim)
        store = kv[0] if isinstance(kv, (tuple, list)) else kv
        d = _file_dtype(_host_dtype(host_pool, device, store), "kv_buffer")
        axes = _axes(_MHA_HOST_AXES, layout, "kv_buffer")
        sides = [kv[0], kv[1]]
        if layout == "page_unified":
            # (page, group, layer, K|V, token, head in group, dim): K and V are index 0 and 1 of
            # axis 3 (PageUnifiedLayout.page_dims).
            groups = int(host_pool.head_group_num)
            if groups < 1 or heads % groups:
                raise TensorMismatch("kv_buffer.head_group_num",
                                     f"{groups} head groups for {heads} heads")
            sides = [kv[:, :, :, 0], kv[:, :, :, 1]]
            memory_layout = {"page_unified": {"heads_per_group": heads // groups}}
        for side, width, t in (("k", dim, sides[0]), ("v", v_dim, sides[1])):
            buffers.append(TensorBuffer(side, t, axes=axes,
                                        sections=[{"name": side, "dtype": d, "shape": [heads, width]}]))
    else:
        axes = _axes(_MLA_HOST_AXES, layout, "kv_buffer")
        if layout == "page_unified":
            memory_layout = "page_first_direct"
        f = tensor_facts(kv)
        row = f.shape[-1] * f.itemsize_bytes
        meaning = host_pool if getattr(host_pool, "kv_lora_rank", None) is not None else device
        if meaning is None:
            raise KvLayoutError(f"{type(host_pool).__name__}.kv_buffer: an MLA host names no "
                                "kv_lora_rank / qk_rope_head_dim: pass device_pool=")
        sections = _mla_sections(meaning, _host_dtype(host_pool, device, kv), row)
        buffers.append(TensorBuffer("kv", kv, axes=axes, sections=sections))
    idx_pool = indexer if indexer is not None else host_pool
    idx = getattr(idx_pool, "index_k_with_scale_buffer", None)
    if idx is not None:
        if getattr(idx_pool, "index_head_dim", None) is not None:
            meaning = idx_pool
        else:
            meaning = getattr(idx_pool, "device_pool", None) or device
        if meaning is None:
            raise KvLayoutError(f"{type(idx_pool).__name__}: index-K host without index_head_dim "
                                "or a device_pool: pass device_pool=")
        extra = _index_page_extra(meaning) if hasattr(meaning, "page_size") else {}
        buffers.append(TensorBuffer(
            "index_k", idx, axes=_axes(_INDEX_HOST_AXES, str(idx_pool.layout), "index_k_with_scale_buffer"),
            sections=_index_k_sections(meaning, idx), arrangement="section_major", extra=extra))
    _refuse_unmodelled_scales(host_pool, ())
    return geometry_from_tensors(buffers, page_size_tokens=page, memory_layout=memory_layout,
                                 name=name or f"sglang host: {type(host_pool).__name__}")


def transfer_guard(device_pool: Any, host_pool: Any, *, indexer: Any = None,
                   checksum: str = "off"):
    """A :class:`kvlayout.TransferGuard` for an SGLang pool pair: raises ``Incompatible`` (the
    CLI's diff lines) when the host does not mirror the device. Page indices for
    ``check_pages`` are pages (SGLang's token indices // ``page_size``). ``checksum``: ``"off"``
    (default), ``"all"`` or ``"sampled:N"``: the guard's page checksum mode
    (``record_backup`` with each backup, ``verify_load`` after each layer's load, on the
    device pool's per-layer tensors)."""
    from .._kvlayout import TransferGuard

    return TransferGuard(device_geometry(device_pool),
                         host_geometry(host_pool, device_pool=device_pool, indexer=indexer),
                         checksum=checksum)


def check_item_sizes(device_pool: Any, host_pool: Any, *, indexer: Any = None) -> None:
    """The item size each host pool hands its transfer ops (``token_stride_size``,
    ``indexer_page_stride_size``) against the device tensors' row strides; raises
    ``Incompatible`` with one line per buffer that differs (``index_k.item_size_bytes: device
    16384 (index_k_with_scale_buffer[0] row stride), host 8448 (indexer_page_stride_size)``)."""
    lines = []

    def compare(buffer: str, device_tensor: Any, device_what: str, host_bytes: Any, host_what: str):
        if host_bytes is None:
            return
        f = tensor_facts(device_tensor)
        dev = f.strides_bytes[0]
        if dev != int(host_bytes):
            lines.append(f"{buffer}.item_size_bytes: device {dev} ({device_what} row stride), "
                         f"host {int(host_bytes)} ({host_what})")

    host_item = getattr(host_pool, "token_stride_size", None)
    if getattr(device_pool, "k_buffer", None) is not None and getattr(device_pool, "kv_buffer", None) is None:
        compare("k", device_pool.k_buffer[0], "k_buffer[0]", host_item, "token_stride_size")
        compare("v", device_pool.v_buffer[0], "v_buffer[0]", host_item, "token_stride_size")
    elif getattr(device_pool, "kv_buffer", None) is not None:
        compare("kv", device_pool.kv_buffer[0], "kv_buffer[0]", host_item, "token_stride_size")
    idx_pool = indexer if indexer is not None else host_pool
    dev_idx = getattr(device_pool, "index_k_with_scale_buffer", None)
    if dev_idx is not None:
        compare("index_k", dev_idx[0], "index_k_with_scale_buffer[0]",
                getattr(idx_pool, "indexer_page_stride_size", None), "indexer_page_stride_size")
    if lines:
        n = len(lines)
        raise Incompatible(lines, f"incompatible: {n} transfer item size"
                           f"{' differs' if n == 1 else 's differ'} from the device strides")


# op name -> (tensors whose row stride must equal item_size, [(tensor, layout-dim param)])
TRANSFER_OPS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    "transfer_kv_per_layer": (("src_k", "dst_k", "src_v", "dst_v"), ()),
    "transfer_kv_per_layer_pf_lf": (("dst_k", "dst_v"), (("src_k", "src_layout_dim"), ("src_v", "src_layout_dim"))),
    "transfer_kv_per_layer_mla": (("src", "dst"), ()),
    "transfer_kv_per_layer_mla_pf_lf": (("dst",), (("src", "src_layout_dim"),)),
    "transfer_kv_all_layer_lf_pf": ((), (("dst_k", "dst_layout_dim"), ("dst_v", "dst_layout_dim"))),
    "transfer_kv_all_layer_mla_lf_pf": ((), (("dst", "dst_layout_dim"),)),
    # page_head host -> layer-first device: the device rows are checked; the page-head side's
    # addressing (page, head, token, layer) is the kernel's, not checked here.
    "transfer_kv_per_layer_ph_lf": (("dst_k", "dst_v"), ()),
}

# Ops whose device side is a table of per-layer pointers (no strides to read): covered by
# check_item_sizes when the pools are built, never wrapped.
POINTER_TABLE_OPS = ("transfer_kv_all_layer", "transfer_kv_all_layer_mla")


# Positional order of each op's leading parameters, as sgl-kernel declares them (sgl-kernel
# python/sgl_kernel/kvcacheio.py, e.g. `def transfer_kv_per_layer(src_k, dst_k, src_v, dst_v,
# src_indices, dst_indices, item_size, block_quota=2, num_warps_per_block=32)`): used for ops
# whose signature does not name these parameters (a compiled op, a `(*args, **kwargs)` wrapper,
# renamed parameters).
_ORDER: dict[str, tuple[str, ...]] = {
    "transfer_kv_per_layer": ("src_k", "dst_k", "src_v", "dst_v", "src_indices", "dst_indices",
                              "item_size"),
    "transfer_kv_per_layer_pf_lf": ("src_k", "dst_k", "src_v", "dst_v", "src_indices",
                                    "dst_indices", "layer_id", "item_size", "src_layout_dim"),
    "transfer_kv_per_layer_mla": ("src", "dst", "src_indices", "dst_indices", "item_size"),
    "transfer_kv_per_layer_mla_pf_lf": ("src", "dst", "src_indices", "dst_indices", "layer_id",
                                        "item_size", "src_layout_dim"),
    "transfer_kv_all_layer_lf_pf": ("src_k_layers", "dst_k", "src_v_layers", "dst_v",
                                    "src_indices", "dst_indices", "item_size", "dst_layout_dim",
                                    "num_layers"),
    "transfer_kv_all_layer_mla_lf_pf": ("src_layers", "dst", "src_indices", "dst_indices",
                                        "item_size", "dst_layout_dim", "num_layers"),
    "transfer_kv_per_layer_ph_lf": ("src_k", "dst_k", "src_v", "dst_v", "src_indices",
                                    "dst_indices", "layer_id", "item_size", "src_layout_dim",
                                    "page_size", "head_num"),
}


def _checked(op_name: str, op: Callable) -> Callable:
    rows, dims = TRANSFER_OPS[op_name]
    order = _ORDER[op_name]
    needed = {*rows, *(p for d in dims for p in d), *(("item_size",) if rows else ())}
    try:
        sig: Optional[inspect.Signature] = inspect.signature(op)
    except (TypeError, ValueError):  # a compiled op: bind by SGLang's parameter order
        sig = None
    if sig is not None:
        named = {
            n for n, p in sig.parameters.items()
            if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)}
        if not needed <= named:  # `(*args, **kwargs)` or renamed: bind by SGLang's order
            sig = None

    @functools.wraps(op)
    def wrapper(*args, **kwargs):
        if sig is not None:
            bound = sig.bind_partial(*args, **kwargs).arguments
        else:
            bound = dict(zip(order, args))
            bound.update(kwargs)
        missing = sorted(needed - bound.keys())
        if missing:  # never a silent pass: what cannot be found cannot be checked
            raise TransferRefused(
                f"{op_name}: cannot check the call: no argument {', '.join(missing)} (by "
                f"name or in sgl-kernel's positional order {', '.join(order)})", "unchecked")
        item = bound.get("item_size")
        if item is not None:
            for p in rows:
                t = bound.get(p)
                if t is not None and tensor_facts(t).strides_bytes[0] != int(item):
                    f = tensor_facts(t)
                    raise TransferRefused(
                        f"{op_name}: item_size {int(item)} B, but {p} rows are "
                        f"{f.strides_bytes[0]} B apart ({f.describe()})", "item_size")
        for p, dim_param in dims:
            t, dim = bound.get(p), bound.get(dim_param)
            if t is not None and dim is not None:
                f = tensor_facts(t)
                if f.strides_bytes[0] != int(dim):
                    raise TransferRefused(
                        f"{op_name}: {dim_param} {int(dim)} B, but {p} rows are "
                        f"{f.strides_bytes[0]} B apart ({f.describe()})", "item_size")
        _check_page_first_row(op_name, bound)
        return op(*args, **kwargs)

    wrapper.__kvlayout_unchecked__ = op  # type: ignore[attr-defined]
    return wrapper


def _check_page_first_row(op_name: str, bound: dict) -> None:
    """A page-first row holds every layer's item of one token: the layers' items must fit in
    it. All-layer backups (``num_layers`` items of ``item_size`` into ``dst_layout_dim``) and
    per-layer loads (layer ``layer_id``'s item at ``layer_id x item_size`` of ``src_layout_dim``)
    are refused (``kind == "item_size"`` / ``"layer"``) where they would reach past the row into
    the next token's."""
    item = bound.get("item_size")
    if item is None:
        return
    item = int(item)
    layers, row = bound.get("num_layers"), bound.get("dst_layout_dim")
    if layers is not None and int(layers) < 1:
        raise TransferRefused(f"{op_name}: num_layers {int(layers)}: must be at least 1", "layer")
    if layers is not None and row is not None and int(layers) * item > int(row):
        raise TransferRefused(
            f"{op_name}: num_layers {int(layers)} x item_size {item} B = {int(layers) * item} B, "
            f"but dst_layout_dim is {int(row)} B: the last layers would write into the next "
            "token's row", "item_size")
    layer, row = bound.get("layer_id"), bound.get("src_layout_dim")
    if layer is not None and row is not None and "_pf_" in op_name:
        if int(layer) < 0:
            raise TransferRefused(f"{op_name}: layer_id {int(layer)} is negative", "layer")
        if (int(layer) + 1) * item > int(row):
            raise TransferRefused(
                f"{op_name}: layer_id {int(layer)} with item_size {item} B reaches "
                f"{(int(layer) + 1) * item} B of a {int(row)} B src_layout_dim row (layers "
                f"0..{int(row) // item - 1 if item else 0})", "layer")


# SGLang's JIT HiCache kernels (``sglang/kernels/ops/kvcache/hicache.py``), imported by the host
# pool modules as ``jit_transfer_hicache_*``: name -> (cache tensor pairs (dst, src), pointer-table
# stride parameters (src, dst)).
JIT_OPS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, str]]] = {
    "jit_transfer_hicache_one_layer": ((("k_cache_dst", "k_cache_src"),
                                        ("v_cache_dst", "v_cache_src")), ("", "")),
    "jit_transfer_hicache_one_layer_mla": ((("cache_dst", "cache_src"),), ("", "")),
    "jit_transfer_hicache_all_layer": ((), ("kv_cache_src_stride_bytes",
                                            "kv_cache_dst_stride_bytes")),
    "jit_transfer_hicache_all_layer_mla": ((), ("cache_src_stride_bytes",
                                                "cache_dst_stride_bytes")),
}
_JIT_ORDER = {
    "jit_transfer_hicache_one_layer": ("k_cache_dst", "v_cache_dst", "indices_dst", "k_cache_src",
                                       "v_cache_src", "indices_src"),
    "jit_transfer_hicache_one_layer_mla": ("cache_dst", "indices_dst", "cache_src", "indices_src"),
    "jit_transfer_hicache_all_layer": ("k_ptr_dst", "v_ptr_dst", "indices_dst", "k_ptr_src",
                                       "v_ptr_src", "indices_src"),
    "jit_transfer_hicache_all_layer_mla": ("ptr_dst", "indices_dst", "ptr_src", "indices_src"),
}


def _token_bytes(t: Any) -> int:
    """Bytes of one token slot's content: the tensor's elements past dim 0."""
    f = tensor_facts(t)
    n = f.itemsize_bytes
    for d in f.shape[1:]:
        n *= d
    return n


def _jit_checked(op_name: str, op: Callable) -> Callable:
    """A JIT HiCache op that refuses (``TransferRefused``, ``kind == "item_size"``) a call whose
    token rows differ between source and destination (one-layer ops: each cache tensor's bytes
    per token slot, ``element_dim x element_size`` when given), or whose ``element_size`` does
    not fit the pointer tables' row strides (all-layer ops)."""
    pairs, (src_stride, dst_stride) = JIT_OPS[op_name]
    order = _JIT_ORDER[op_name]

    @functools.wraps(op)
    def wrapper(*args, **kwargs):
        bound = dict(zip(order, args))
        bound.update(kwargs)
        for dst_name, src_name in pairs:
            dst, src = bound.get(dst_name), bound.get(src_name)
            if dst is None or src is None:
                raise TransferRefused(f"{op_name}: cannot check the call: no argument "
                                      f"{dst_name if dst is None else src_name}", "unchecked")
            dim = bound.get("element_dim")
            d_bytes, s_bytes = _token_bytes(dst), _token_bytes(src)
            if dim is not None:
                d_bytes = int(dim) * tensor_facts(dst).itemsize_bytes
                s_bytes = int(dim) * tensor_facts(src).itemsize_bytes
            if d_bytes != s_bytes or tensor_facts(dst).itemsize_bytes != tensor_facts(src).itemsize_bytes:
                raise TransferRefused(
                    f"{op_name}: {dst_name} rows of {d_bytes} B, {src_name} rows of {s_bytes} B "
                    f"({tensor_facts(dst).describe()} vs {tensor_facts(src).describe()})",
                    "item_size")
        if src_stride:
            element = bound.get("element_size")
            strides = (bound.get(src_stride), bound.get(dst_stride))
            if element is None and strides[0] is not None and strides[0] != strides[1]:
                raise TransferRefused(f"{op_name}: no element_size and {src_stride} "
                                      f"{strides[0]} B != {dst_stride} {strides[1]} B", "item_size")
            if element is not None:
                for name, stride in zip((src_stride, dst_stride), strides):
                    if stride is not None and int(element) > int(stride):
                        raise TransferRefused(
                            f"{op_name}: element_size {int(element)} B exceeds {name} "
                            f"{int(stride)} B: each row would spill into the next", "item_size")
        return op(*args, **kwargs)

    wrapper.__kvlayout_unchecked__ = op  # type: ignore[attr-defined]
    return wrapper


def guard_transfer_ops(*namespaces: Any) -> list[str]:
    """Wraps every SGLang transfer op found in each namespace (a module that imported them, such
    as ``sglang.srt.mem_cache.memory_pool_host`` or, in newer releases, each of
    ``sglang.srt.mem_cache.pool_host.{mha,mla,dsa}``; or a module's ``__dict__``) so that, before
    the kernel runs, ``item_size`` is checked against the row stride of each layer-first tensor
    argument and ``src_layout_dim`` / ``dst_layout_dim`` against the page-first tensor's row
    stride. A mismatch raises ``TransferRefused`` (``kind == "item_size"``) naming the op, the
    argument and both numbers; nothing is launched. Returns the names wrapped (``module.op``).
    Ops whose arguments are pointer tables (``transfer_kv_all_layer``,
    ``transfer_kv_all_layer_mla``) carry no strides and are left as they are:
    :func:`check_item_sizes` covers them once, when the pools are built. Wrapping twice is a
    no-op. An op whose signature does not name the checked parameters (``(*args, **kwargs)``,
    renamed, compiled) is bound by sgl-kernel's positional order; a call in which a checked
    argument cannot be found is refused (``kind == "unchecked"``), never passed unchecked.

    A page-first row must hold the layers' items (``num_layers x item_size <= dst_layout_dim``;
    ``(layer_id + 1) x item_size <= src_layout_dim``), else ``TransferRefused``. The device side of
    a ``*_lf_pf`` backup is a pointer table too: only :func:`check_item_sizes` compares its row
    stride with ``item_size`` (the seed case's bf16 device rows, from a fork, against a host's fp8
    item).
    SGLang's JIT HiCache ops (``jit_transfer_hicache_one_layer[_mla]``,
    ``jit_transfer_hicache_all_layer[_mla]``, :data:`JIT_OPS`) are wrapped too: source and
    destination token rows must hold the same bytes, ``element_size`` must fit both pointer-table
    strides. Transfer ops found in a namespace and not checked here
    (``transfer_kv_all_layer_lf_ph``, the staged write-back ``jit_transfer_hicache_*_staged_*``,
    the ``*_direct`` ops, any newer ``transfer_kv_*``) are named in one ``UserWarning``, never
    passed over in silence."""
    wrapped = []
    unchecked = []
    for namespace in namespaces:
        ns: MutableMapping[str, Any] = (
            namespace if isinstance(namespace, MutableMapping) else vars(namespace))
        label = ns.get("__name__", "namespace")
        for op_name in TRANSFER_OPS:
            op = ns.get(op_name)
            if op is None or hasattr(op, "__kvlayout_unchecked__"):
                continue
            ns[op_name] = _checked(op_name, op)
            wrapped.append(f"{label}.{op_name}")
        for op_name in JIT_OPS:
            op = ns.get(op_name)
            if op is None or hasattr(op, "__kvlayout_unchecked__"):
                continue
            ns[op_name] = _jit_checked(op_name, op)
            wrapped.append(f"{label}.{op_name}")
        unchecked += [
            f"{label}.{n}" for n, v in ns.items()
            if (n.startswith("transfer_kv") or n.startswith("jit_transfer")) and callable(v)
            and n not in TRANSFER_OPS and n not in POINTER_TABLE_OPS and n not in JIT_OPS]
    if unchecked:
        warnings.warn(f"kvlayout: transfer ops not checked by guard_transfer_ops: "
                      f"{', '.join(sorted(unchecked))}", UserWarning, stacklevel=2)
    return wrapped
