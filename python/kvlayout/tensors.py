"""Pool geometry from live tensors: :func:`geometry_from_tensors`.

A tensor proves bytes and strides (what the memory really holds); a declared format or section
list proves meaning (engines store fp8 as ``uint8``, so a dtype alone cannot). Where the two
disagree the buffer is refused with :class:`~kvlayout.errors.TensorMismatch`, naming the buffer,
the quantity and both numbers.

Tensors are read by duck typing, never imported:

- torch: ``t.dtype`` (``torch.bfloat16``), ``t.shape``, ``t.stride()`` in **elements**,
  ``t.element_size()`` in bytes;
- numpy (with ml_dtypes for ``bfloat16`` / ``float8_*`` / ``float4_*``): ``a.dtype``,
  ``a.shape``, ``a.strides`` in **bytes**, ``a.itemsize``.

Dtype names (torch and ml_dtypes spellings): ``float32``, ``float16``, ``bfloat16``,
``float8_e4m3fn``, ``float8_e4m3fnuz``, ``float8_e5m2``, ``float8_e5m2fnuz``, ``float8_e8m0fnu``,
``float4_e2m1fn_x2`` (torch: two e2m1 values per 1-byte element), ``uint8``, ``int8``, ``int32``,
``int64``. ml_dtypes' ``float4_e2m1fn`` (one 4-bit value in each byte, unpacked) is not a packed
e2m1 layout and is refused: pack two values per byte (``uint8`` with a declared format).

Axes (``TensorBuffer.axes``, one name per dimension of the tensor, or of each per-layer tensor
when ``tensors`` is a list):

- ``"layer"``: the layer index (absent when ``tensors`` is a per-layer list);
- ``"token"``: a token slot; page ``p`` is tokens ``[p * page_size, (p + 1) * page_size)``
  (SGLang's device pools: ``[size + page_size, head_num, head_dim]`` per layer);
- ``"page"`` and ``"page_token"``: a page, and a token inside it (``page_first_direct``,
  vLLM's ``[num_blocks, block_size, ...]``);
- ``"slot"``: a state slot (``attention: "state"`` buffers: one slot per request, e.g. vLLM's
  Mamba / linear-attention state ``[num_blocks, *shape]``);
- ``"page_bytes"``: one page's content, opaque (SGLang's index-K ``[pages, page_bytes]``):
  bytes per token are the page's bytes / page size;
- ``"group"``: a head group of the ``page_unified`` memory layout (``"head"`` is then the head
  inside its group);
- any other name (``"head"``, ``"dim"``, ``"one"``): per-token content, innermost and
  contiguous.
"""

from __future__ import annotations

import json
import operator
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

from ._kvlayout import Geometry, formats
from .errors import InvalidGeometry, TensorMismatch

__all__ = ["TensorBuffer", "TensorFacts", "geometry_from_tensors", "tensor_facts", "dtype_name"]

# torch / ml_dtypes dtype name -> (geometry-file dtype, values per element)
_DTYPES: dict[str, tuple[str, int]] = {
    "float32": ("f32", 1),
    "float16": ("f16", 1),
    "bfloat16": ("bf16", 1),
    "float8_e4m3fn": ("f8e4m3", 1),
    "float8_e4m3fnuz": ("f8e4m3fnuz", 1),
    "float8_e5m2": ("f8e5m2", 1),
    "float8_e5m2fnuz": ("f8e5m2fnuz", 1),
    "float8_e8m0fnu": ("ue8m0", 1),
    "float4_e2m1fn_x2": ("f4e2m1", 2),
    "uint8": ("u8", 1),
    "int8": ("i8", 1),
    "int32": ("i32", 1),
    "int64": ("i64", 1),
}
_BYTE_CONTAINERS = {"uint8", "int8"}
_TOKEN_AXES = {"layer", "token", "page", "page_token", "page_bytes", "slot"}


def dtype_name(t: Any) -> str:
    """The torch / ml_dtypes name of a tensor's dtype (``bfloat16``, ``float8_e4m3fn``...)."""
    name = str(t.dtype)
    return name[len("torch."):] if name.startswith("torch.") else name


@dataclass(frozen=True)
class TensorFacts:
    """What one tensor proves: its dtype, shape, strides in bytes and element size in bytes."""

    dtype: str
    shape: tuple[int, ...]
    strides_bytes: tuple[int, ...]
    itemsize_bytes: int

    def describe(self) -> str:
        return (f"{self.dtype} shape {list(self.shape)} strides {list(self.strides_bytes)} B "
                f"({self.itemsize_bytes} B per element)")


def tensor_facts(t: Any) -> TensorFacts:
    """Dtype, shape and byte strides of a torch tensor (strides in elements x element_size())
    or a numpy array (strides already in bytes)."""
    if not hasattr(t, "shape") or not hasattr(t, "dtype"):
        raise TypeError(
            f"not a tensor: {type(t).__name__} has no shape/dtype (expected a torch tensor or "
            "a numpy array)")
    shape = tuple(int(d) for d in t.shape)
    element_size = getattr(t, "element_size", None)
    stride = getattr(t, "stride", None)
    if callable(element_size) and callable(stride):
        item = int(element_size())
        strides = tuple(int(s) * item for s in stride())
    elif hasattr(t, "strides") and hasattr(t, "itemsize"):
        item = int(t.itemsize)
        strides = tuple(int(s) for s in t.strides)
    else:
        raise TypeError(
            f"not a tensor: {type(t).__name__} has neither stride()/element_size() (torch) "
            "nor strides/itemsize (numpy)")
    return TensorFacts(dtype_name(t), shape, strides, item)


@dataclass
class TensorBuffer:
    """One buffer of a pool as live tensors plus its declared meaning.

    - ``name``: the buffer's name (``kv``, ``index_k``, ``k``, ``v``...), compared across pools.
    - ``tensors``: one tensor, or a list of per-layer tensors (same dtype, shape and strides).
    - ``axes``: one name per dimension (module docs); default ``("token", *content)`` for a
      per-layer list and ``("layer", "token", *content)`` for one tensor.
    - ``format``: a built-in format name (``kvlayout.formats()``), or ``sections`` (file form,
      ``[{"name", "dtype", "shape", "scales"?, "block_elems"?}]``) with ``arrangement``; when
      neither is given the tensor's own dtype and per-token content shape are the meaning.
    - ``layers``: for a per-layer list, the count (default ``len(tensors)``).
    - ``extra``: further v2 buffer fields copied into the geometry (``attention``,
      ``layer_ids``, ``page_size_tokens``, ``page_stride_bytes``, ``shard``): what the tensors
      cannot show. ``page_stride_bytes`` is checked against the tensor's page stride like the
      rest. Any other key (``name``, ``layers``, ``sections``, ``arrangement``...: read from the
      tensors or given by their own arguments) raises :class:`~kvlayout.errors.InvalidGeometry`
      naming it.
    """

    name: str
    tensors: Any
    axes: Optional[Sequence[str]] = None
    format: Optional[str] = None
    sections: Optional[list[dict]] = None
    arrangement: Any = None
    page_align_bytes: Optional[int] = None
    extra: dict = field(default_factory=dict)


def _refuse(buffer: str, what: str, declared: Any, tensor: Any, facts: TensorFacts) -> TensorMismatch:
    return TensorMismatch(
        f"{buffer}.{what}",
        f"declared {declared}, tensor {tensor} ({facts.describe()})")


def _is_layer_list(tensors: Any) -> bool:
    return isinstance(tensors, (list, tuple))


def _declared(buf: TensorBuffer) -> tuple[Optional[list[dict]], Any, Optional[int]]:
    if buf.format is not None:
        if buf.sections is not None:
            raise ValueError(f"{buf.name}: give format or sections, not both")
        by_name = {f["name"]: f for f in formats()}
        if buf.format not in by_name:
            raise ValueError(f"{buf.name}.format: unknown format {buf.format!r} "
                             f"(expected one of {', '.join(sorted(by_name))})")
        layout = by_name[buf.format]["layout"]
        return (layout["sections"], buf.arrangement or layout["arrangement"],
                buf.page_align_bytes or layout.get("page_align_bytes"))
    return buf.sections, buf.arrangement, buf.page_align_bytes


# The buffer fields `TensorBuffer.extra` may carry: those no tensor shows.
EXTRA_FIELDS = ("attention", "layer_ids", "page_size_tokens", "page_stride_bytes", "shard")


def _splits_pages(memory_layout: Any) -> bool:
    """Whether the memory layout stores a page of one layer as pieces (heads or head groups):
    ``page_head``, ``layer_head``, ``{"page_unified": {...}}``. Their strides are checked
    against the geometry's placement (:func:`check_pieces`)."""
    return memory_layout in ("page_head", "page_head_token", "layer_head") or isinstance(
        memory_layout, dict)


def _buffer_doc(buf: TensorBuffer, pool_page_size_tokens: int,
                memory_layout: Any) -> tuple[dict, int]:
    """The geometry-file buffer object and the pages the tensors hold."""
    for key in buf.extra:
        if key not in EXTRA_FIELDS:
            raise InvalidGeometry(
                f"{buf.name}.extra.{key}",
                f"{key!r} cannot be given in extra: the tensors or the TensorBuffer's own "
                f"arguments say it (extra takes {', '.join(EXTRA_FIELDS)})")
    page_size_tokens = int(buf.extra.get("page_size_tokens", pool_page_size_tokens))
    per_layer = _is_layer_list(buf.tensors)
    if per_layer:
        if not buf.tensors:
            raise ValueError(f"{buf.name}.tensors: an empty per-layer list")
        first = buf.tensors[0]
        facts = tensor_facts(first)
        for i, t in enumerate(buf.tensors[1:], start=1):
            other = tensor_facts(t)
            if other != facts:
                raise TensorMismatch(
                    f"{buf.name}.tensors[{i}]",
                    f"differs from tensors[0]: {other.describe()} vs {facts.describe()}")
        layers = len(buf.tensors)
    else:
        facts = tensor_facts(buf.tensors)
        layers = None
    if buf.axes is not None:
        axes = list(buf.axes)
    elif per_layer:
        axes = ["token"] + [f"d{i}" for i in range(len(facts.shape) - 1)]
    else:
        axes = ["layer", "token"] + [f"d{i}" for i in range(len(facts.shape) - 2)]
    if len(axes) != len(facts.shape):
        raise ValueError(f"{buf.name}.axes: {len(axes)} names {axes} for a tensor of "
                         f"{len(facts.shape)} dimensions {list(facts.shape)}")
    repeated = sorted({a for a in axes if axes.count(a) > 1})
    if repeated:
        raise ValueError(f"{buf.name}.axes: {axes} names {', '.join(map(repr, repeated))} "
                         "more than once (one name per dimension)")
    empty = [f"{a!r}" for a, n in zip(axes, facts.shape) if n == 0]
    if empty:
        # Checked first: a zero-size tensor's strides say nothing (numpy gives them anyway).
        raise TensorMismatch(f"{buf.name}.shape",
                             f"axis {', '.join(empty)} of {list(facts.shape)} is 0: the tensor "
                             f"holds no bytes ({facts.describe()})")
    dims = dict(zip(axes, facts.shape))
    strides = dict(zip(axes, facts.strides_bytes))
    if "layer" in dims:
        if per_layer:
            raise ValueError(f"{buf.name}.axes: a per-layer list has no 'layer' axis")
        layers = dims["layer"]
    if layers is None:
        raise ValueError(f"{buf.name}.axes: {axes} has no 'layer' axis; give a per-layer list "
                         "of tensors or name the layer axis")

    if "layer" in dims and dims["layer"] > 1:
        # The axes inside the layer axis (smaller or equal strides) span one layer's extent;
        # a layer stride below it overlaps layers (a stride of 0: every layer the same bytes).
        inner = [a for a in axes if a != "layer" and strides[a] <= strides["layer"]]
        extent = facts.itemsize_bytes + sum(max(dims[a] - 1, 0) * strides[a] for a in inner)
        if strides["layer"] == 0:
            raise TensorMismatch(f"{buf.name}.strides",
                                 f"layer stride 0 B: all {dims['layer']} layers are the same "
                                 f"bytes ({facts.describe()})")
        if strides["layer"] < extent:
            raise TensorMismatch(f"{buf.name}.strides",
                                 f"layer stride {strides['layer']} B is below one layer's "
                                 f"extent {extent} B: layers overlap ({facts.describe()})")

    values_per_elem = _DTYPES.get(facts.dtype, (None, 1))[1]
    content = [a for a in axes if a not in _TOKEN_AXES]
    content_elems = 1
    for a in content:
        content_elems *= dims[a]
    # A layer axis inside the token or page axis (page_first, page_first_direct, page_head):
    # that axis's stride spans every layer, and one layer's share is stride / layers.
    def layer_share(axis: str) -> int:
        if "layer" in dims and strides[axis] > strides["layer"]:
            if strides[axis] % dims["layer"]:
                raise TensorMismatch(f"{buf.name}.strides",
                                     f"{axis} stride {strides[axis]} B does not split over "
                                     f"{dims['layer']} layers ({facts.describe()})")
            return strides[axis] // dims["layer"]
        return strides[axis]

    # Heads outside the token axis inside a page: vLLM's HND, SGLang's page_head. The row is
    # not one run; the arrangement (head_major) or memory layout (page_head) places it.
    page_head = "page" in dims and "page_token" in dims and any(
        strides[a] > strides["page_token"] for a in content)
    if not page_head:
        # Content dims are innermost and packed: the row is one contiguous run.
        expect = facts.itemsize_bytes
        for a in reversed(content):
            if dims[a] > 1 and strides[a] != expect:
                raise TensorMismatch(f"{buf.name}.strides",
                                     f"content axis {a!r} has stride {strides[a]} B, a packed "
                                     f"row needs {expect} B ({facts.describe()})")
            expect *= dims[a]

    if "page_bytes" in dims:
        if "page" not in dims:
            raise ValueError(f"{buf.name}.axes: 'page_bytes' needs a 'page' axis")
        if strides["page_bytes"] != facts.itemsize_bytes and dims["page_bytes"] > 1:
            raise TensorMismatch(f"{buf.name}.strides", f"page content not packed ({facts.describe()})")
        page_payload = dims["page_bytes"] * content_elems * facts.itemsize_bytes
        if page_payload % page_size_tokens:
            raise TensorMismatch(f"{buf.name}.bytes_per_page",
                                 f"tensor page of {page_payload} B does not split over "
                                 f"page_size_tokens {page_size_tokens} ({facts.describe()})")
        row_bytes = page_payload // page_size_tokens
        row_elems = dims["page_bytes"] * content_elems // page_size_tokens
        content_shape = [row_elems * values_per_elem]
        page_stride: Optional[int] = layer_share("page")
        pages = dims["page"]
    else:
        pieced = _splits_pages(memory_layout)
        row_bytes = content_elems * facts.itemsize_bytes
        content_shape = [dims[a] for a in content] or [1]
        content_shape[-1] *= values_per_elem
        if "slot" in dims:
            # A state buffer (attention "state"): one slot per request, no token axis.
            pages = dims["slot"]
            page_stride = layer_share("slot")
            token_stride = row_bytes
        elif "token" in dims:
            token_stride = layer_share("token")
            pages = dims["token"] // page_size_tokens
            if pages < 1:
                raise TensorMismatch(f"{buf.name}.pages",
                                     f"tensor holds {dims['token']} tokens, fewer than one "
                                     f"page of {page_size_tokens} ({facts.describe()})")
            page_stride = token_stride * page_size_tokens
        elif "page" in dims and "page_token" in dims:
            if dims["page_token"] != page_size_tokens:
                raise TensorMismatch(f"{buf.name}.page_size_tokens",
                                     f"declared {page_size_tokens}, tensor {dims['page_token']} "
                                     f"tokens per page ({facts.describe()})")
            pages = dims["page"]
            # A layout that splits pages into heads or groups (page_head, layer_head,
            # page_unified): page, layer, head and token strides are checked against the
            # geometry's placement once it is built (check_pieces).
            page_stride = None if pieced else layer_share("page")
            token_stride = row_bytes if page_head or pieced else layer_share("page_token")
        else:
            raise ValueError(f"{buf.name}.axes: {axes} names no token axis ('token', "
                             "'page' + 'page_token', or 'page' + 'page_bytes')")
        if token_stride != row_bytes:
            raise TensorMismatch(f"{buf.name}.token_stride_bytes",
                                 f"row of {row_bytes} B, tokens {token_stride} B apart: padding "
                                 f"between tokens is not a layout kvlayout models ({facts.describe()})")

    sections, arrangement, align = _declared(buf)
    if sections is None:
        file_dtype = _DTYPES.get(facts.dtype, (None, 1))[0]
        if file_dtype is None:
            raise TensorMismatch(f"{buf.name}.dtype",
                                 f"unknown tensor dtype {facts.dtype!r} and no declared format "
                                 f"(known: {', '.join(_DTYPES)})")
        sections = [{"name": "values", "dtype": file_dtype, "shape": content_shape}]
    arrangement = arrangement or "token_major"
    _check_placement(buf.name, facts, dims, strides, sections, arrangement, memory_layout,
                     page_head, page_size_tokens)

    doc: dict = {"name": buf.name, "layers": layers, "arrangement": arrangement,
                 "sections": sections}
    if align:
        doc["page_align_bytes"] = align
    doc.update(buf.extra)
    declared = _probe(doc, pool_page_size_tokens)
    if declared["bytes_per_token"] != row_bytes:
        raise _refuse(buf.name, "bytes_per_token", f"{declared['bytes_per_token']} B/token"
                      f"{' (' + buf.format + ')' if buf.format else ''}",
                      f"{row_bytes} B/token", facts)
    if page_stride is not None and declared["page_stride_bytes"] != page_stride:
        raise _refuse(buf.name, "page_stride_bytes", f"{declared['page_stride_bytes']} B",
                      f"{page_stride} B", facts)
    declared_dtypes = {s["dtype"] for s in sections}
    tensor_dtype = _DTYPES.get(facts.dtype, (None, 1))[0]
    if facts.dtype not in _BYTE_CONTAINERS and declared_dtypes != {tensor_dtype}:
        raise _refuse(buf.name, "dtype", "/".join(sorted(declared_dtypes)),
                      f"{facts.dtype} ({tensor_dtype}); only a uint8/int8 byte container may "
                      "hold another dtype's bits", facts)
    return doc, pages


def _check_placement(name: str, facts: TensorFacts, dims: dict, strides: dict,
                     sections: list[dict], arrangement: Any, memory_layout: str,
                     page_head: bool, page_size_tokens: int) -> None:
    """Refuses a declared arrangement or memory layout that the tensor's strides contradict
    (``TensorMismatch`` naming the buffer, the field, the declared value and the strides):

    - heads outside the page's token axis (vLLM HND) are ``head_major`` (or the ``page_head``
      memory layout);
    - packed token rows of a typed tensor (not a ``uint8``/``int8`` byte container, which an
      engine may view with another meaning) are ``token_major``, or an arrangement that places
      the same bytes: one section (group), or one token per page;
    - a layer axis outside the page (or token, or slot) axis is ``layer_first`` or
      ``layer_head``; inside it, any other memory layout.
    """
    if page_head and not _splits_pages(memory_layout) and arrangement != "head_major":
        raise TensorMismatch(
            f"{name}.arrangement",
            f"declared {arrangement}, tensor head_major: heads outside the page's token axis "
            f"({facts.describe()})")
    token_axis = "page_token" if "page_token" in dims else "token" if "token" in dims else None
    if (token_axis is not None and not page_head and "page_bytes" not in dims
            and facts.dtype not in _BYTE_CONTAINERS and page_size_tokens > 1):
        if arrangement == "head_major":
            rows = len(sections) == 1 and _placement_heads(sections[0]) == 1
        elif arrangement == "token_major":
            rows = True
        elif isinstance(arrangement, dict):
            rows = len(arrangement.get("planes", [])) == 1
        else:
            rows = len(sections) == 1
        if not rows:
            raise TensorMismatch(
                f"{name}.arrangement",
                f"declared {arrangement}, tensor token_major: each token's row packed and "
                f"contiguous ({facts.describe()})")
    page_axis = next((a for a in ("page", "token", "slot") if a in dims), None)
    if dims.get("layer", 1) > 1 and page_axis is not None and dims[page_axis] > 1:
        layer_outside = strides["layer"] > strides[page_axis]
        if layer_outside != (memory_layout in ("layer_first", "layer_head")):
            shown = "layer_first" if layer_outside else "a page-first layout"
            raise TensorMismatch(
                f"{name}.memory_layout",
                f"declared {memory_layout}, tensor {shown}: layer stride {strides['layer']} B, "
                f"{page_axis} stride {strides[page_axis]} B ({facts.describe()})")


def _placement_heads(section: dict) -> int:
    """Heads a ``head_major`` page lays out one after another (the core's ``Section::heads``):
    the leading shape entry of a shape of two or more entries, else 1."""
    shape = section.get("shape", [])
    return int(shape[0]) if len(shape) >= 2 else 1


def _probe(doc: dict, page_size_tokens: int) -> dict:
    """Bytes per token and page stride of one declared buffer, computed by the core."""
    g = Geometry.from_json(json.dumps(_file(page_size_tokens, 1, "layer_first", "", [doc])))
    return g.buffers[0]


def _file(page_size_tokens: int, pages: int, memory_layout: Any, name: str,
          buffers: list[dict]) -> dict:
    if isinstance(memory_layout, dict):  # {"page_unified": {"heads_per_group": N}}: v3 only
        return {"schema": "kvlayout.geometry/v3", "name": name,
                "page_size_tokens": page_size_tokens, "pages": pages,
                "memory_layout": memory_layout, "buffers": buffers}
    v2 = any(set(b) - {"name", "layers", "arrangement", "sections", "page_align_bytes",
                       "page_stride_bytes"} for b in buffers) or any(
        s["dtype"] in ("i32", "i64") or "order" in s for b in buffers for s in b["sections"])
    return {"schema": "kvlayout.geometry/v2" if v2 else "kvlayout.geometry/v1",
            "name": name, "page_size_tokens": page_size_tokens, "pages": pages,
            "memory_layout": memory_layout, "buffers": buffers}


def _int_arg(field: str, value: Any) -> int:
    """An int argument: an ``int`` or an integer with ``__index__`` (numpy's ``int64``...), not a
    bool; ``TypeError`` naming the field otherwise."""
    if not isinstance(value, bool):  # numpy's bool_ has no __index__ (TypeError below)
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise TypeError(f"{field}: expected an int, got {type(value).__name__} {value!r}")


def geometry_from_tensors(
    buffers: Union[Sequence[TensorBuffer], Mapping[str, Any]],
    *,
    page_size_tokens: int,
    pages: Optional[int] = None,
    memory_layout: Union[str, Mapping[str, Any]] = "layer_first",
    name: str = "",
) -> Geometry:
    """A pool geometry read from live tensors.

    ``buffers``: :class:`TensorBuffer` objects, or ``{name: tensor_or_per_layer_list}`` (the
    tensor's dtype and per-token shape are then the meaning). ``page_size_tokens``: tokens per
    page. ``pages``: the pool's page count; default the fewest pages any buffer's tensors hold
    (a page index is valid only where every buffer has that page). ``memory_layout``: how the
    pages are placed (``layer_first``, ``page_first``, ``page_first_direct``, ``page_head``,
    ``layer_head``, ``page_head_token``, or ``{"page_unified": {"heads_per_group": N}}``); under
    ``layer_head``, ``page_head_token`` and ``page_unified`` each tensor's page, layer, head (``group``) and token strides, and the
    distance between buffers sharing the region, are checked against the geometry's
    placement.

    Raises :class:`~kvlayout.errors.TensorMismatch` when a tensor disagrees with its declared
    format (bytes per token, page stride, dtype), naming the buffer and both numbers;
    :class:`~kvlayout.errors.InvalidGeometry` when the result breaks a geometry rule.
    """
    page_size_tokens = _int_arg("page_size_tokens", page_size_tokens)
    if page_size_tokens < 1:
        raise InvalidGeometry("page_size_tokens", f"{page_size_tokens}: must be at least 1")
    if pages is not None:
        pages = _int_arg("pages", pages)
    if isinstance(buffers, Mapping):
        buffers = [TensorBuffer(n, t) for n, t in buffers.items()]
    if not buffers:
        raise InvalidGeometry("buffers", "none given: a pool needs at least one buffer")
    docs = []
    held = []
    for b in buffers:
        try:
            doc, held_pages = _buffer_doc(b, page_size_tokens, memory_layout)
        except TypeError as e:
            raise TypeError(f"{b.name}: {e}") from None
        docs.append(doc)
        held.append((held_pages, b.name))
    fewest, fewest_name = min(held)
    if pages is None:
        pages = fewest
    elif pages > fewest:
        raise TensorMismatch(f"{fewest_name}.pages",
                             f"declared {pages} pages, tensor holds {fewest}")
    g = Geometry.from_json(json.dumps(_file(page_size_tokens, pages, memory_layout, name, docs)))
    if memory_layout in ("layer_head", "page_head_token") or isinstance(memory_layout, dict):
        # page_head keeps its older check (the page's total only); the vLLM adapter checks its
        # BHLNC views with check_pieces itself.
        check_pieces(g, buffers)
    return g


def _address(t: Any) -> Optional[int]:
    """The address of a tensor's first element: torch's ``data_ptr()``, numpy's
    ``__array_interface__``; ``None`` for an object with neither (a strided view)."""
    ptr = getattr(t, "data_ptr", None)
    if callable(ptr):
        return int(ptr())
    face = getattr(t, "__array_interface__", None)
    return int(face["data"][0]) if face else None


def check_pieces(g: Geometry, buffers: Sequence[TensorBuffer]) -> None:
    """Under ``layer_head``, ``page_head_token`` and ``page_unified`` (and ``page_head`` when
    called) the tensors' strides must be the geometry's placement (``Geometry.regions()``):
    ``page`` its page step, ``layer`` its layer step, ``head`` its head step (``page_unified``:
    ``group`` the group step and ``head`` one head's bytes inside the group), ``page_token`` its
    row step (``run_step_bytes``), the innermost axis one element; and buffers that share a region start
    ``offset_bytes`` apart. ``TensorMismatch`` names the buffer, the axis and both strides."""
    placed = {b["name"]: (r["name"], b) for r in g.regions() for b in r["buffers"]}
    firsts: dict[str, tuple[int, int, str]] = {}
    for buf in buffers:
        region, p = placed[buf.name]
        t = buf.tensors[0] if _is_layer_list(buf.tensors) else buf.tensors
        facts = tensor_facts(t)
        axes = list(buf.axes or ())
        dims = dict(zip(axes, facts.shape))
        strides = dict(zip(axes, facts.strides_bytes))
        heads = dims.get("head", 1) * dims.get("group", 1)
        row = sum(p["section_bytes_per_token"])
        per_piece = heads // p["heads"]
        expect = {"page": p["page_step_bytes"], "layer": p["layer_step_bytes"],
                  "page_token": p["run_step_bytes"]}
        if "group" in dims:
            expect["group"] = p["head_step_bytes"]
            expect["head"] = row // max(heads, 1)
        else:
            expect["head"] = p["head_step_bytes"] if per_piece == 1 else row // max(heads, 1)
        expect[axes[-1]] = facts.itemsize_bytes
        for axis, want in expect.items():
            if axis in dims and dims[axis] > 1 and strides[axis] != want:
                raise TensorMismatch(
                    f"{buf.name}.strides",
                    f"{g.memory_layout} places {axis} {want} B apart, tensor {strides[axis]} B "
                    f"({facts.describe()})")
        addr = _address(t)
        if addr is None:
            continue
        if region not in firsts:
            firsts[region] = (addr, p["offset_bytes"], buf.name)
            continue
        base, off, first = firsts[region]
        if addr - base != p["offset_bytes"] - off:
            raise TensorMismatch(
                f"{buf.name}.offset_bytes",
                f"{g.memory_layout} places {buf.name} {p['offset_bytes'] - off} B after "
                f"{first}, tensor {addr - base} B ({facts.describe()})")


def _host_bytes(t: Any, what: str) -> Any:
    """A zero-copy ``uint8`` numpy view of a C-contiguous CPU torch tensor, for the Rust page
    checksum (``TransferGuard.page_checksums`` / ``record_backup`` / ``verify_load``,
    ``page_checksum``): the bytes are hashed in Rust, never in Python. CUDA tensors take
    :func:`_cuda_bytes` instead (checksummed on their device); a tensor on any other device is
    refused, and a non-contiguous one too (a copy would hash other memory than the pool's),
    naming ``what``: the caller's argument (``data``, ``payload``)."""
    device = getattr(t, "device", None)
    if getattr(device, "type", "cpu") != "cpu":
        raise ValueError(f"{what}: a {device} tensor; page checksums are computed on the CPU or, "
                         "for CUDA tensors, on their device (copy the layer to host memory)")
    if hasattr(t, "is_contiguous") and not t.is_contiguous():
        raise ValueError(f"{what}: a non-contiguous tensor; pass the pool's contiguous layer "
                         "tensor")
    import sys

    uint8 = sys.modules["torch"].uint8  # a torch tensor in hand: torch is imported
    return t.detach().reshape(-1).view(uint8).numpy()


def _cuda_bytes(t: Any, what: str) -> tuple[int, int, int, int]:
    """``(device address, bytes, device index, stream)`` of a C-contiguous CUDA torch tensor,
    for the Rust page checksum on its device: the kernel reads the tensor in place on
    PyTorch's current stream of that device (``stream``, a ``CUstream`` handle; 0 is the
    default stream), so it follows every write PyTorch enqueued there. A non-contiguous tensor
    is refused (its pages are not where the geometry puts them), naming ``what``: the caller's
    argument (``data``, ``payload``)."""
    if not t.is_contiguous():
        raise ValueError(f"{what}: a non-contiguous tensor; pass the pool's contiguous layer "
                         "tensor")
    import sys

    torch = sys.modules["torch"]  # a torch tensor in hand: torch is imported
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(index).cuda_stream
    return t.data_ptr(), t.numel() * t.element_size(), index, stream
