"""Receiving-side verification, written as numpy reshapes (a second formulation of the
arrangements, independent of the byte-run arithmetic in `regions.piece_runs` / `plan`).

A region is viewed as `[layers, pages, stride]`; a page payload is cut into per-section arrays
`[tokens, heads, head_bytes]` by reshaping, per arrangement, as the geometry-file contract reads:
`token_major` = `[tokens, row]` then columns; `section_major` = one `[tokens, section]` block per
section; `head_major` = one `[heads, tokens, head_bytes]` block per section; `planes` = one
`[tokens, group_row]` block per group. The source pattern is regenerated from the seed the
prefill side used.
"""

from __future__ import annotations

import numpy as np

from .regions import BufferLayout


def pattern(layout: BufferLayout, seed: int, buffer_index: int) -> np.ndarray:
    """The bytes the prefill side writes into a buffer's region before publishing."""
    rng = np.random.default_rng([seed, buffer_index])
    return rng.integers(0, 256, size=layout.region_bytes, dtype=np.uint8)


def _pages_view(layout: BufferLayout, region: np.ndarray) -> np.ndarray:
    """`[layers, pages, payload]` (a copy is fine: verification only reads)."""
    stride = layout.page_stride_bytes
    if layout.memory_layout == "layer_first":
        v = region.reshape(layout.layers, layout.pages, stride)
    else:
        v = region.reshape(layout.pages, layout.layers, stride).transpose(1, 0, 2)
    return v[:, :, : layout.page_size_tokens * layout.bytes_per_token]


def sections(layout: BufferLayout, region: np.ndarray) -> list[np.ndarray]:
    """Per section `[layers, pages, tokens, heads, head_bytes]`."""
    pages = _pages_view(layout, region)
    L, N, T = layout.layers, layout.pages, layout.page_size_tokens
    out: list[np.ndarray] = [None] * len(layout.sections)  # type: ignore[list-item]
    sizes = [s.bytes_per_token for s in layout.sections]
    arr = layout.arrangement
    if arr in ("token_major", "section_major", "head_major"):
        groups = (
            [[i] for i in range(len(sizes))] if arr != "token_major" else [list(range(len(sizes)))]
        )
    else:
        assert isinstance(arr, dict)  # the planes form
        groups = [[layout.section_index(n) for n in g] for g in arr["planes"]]
    start = 0
    for group in groups:
        row = sum(sizes[i] for i in group)
        block = pages[:, :, start : start + T * row]
        start += T * row
        if arr == "head_major":
            i = group[0]
            laid = _laid_heads(layout.sections[i].shape)
            h = _held_heads(layout, layout.sections[i].shape)
            by_token = block.reshape(L, N, laid, T, row // laid).transpose(0, 1, 3, 2, 4)
            out[i] = by_token.reshape(L, N, T, h, row // h)
            continue
        rows = block.reshape(L, N, T, row)
        col = 0
        for i in group:
            h = _held_heads(layout, layout.sections[i].shape)
            out[i] = rows[:, :, :, col : col + sizes[i]].reshape(L, N, T, h, sizes[i] // h)
            col += sizes[i]
    return out


def _laid_heads(shape: tuple[int, ...]) -> int:
    """Heads a `head_major` block holds one after another: the leading entry of a shape of two
    or more entries, else 1 (written again here, not taken from `regions`)."""
    return shape[0] if len(shape) >= 2 else 1


def _held_heads(layout: BufferLayout, shape: tuple[int, ...]) -> int:
    """Heads a token's section is cut into: this rank's heads (the leading entry) when the buffer
    is split by heads, else the laid-out heads."""
    sh = layout.shard
    return shape[0] if sh is not None and sh.split == "heads" else _laid_heads(shape)


def _tokens(sec: np.ndarray, pages: list[int]) -> np.ndarray:
    """`[layers, len(pages) * tokens, heads, head_bytes]`: the listed pages as one token stream."""
    s = sec[:, pages]
    return s.reshape(s.shape[0], s.shape[1] * s.shape[2], s.shape[3], s.shape[4])


def _window(layout: BufferLayout, heads: int) -> tuple[int, int]:
    sh = layout.shard
    if sh is None or sh.split != "heads":
        return 0, heads
    assert sh.heads_total is not None  # regions.Shard: a heads split names its total
    per = sh.heads_total // sh.tp_size
    return sh.rank * per, (sh.rank + 1) * per


def verify(
    src: dict[str, BufferLayout],
    src_regions: dict[str, np.ndarray],
    dst: dict[str, BufferLayout],
    dst_regions: dict[str, np.ndarray],
    src_pages: list[int],
    dst_pages: list[int],
    whole_pages: bool,
) -> tuple[int, int]:
    """(bytes equal where content was due, bytes changed where none was due) on the receiving
    side. `whole_pages`: a pool-level plan also moves each page's padding up to the stride."""
    equal_bytes = 0
    stray_bytes = 0
    for name, d in dst.items():
        s = src[name]
        got = dst_regions[name]
        index = np.arange(d.region_bytes, dtype=np.int64)
        covered = np.zeros(d.region_bytes, dtype=bool)
        for ssec, didx in zip(sections(s, src_regions[name]), sections(d, index)):
            a, b = _tokens(ssec, src_pages), _tokens(didx, dst_pages)
            slo, shi = _window(s, a.shape[2])
            dlo, dhi = _window(d, b.shape[2])
            lo, hi = max(slo, dlo), min(shi, dhi)
            if hi <= lo:
                continue
            want = a[:, :, lo - slo : hi - slo]
            where = b[:, :, lo - dlo : hi - dlo]
            equal_bytes += int(np.count_nonzero(got[where] == want))
            covered[where.ravel()] = True
        if whole_pages:
            for layer in range(d.layers):
                for p in dst_pages:
                    off = d.page_offset_bytes(layer, p)
                    covered[off : off + d.page_stride_bytes] = True
        stray_bytes += int(np.count_nonzero(got[~covered]))
    return equal_bytes, stray_bytes
