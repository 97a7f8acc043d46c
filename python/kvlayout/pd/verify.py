"""Receiving-side verification, written as numpy reshapes: a second formulation of the
arrangements, independent of the core's planner (`kvlayout.token_plan` / `page_plan`).

Where a page of a layer sits comes from the core (`Geometry.regions()`: each buffer's offset,
page, layer and head steps, and its section sizes); what is inside a page is read here by
reshaping, per arrangement, as the geometry-file contract reads it: `token_major` = `[tokens,
row]` then columns; `section_major` = one `[tokens, section]` block per section; `head_major` =
one `[heads, tokens, head_bytes]` block per section; `planes` = one `[tokens, group_row]` block
per group; under the `page_head` memory layout a page of a layer is `[heads, tokens, head_row]`
(a head row = every section's part of that head). The source pattern is regenerated from the
seed the prefill side used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import kvlayout


@dataclass(frozen=True)
class Buffer:
    """One buffer of one side: its file form (`Geometry.buffers`) and its placement in region
    `region` (`Geometry.regions()`)."""

    region: str
    file: dict[str, Any]
    place: dict[str, Any]


def buffers(geometry: kvlayout.Geometry) -> dict[str, Buffer]:
    """Every buffer of `geometry`, by name, in buffer order."""
    files = {b["name"]: b for b in geometry.buffers}
    out = {}
    for region in geometry.regions():
        for place in region["buffers"]:
            out[place["name"]] = Buffer(region["name"], files[place["name"]], place)
    return {name: out[name] for name in files}


def pattern(len_bytes: int, seed: int, region_index: int) -> np.ndarray:
    """The bytes the prefill side writes into a region before publishing."""
    rng = np.random.default_rng([seed, region_index])
    return rng.integers(0, 256, size=len_bytes, dtype=np.uint8)


def patterns(geometry: kvlayout.Geometry, seed: int) -> dict[str, np.ndarray]:
    """`{region name: pattern}` for every region of `geometry`."""
    return {
        r["name"]: pattern(r["len_bytes"], seed, i) for i, r in enumerate(geometry.regions())
    }


def _strided(region: np.ndarray, start: int, shape: tuple, steps: tuple) -> np.ndarray:
    it = region.itemsize
    return np.lib.stride_tricks.as_strided(
        region[start:], shape=shape, strides=tuple(s * it for s in steps), writeable=False
    )


def _laid_heads(shape: list[int]) -> int:
    """Heads a `head_major` block holds one after another: the leading entry of a shape of two
    or more entries, else 1 (written again here, not taken from the core)."""
    return shape[0] if len(shape) >= 2 else 1


def _held_heads(buf: Buffer, shape: list[int]) -> int:
    """Heads a token's section is cut into: this rank's heads (the leading entry) when the buffer
    is split by heads, else the laid-out heads."""
    sh = buf.file.get("shard")
    return shape[0] if sh is not None and sh["split"] == "heads" else _laid_heads(shape)


def sections(buf: Buffer, region: np.ndarray) -> list[np.ndarray]:
    """Per section `[layers, pages, tokens, heads, head_bytes]`, views into `region`."""
    p = buf.place
    # Rows per page: one row per compress_ratio tokens (geometry v3; written again here from
    # the file's field, not taken from the core's rows_per_page).
    L, N = p["layers"], p["pages"]
    T = p["page_size_tokens"] // buf.file.get("compress_ratio", 1)
    sizes = p["section_bytes_per_token"]
    shapes = [s["shape"] for s in buf.file["sections"]]
    if p["heads"] > 1:  # page_head: [heads][tokens][head row] per page of a layer
        H = p["heads"]
        parts = [s // H for s in sizes]
        row = sum(parts)
        head_steps = (p["layer_step_bytes"], p["page_step_bytes"], p["head_step_bytes"], row, 1)
        v = _strided(region, p["offset_bytes"], (L, N, H, T, row), head_steps)
        out, col = [], 0
        for part in parts:
            out.append(v[..., col : col + part].transpose(0, 1, 3, 2, 4))
            col += part
        return out
    payload = T * sum(sizes)
    steps = (p["layer_step_bytes"], p["page_step_bytes"], 1)
    pages = _strided(region, p["offset_bytes"], (L, N, payload), steps)
    arr = buf.file["arrangement"]
    names = [s["name"] for s in buf.file["sections"]]
    if arr == "token_major":
        groups = [list(range(len(sizes)))]
    elif arr in ("section_major", "head_major"):
        groups = [[i] for i in range(len(sizes))]
    else:  # the planes form
        groups = [[names.index(n) for n in g] for g in arr["planes"]]
    out_by: list[np.ndarray | None] = [None] * len(sizes)
    start = 0
    for group in groups:
        row = sum(sizes[i] for i in group)
        block = pages[:, :, start : start + T * row]
        start += T * row
        if arr == "head_major":
            i = group[0]
            laid, h = _laid_heads(shapes[i]), _held_heads(buf, shapes[i])
            by_token = block.reshape(L, N, laid, T, row // laid).transpose(0, 1, 3, 2, 4)
            out_by[i] = by_token.reshape(L, N, T, h, row // h)
            continue
        rows = block.reshape(L, N, T, row)
        col = 0
        for i in group:
            h = _held_heads(buf, shapes[i])
            out_by[i] = rows[:, :, :, col : col + sizes[i]].reshape(L, N, T, h, sizes[i] // h)
            col += sizes[i]
    return [s for s in out_by if s is not None]


def _tokens(sec: np.ndarray, pages: list[int]) -> np.ndarray:
    """`[layers, len(pages) * tokens, heads, head_bytes]`: the listed pages as one token stream."""
    s = sec[:, pages]
    return s.reshape(s.shape[0], s.shape[1] * s.shape[2], s.shape[3], s.shape[4])


def _held(buf: Buffer, section: dict[str, Any], heads: int) -> np.ndarray:
    """The whole model's index of each head (channel) this side holds of `section`, in local
    order: every head when not split; rank `r` of `N` holds `[r * H / N, (r + 1) * H / N)`;
    with heads replicated over ranks (`heads_total` < N) the one head `r / (N / H)`; with
    `split_groups`, `[r * G / N, (r + 1) * G / N)` of each group `G`, groups one after another."""
    sh = buf.file.get("shard")
    if sh is None or sh["split"] != "heads":
        return np.arange(heads)
    n, r, total = sh["tp_size"], sh["rank"], sh["heads_total"]
    groups = section.get("split_groups")
    if groups:
        parts, base = [], 0
        for g in groups:
            parts.append(base + r * (g // n) + np.arange(g // n))
            base += g
        return np.concatenate(parts)
    if total < n:
        return np.array([r // (n // total)])
    return r * (total // n) + np.arange(total // n)

def verify(
    src: kvlayout.Geometry,
    src_regions: dict[str, np.ndarray],
    dst: kvlayout.Geometry,
    dst_regions: dict[str, np.ndarray],
    src_pages: list[int],
    dst_pages: list[int],
    whole_pages: bool,
) -> tuple[int, int]:
    """(bytes equal where content was due, bytes changed where none was due) on the receiving
    side; regions keyed by region name. `whole_pages`: a pool-level plan also moves each page's
    padding up to the stride."""
    equal_bytes = 0
    covered = {n: np.zeros(a.size, dtype=bool) for n, a in dst_regions.items()}
    s_bufs = buffers(src)
    for name, d in buffers(dst).items():
        s = s_bufs[name]
        got = dst_regions[d.region]
        index = np.arange(got.size, dtype=np.int64)
        secs = zip(s.file["sections"], sections(s, src_regions[s.region]), sections(d, index))
        for sec, ssec, didx in secs:
            a, b = _tokens(ssec, src_pages), _tokens(didx, dst_pages)
            s_held, d_held = _held(s, sec, a.shape[2]), _held(d, sec, b.shape[2])
            common = np.intersect1d(s_held, d_held)
            if common.size == 0:
                continue
            want = a[:, :, np.searchsorted(s_held, common)]
            where = b[:, :, np.searchsorted(d_held, common)]
            equal_bytes += int(np.count_nonzero(got[where] == want))
            covered[d.region][where.ravel()] = True
        if whole_pages:
            p = d.place
            for layer in range(p["layers"]):
                for page in dst_pages:
                    for head in range(p["heads"]):
                        off = (
                            p["offset_bytes"]
                            + page * p["page_step_bytes"]
                            + layer * p["layer_step_bytes"]
                            + head * p["head_step_bytes"]
                        )
                        covered[d.region][off : off + p["run_bytes"]] = True
    stray_bytes = sum(
        int(np.count_nonzero(got[~covered[n]])) for n, got in dst_regions.items()
    )
    return equal_bytes, stray_bytes
