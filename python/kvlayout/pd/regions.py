"""Byte layout of one rank's pool, read from its geometry JSON (`kvlayout.geometry/v1` or `/v2`).

Each buffer of the pool is one memory region. Its size and the byte offset of every page, token,
section and head come from the geometry alone (dtype widths, per-token shapes, arrangement,
page stride, memory layout), as the geometry-file contract defines them:

- page stride: `page_stride_bytes`, else the page payload rounded up to `page_align_bytes`,
  else the payload (`page_size_tokens` x bytes per token);
- `layer_first`: page `p` of layer `l` at `(l * pages + p) * stride`;
  `page_first` / `page_first_direct`: at `(p * layers + l) * stride`;
- inside a page: `token_major` (a row per token, sections in order), `section_major` (each
  section's rows for all tokens, one section after another), `head_major` (section after section,
  heads outermost inside a section), `{"planes": [[...], ...]}` (groups, token-major inside a
  group, group after group).

`page_head` memory layouts are refused by name (their runs interleave heads across layers; no
transfer plan here models them).
"""

from __future__ import annotations

from dataclasses import dataclass

# Bits per element of each dtype named by the geometry-file contract.
DTYPE_BITS = {
    "f32": 32,
    "f16": 16,
    "bf16": 16,
    "f8e4m3": 8,
    "f8e4m3fnuz": 8,
    "f8e5m2": 8,
    "f8e5m2fnuz": 8,
    "ue8m0": 8,
    "u8": 8,
    "i8": 8,
    "f4e2m1": 4,
    "i32": 32,
    "i64": 64,
}

MEMORY_LAYOUTS = ("layer_first", "page_first", "page_first_direct")


class LayoutError(ValueError):
    """A geometry this module cannot lay out; the message names the field and the value."""


@dataclass(frozen=True)
class Section:
    name: str
    dtype: str
    shape: tuple[int, ...]
    bytes_per_token: int


@dataclass(frozen=True)
class Shard:
    tp_size: int
    rank: int
    split: str  # "heads" | "replicated"
    heads_total: int | None


@dataclass(frozen=True)
class BufferLayout:
    """One buffer of one rank: a region of `layers x pages` pages of `page_stride_bytes`."""

    name: str
    layers: int
    pages: int
    page_size_tokens: int
    arrangement: object  # "token_major" | "section_major" | "head_major" | {"planes": ...}
    sections: tuple[Section, ...]
    page_stride_bytes: int
    memory_layout: str
    shard: Shard | None

    @property
    def bytes_per_token(self) -> int:
        return sum(s.bytes_per_token for s in self.sections)

    @property
    def region_bytes(self) -> int:
        return self.layers * self.pages * self.page_stride_bytes

    def page_offset_bytes(self, layer: int, page: int) -> int:
        """Start of page `page` of layer `layer` inside this buffer's region."""
        if not 0 <= layer < self.layers:
            raise LayoutError(f"{self.name}: layer {layer} outside 0..{self.layers}")
        if not 0 <= page < self.pages:
            raise LayoutError(f"{self.name}: page {page} outside 0..{self.pages}")
        if self.memory_layout == "layer_first":
            return (layer * self.pages + page) * self.page_stride_bytes
        return (page * self.layers + layer) * self.page_stride_bytes

    def section_index(self, name: str) -> int:
        for i, s in enumerate(self.sections):
            if s.name == name:
                return i
        raise LayoutError(f"{self.name}: no section {name!r}")

    def heads_local(self, section: Section) -> int:
        """Heads this rank holds in `section`: the first shape entry of a heads-split buffer,
        else the section's heads as the core counts them (`Section::heads`: the leading entry of
        a shape of two or more entries, else 1)."""
        if self.shard is not None and self.shard.split == "heads":
            return section.shape[0]
        return placement_heads(section)

    def piece_runs(self, token: int, section_idx: int, head_lo: int, head_hi: int):
        """Byte runs `(offset_in_page, length)` holding local heads `[head_lo, head_hi)` of one
        section of one token. Heads are the outermost per-token axis, so a head range is one run
        in every arrangement (one run per head in `head_major`)."""
        sec = self.sections[section_idx]
        heads = self.heads_local(sec)
        if sec.bytes_per_token % heads:
            raise LayoutError(
                f"{self.name}.{sec.name}: {sec.bytes_per_token} B per token over "
                f"{heads} heads is not whole bytes per head"
            )
        head_bytes = sec.bytes_per_token // heads
        tokens = self.page_size_tokens
        arr = self.arrangement
        before = sum(s.bytes_per_token for s in self.sections[:section_idx])
        if arr == "token_major":
            start = token * self.bytes_per_token + before
            return [(start + head_lo * head_bytes, (head_hi - head_lo) * head_bytes)]
        if arr == "section_major":
            start = tokens * before + token * sec.bytes_per_token
            return [(start + head_lo * head_bytes, (head_hi - head_lo) * head_bytes)]
        if arr == "head_major":
            start = tokens * before
            if placement_heads(sec) == 1:
                # One head per token as the core lays it (a one-entry shape): the section's
                # rows token after token, a head range one run inside the token's row.
                start += token * sec.bytes_per_token
                return [(start + head_lo * head_bytes, (head_hi - head_lo) * head_bytes)]
            return [
                (start + h * tokens * head_bytes + token * head_bytes, head_bytes)
                for h in range(head_lo, head_hi)
            ]
        # planes: group after group; token-major rows of the group's sections inside a group
        assert isinstance(arr, dict)  # the planes form (the named forms returned above)
        groups = arr["planes"]
        group_start = 0
        for group in groups:
            members = [self.section_index(n) for n in group]
            row_bytes = sum(self.sections[i].bytes_per_token for i in members)
            if section_idx in members:
                within = sum(
                    self.sections[i].bytes_per_token for i in members[: members.index(section_idx)]
                )
                start = group_start + token * row_bytes + within
                return [(start + head_lo * head_bytes, (head_hi - head_lo) * head_bytes)]
            group_start += tokens * row_bytes
        raise LayoutError(f"{self.name}.arrangement: section {sec.name!r} in no plane")


def placement_heads(section: Section) -> int:
    """Heads a `head_major` page lays out one after another for `section`: the leading shape
    entry when the shape has two or more entries, else 1 (the core's `Section::heads`), whether
    or not the buffer is split across ranks."""
    return section.shape[0] if len(section.shape) >= 2 else 1


def _section(buf_name: str, raw: dict) -> Section:
    dtype = raw["dtype"]
    if dtype not in DTYPE_BITS:
        raise LayoutError(f"{buf_name}.{raw.get('name')}.dtype: unknown dtype {dtype!r}")
    shape = tuple(int(x) for x in raw["shape"])
    elems = 1
    for x in shape:
        if x <= 0:
            raise LayoutError(f"{buf_name}.{raw.get('name')}.shape: zero or negative entry {x}")
        elems *= x
    bits = elems * DTYPE_BITS[dtype]
    if bits % 8:
        raise LayoutError(
            f"{buf_name}.{raw.get('name')}.shape: {elems} {dtype} elements are not whole bytes"
        )
    return Section(raw.get("name", ""), dtype, shape, bits // 8)


def _shard(buf_name: str, raw: dict | None) -> Shard | None:
    if raw is None:
        return None
    split = raw.get("split", "replicated")
    if split not in ("heads", "replicated"):
        raise LayoutError(f"{buf_name}.shard.split: unknown split {split!r}")
    return Shard(int(raw["tp_size"]), int(raw["rank"]), split, raw.get("heads_total"))


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def buffer_layouts(
    geometry: dict, core_buffers: list[dict] | None = None
) -> dict[str, BufferLayout]:
    """Per-buffer layouts of a geometry JSON object, keyed by buffer name, in file order.

    `core_buffers`: `kvlayout.Geometry.buffers` of the same geometry (the Rust core's bytes per
    token and page stride); when given, each buffer's figures here must equal the core's, or
    `LayoutError` names the buffer and both numbers."""
    memory_layout = geometry.get("memory_layout", "layer_first")
    if memory_layout not in MEMORY_LAYOUTS:
        raise LayoutError(
            f"memory_layout: {memory_layout!r} has no transfer plan here (one of {MEMORY_LAYOUTS})"
        )
    pages = int(geometry["pages"])
    out: dict[str, BufferLayout] = {}
    for raw in geometry["buffers"]:
        name = raw["name"]
        if raw.get("attention", "full") == "state":
            raise LayoutError(f"{name}.attention: state buffers have no page plan here")
        sections = tuple(_section(name, s) for s in raw["sections"])
        tokens = int(raw.get("page_size_tokens", geometry["page_size_tokens"]))
        payload = tokens * sum(s.bytes_per_token for s in sections)
        stride = payload
        if "page_align_bytes" in raw:
            stride = _round_up(payload, int(raw["page_align_bytes"]))
        if "page_stride_bytes" in raw:
            stride = int(raw["page_stride_bytes"])
            if stride < payload:
                raise LayoutError(
                    f"{name}.page_stride_bytes: {stride} below the page payload {payload}"
                )
        if core_buffers is not None:
            core = next((b for b in core_buffers if b["name"] == name), None)
            if core is None:
                raise LayoutError(f"{name}: buffer absent from the core geometry")
            for label, here, there in (
                (
                    "bytes_per_token",
                    sum(s.bytes_per_token for s in sections),
                    core["bytes_per_token"],
                ),
                ("page_stride_bytes", stride, core["page_stride_bytes"]),
            ):
                if here != there:
                    raise LayoutError(f"{name}.{label}: pd layout {here}, kvlayout core {there}")
        out[name] = BufferLayout(
            name=name,
            layers=int(raw["layers"]),
            pages=pages,
            page_size_tokens=tokens,
            arrangement=raw["arrangement"],
            sections=sections,
            page_stride_bytes=stride,
            memory_layout=memory_layout,
            shard=_shard(name, raw.get("shard")),
        )
    return out
