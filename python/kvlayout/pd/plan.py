"""Transfer plans between two ranks' pools, built from their geometries only.

A plan is, per buffer, a list of byte runs `(src_offset_bytes, dst_offset_bytes, length_bytes)`
inside the two sides' regions of that buffer. Nothing here knows a model: every offset comes
from `regions.BufferLayout`, i.e. from the geometry JSON each side published.

- `pages` plan (pool-level compatible: equal page size, stride, sections, arrangement): whole
  page strides, page `src_pages[i]` -> `dst_pages[i]` in every layer; runs of consecutive pages
  merge into one run per layer ("page runs per layer").
- `tokens` plan (token-level compatible: page sizes differ, or heads split differently across
  tensor-parallel ranks): the source pages form one token stream, cut into the destination's
  pages; per token, layer and section the run holds the heads both ranks share
  (`shard.rank * heads_total / tp_size` ...). Adjacent runs merge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .regions import BufferLayout, LayoutError


@dataclass
class Plan:
    level: str  # "pool" (whole pages) | "token" (token runs, head slices)
    runs: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)
    # per buffer: the global heads [lo, hi) moved, for heads-split buffers
    head_ranges: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def bytes_total(self) -> int:
        return sum(length for runs in self.runs.values() for _, _, length in runs)

    @property
    def run_count(self) -> int:
        return sum(len(r) for r in self.runs.values())


def _merge(runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for src, dst, length in runs:
        if out and out[-1][0] + out[-1][2] == src and out[-1][1] + out[-1][2] == dst:
            s, d, n = out[-1]
            out[-1] = (s, d, n + length)
        else:
            out.append((src, dst, length))
    return out


def _check_pages(side: str, layout: BufferLayout, pages: list[int]) -> None:
    for p in pages:
        if not 0 <= p < layout.pages:
            raise LayoutError(f"{side} page {p} of {layout.name} outside 0..{layout.pages}")
    if side == "destination" and len(set(pages)) != len(pages):
        raise LayoutError(f"destination pages of {layout.name} repeat a page: {pages}")


def _head_window(layout: BufferLayout) -> tuple[int, int] | None:
    """Global heads `[lo, hi)` this rank holds, or None when the buffer is not heads-split."""
    shard = layout.shard
    if shard is None or shard.split != "heads":
        return None
    if shard.heads_total is None:
        raise LayoutError(f"{layout.name}.shard.heads_total: missing for split heads")
    if shard.heads_total % shard.tp_size:
        raise LayoutError(
            f"{layout.name}.shard: heads_total {shard.heads_total} does not divide by "
            f"tp_size {shard.tp_size}"
        )
    per_rank = shard.heads_total // shard.tp_size
    for sec in layout.sections:
        if sec.shape[0] != per_rank:
            raise LayoutError(
                f"{layout.name}.{sec.name}.shape[0]: {sec.shape[0]} heads, shard implies "
                f"{shard.heads_total} / {shard.tp_size} = {per_rank}"
            )
    return shard.rank * per_rank, (shard.rank + 1) * per_rank


def _pair(src: dict[str, BufferLayout], dst: dict[str, BufferLayout]):
    if set(src) != set(dst):
        raise LayoutError(f"buffers: source {sorted(src)}, destination {sorted(dst)}")
    for name, d in dst.items():
        s = src[name]
        if s.layers != d.layers:
            raise LayoutError(f"{name}.layers: source {s.layers}, destination {d.layers}")
        yield name, s, d


def page_plan(
    src: dict[str, BufferLayout],
    dst: dict[str, BufferLayout],
    src_pages: list[int],
    dst_pages: list[int],
) -> Plan:
    """Whole pages; for pools the `pool` level found compatible. `LayoutError` naming the
    buffer and both values when the page lists differ in length, a page is out of range, a
    destination page repeats, or the buffer sets, layer counts or page strides differ."""
    if len(src_pages) != len(dst_pages):
        raise LayoutError(f"page lists: {len(src_pages)} source, {len(dst_pages)} destination")
    plan = Plan(level="pool")
    for name, s, d in _pair(src, dst):
        if s.page_stride_bytes != d.page_stride_bytes:
            raise LayoutError(
                f"{name}.page_stride_bytes: source {s.page_stride_bytes}, "
                f"destination {d.page_stride_bytes}"
            )
        _check_pages("source", s, src_pages)
        _check_pages("destination", d, dst_pages)
        runs = [
            (s.page_offset_bytes(layer, sp), d.page_offset_bytes(layer, dp), s.page_stride_bytes)
            for layer in range(s.layers)
            for sp, dp in zip(src_pages, dst_pages)
        ]
        plan.runs[name] = _merge(runs)
    return plan


def token_plan(
    src: dict[str, BufferLayout],
    dst: dict[str, BufferLayout],
    src_pages: list[int],
    dst_pages: list[int],
) -> Plan:
    """Token runs with head slices; for pools the `token` level found compatible. `LayoutError`
    naming the buffer and both values when the two page lists hold different token counts, a
    page is out of range, a destination page repeats, the buffer sets, layer or section counts
    differ, a shard is inconsistent, or a head run differs in bytes between the sides."""
    plan = Plan(level="token")
    for name, s, d in _pair(src, dst):
        _check_pages("source", s, src_pages)
        _check_pages("destination", d, dst_pages)
        tokens = len(src_pages) * s.page_size_tokens
        if tokens != len(dst_pages) * d.page_size_tokens:
            raise LayoutError(
                f"{name}: {len(src_pages)} source pages x {s.page_size_tokens} tokens != "
                f"{len(dst_pages)} destination pages x {d.page_size_tokens} tokens"
            )
        if len(s.sections) != len(d.sections):
            raise LayoutError(
                f"{name}.sections.count: source {len(s.sections)}, destination {len(d.sections)}"
            )
        sw, dw = _head_window(s), _head_window(d)
        if (sw is None) != (dw is None):
            raise LayoutError(f"{name}.shard.split: heads on one side only")
        if sw is None or dw is None:
            lo = hi = None
        else:
            lo, hi = max(sw[0], dw[0]), min(sw[1], dw[1])
            plan.head_ranges[name] = (lo, max(lo, hi))
            if hi <= lo:  # this source rank holds none of the destination's heads
                plan.runs[name] = []
                continue
        runs = []
        for layer in range(s.layers):
            for i in range(tokens):
                sp, st = src_pages[i // s.page_size_tokens], i % s.page_size_tokens
                dp, dt = dst_pages[i // d.page_size_tokens], i % d.page_size_tokens
                s_base, d_base = s.page_offset_bytes(layer, sp), d.page_offset_bytes(layer, dp)
                for k, (ssec, dsec) in enumerate(zip(s.sections, d.sections)):
                    if sw is None or dw is None or lo is None or hi is None:
                        s_rng = (0, s.heads_local(ssec))
                        d_rng = (0, d.heads_local(dsec))
                    else:
                        s_rng = (lo - sw[0], hi - sw[0])
                        d_rng = (lo - dw[0], hi - dw[0])
                    s_runs = s.piece_runs(st, k, *s_rng)
                    d_runs = d.piece_runs(dt, k, *d_rng)
                    for (so, sn), (do, dn) in zip(s_runs, d_runs):
                        if sn != dn:
                            raise LayoutError(
                                f"{name}.{ssec.name}: {sn} bytes per head run at the source, "
                                f"{dn} at the destination"
                            )
                        runs.append((s_base + so, d_base + do, sn))
        plan.runs[name] = _merge(runs)
    return plan
