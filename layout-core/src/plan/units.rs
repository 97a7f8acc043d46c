//! The units of a buffer pair: for each section, the slice of heads both sides hold, with where
//! it starts on each side at row 0 of a page and how far one row is from the next.
//!
//! A section's heads are one unit when neither side stores them apart; one unit per head when
//! either side does (`head_major` with a head axis, or a memory layout that splits pages:
//! `page_head`, `page_head_token`, `layer_head`, `page_unified`). Units that
//! continue each other on both sides with equal row steps merge (a `token_major` row moved
//! whole is one unit). Offsets inside a page come from [`crate::TokenLayout::offset_bytes`]:
//! the arrangement's arithmetic is not written again here.

use std::ops::Range;

use super::{Pair, PlanError, PlanSide, head_window, rows_per_page};
use crate::geometry::{PoolGeometry, layout_error};
use crate::layout::Arrangement;
use crate::regions::Placement;

/// Where a unit sits on one side, from the start of a page of a layer ([`crate::Placement`] at
/// piece 0): `offset_bytes` at row 0 (under a layout that splits pages, the head's piece
/// included), plus
/// `row_step_bytes` per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct UnitSide {
    pub(super) offset_bytes: u64,
    pub(super) row_step_bytes: u64,
}

/// `len_bytes` bytes per row, from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Unit {
    pub(super) src: UnitSide,
    pub(super) dst: UnitSide,
    pub(super) len_bytes: u64,
}

/// The units of a pair, and the global heads moved (see [`super::BufferPlan::heads`]).
pub(super) struct Units {
    pub(super) heads: Option<Range<u64>>,
    pub(super) units: Vec<Unit>,
}

/// One side of one section, as the planner sees it.
struct SectionSide<'a> {
    pool: &'a PoolGeometry,
    b: usize,
    section: usize,
    /// Heads this rank holds of the section: the first shape entry under a heads split, else
    /// the section's heads ([`crate::Section::heads`]).
    heads: u64,
    bytes: u64,
    /// Whether the side stores the section's heads apart.
    heads_apart: bool,
}

impl<'a> SectionSide<'a> {
    fn new(
        pool: &'a PoolGeometry,
        b: usize,
        section: usize,
        side: PlanSide,
    ) -> Result<Self, PlanError> {
        let buf = &pool.buffers[b];
        let geometry = |e| PlanError::Geometry {
            side,
            error: layout_error(b, buf, e),
        };
        let s = buf.layout.section(section).map_err(geometry)?;
        let split = buf.shard.and_then(|s| s.heads_total()).is_some();
        let heads = match split {
            true => s.shape().first().copied().unwrap_or(1),
            false => s.heads(),
        };
        let heads_apart = pool.memory_layout.splits_pages()
            || (buf.layout.arrangement == Arrangement::HeadMajor && s.heads() > 1);
        Ok(SectionSide {
            pool,
            b,
            section,
            heads,
            bytes: buf.layout.section_bytes(section).map_err(geometry)?,
            heads_apart,
        })
    }

    fn name(&self) -> &str {
        self.pool.buffers[self.b].layout.sections()[self.section].name()
    }

    /// Where local heads `[h0, h0 + count)` sit: one [`UnitSide`] when `apart` is false, else
    /// one per head.
    fn place(
        &self,
        placement: &Placement,
        h0: u64,
        count: u64,
        apart: bool,
        side: PlanSide,
    ) -> Result<Vec<UnitSide>, PlanError> {
        let buf = &self.pool.buffers[self.b];
        let layout = &buf.layout;
        let rows = rows_per_page(self.pool, self.b);
        let head_bytes = self.bytes / self.heads.max(1);
        let err = |e| PlanError::Geometry {
            side,
            error: layout_error(self.b, buf, e),
        };
        let at = |row: u64, run: u64| {
            layout
                .offset_bytes(self.section, row, run, rows)
                .map_err(err)
        };
        let step = |run: u64| -> Result<u64, PlanError> {
            Ok(if rows > 1 {
                at(1, run)? - at(0, run)?
            } else {
                0
            })
        };
        if self.pool.memory_layout.splits_pages() {
            // [row][piece row] inside a piece (a head, or a group of `per_piece` heads): a piece
            // row is every section's part of the piece's heads, in section order.
            let (_, per_piece) = self
                .pool
                .page_pieces(self.b)
                .map_err(|error| PlanError::Geometry { side, error })?;
            let mut prefix = 0u64;
            for i in 0..self.section {
                prefix += layout.section_bytes(i).map_err(err)? / self.heads * per_piece;
            }
            // The piece row, or under page_head_token every layer's head row.
            let row = placement.run_step_bytes;
            return (h0..h0 + count)
                .map(|h| {
                    let piece = (h / per_piece)
                        .checked_mul(placement.head_step_bytes)
                        .and_then(|x| x.checked_add(prefix))
                        .and_then(|x| x.checked_add((h % per_piece) * head_bytes));
                    Ok(UnitSide {
                        offset_bytes: piece
                            .ok_or_else(|| PlanError::overflow(buf.name(), "head offset"))?,
                        row_step_bytes: row,
                    })
                })
                .collect();
        }
        if self.heads_apart {
            return (h0..h0 + count)
                .map(|h| {
                    Ok(UnitSide {
                        offset_bytes: at(0, h)?,
                        row_step_bytes: step(h)?,
                    })
                })
                .collect();
        }
        let (start, row_step) = (at(0, 0)?, step(0)?);
        let one = |h: u64| UnitSide {
            offset_bytes: start + h * head_bytes,
            row_step_bytes: row_step,
        };
        Ok(match apart {
            true => (h0..h0 + count).map(one).collect(),
            false => vec![one(h0)],
        })
    }
}

/// The units of `pair`, in source order, merged.
pub(super) fn units(
    src: &PoolGeometry,
    dst: &PoolGeometry,
    pair: &Pair,
) -> Result<Units, PlanError> {
    let (sw, dw) = (
        head_window(src, pair.src_index),
        head_window(dst, pair.dst_index),
    );
    let window = match (&sw, &dw) {
        (None, None) => None,
        (Some(s), Some(d)) => Some(s.start.max(d.start)..s.end.min(d.end)),
        _ => {
            let split = |pool: &PoolGeometry, b: usize| match pool.buffers[b].shard {
                Some(s) => s.to_string(),
                None => "unsharded".to_string(),
            };
            return Err(PlanError::SplitOneSide {
                buffer: pair.name.clone(),
                src: split(src, pair.src_index),
                dst: split(dst, pair.dst_index),
            });
        }
    };
    if let Some(w) = &window
        && w.end <= w.start
    {
        return Ok(Units {
            heads: Some(w.start..w.start),
            units: Vec::new(),
        });
    }
    let sections = src.buffers[pair.src_index].layout.sections().len();
    let mut out: Vec<Unit> = Vec::new();
    for k in 0..sections {
        let s = SectionSide::new(src, pair.src_index, k, PlanSide::Source)?;
        let d = SectionSide::new(dst, pair.dst_index, k, PlanSide::Destination)?;
        section_units((src, dst), pair, (&s, &d), (&sw, &dw, &window), &mut out)?;
    }
    out.sort_by_key(|u| u.src.offset_bytes);
    Ok(Units {
        heads: window,
        units: merged(out),
    })
}

/// Slices `(source local head, destination local head, count)` of a section both sides hold:
/// one for the buffer's head window, or one per group of a `split_groups` section (v3: rank `r`
/// of `N` holds entries `[r * G / N, (r + 1) * G / N)` of each group `G`, groups one after
/// another); with no heads split, every head.
fn slices(
    src: &PoolGeometry,
    dst: &PoolGeometry,
    pair: &Pair,
    s: &SectionSide<'_>,
    windows: (&Range<u64>, &Range<u64>, &Range<u64>),
) -> Vec<(u64, u64, u64)> {
    let (w, sw, dw) = windows;
    let groups = src.buffers[pair.src_index].layout.sections()[s.section].split_groups();
    let (Some(groups), Some(ss), Some(ds)) = (
        groups,
        src.buffers[pair.src_index].shard,
        dst.buffers[pair.dst_index].shard,
    ) else {
        return vec![(w.start - sw.start, w.start - dw.start, w.end - w.start)];
    };
    let mut out = Vec::with_capacity(groups.len());
    let (mut s_before, mut d_before) = (0u64, 0u64);
    for &g in groups {
        let (s_per, d_per) = (g / ss.tp_size, g / ds.tp_size);
        let (s_lo, d_lo) = (ss.rank * s_per, ds.rank * d_per);
        let (lo, hi) = (s_lo.max(d_lo), (s_lo + s_per).min(d_lo + d_per));
        if hi > lo {
            out.push((s_before + lo - s_lo, d_before + lo - d_lo, hi - lo));
        }
        (s_before, d_before) = (s_before + s_per, d_before + d_per);
    }
    out
}

/// The source's head window, the destination's, and their overlap.
type Windows<'a> = (
    &'a Option<Range<u64>>,
    &'a Option<Range<u64>>,
    &'a Option<Range<u64>>,
);

fn section_units(
    (src, dst): (&PoolGeometry, &PoolGeometry),
    pair: &Pair,
    (s, d): (&SectionSide<'_>, &SectionSide<'_>),
    (sw, dw, window): Windows<'_>,
    out: &mut Vec<Unit>,
) -> Result<(), PlanError> {
    let slices = match (window, sw, dw) {
        (Some(w), Some(sw), Some(dw)) => slices(src, dst, pair, s, (w, sw, dw)),
        _ => vec![(0, 0, s.heads)],
    };
    let apart = s.heads_apart || d.heads_apart;
    let whole = window.is_none() && !apart;
    if whole {
        if s.bytes != d.bytes {
            return Err(bytes_differ(pair, s, "token", s.bytes, d.bytes));
        }
    } else {
        if window.is_none() && s.heads != d.heads {
            return Err(PlanError::HeadCount {
                buffer: pair.name.clone(),
                section: s.name().to_string(),
                src_heads: s.heads,
                dst_heads: d.heads,
            });
        }
        let (sh, dh) = (s.bytes / s.heads.max(1), d.bytes / d.heads.max(1));
        if sh != dh
            || !s.bytes.is_multiple_of(s.heads.max(1))
            || !d.bytes.is_multiple_of(d.heads.max(1))
        {
            return Err(bytes_differ(pair, s, "head", sh, dh));
        }
    }
    for (s0, d0, count) in slices {
        let len = match (whole, apart) {
            (true, _) => s.bytes,
            (false, true) => s.bytes / s.heads,
            (false, false) => count * (s.bytes / s.heads),
        };
        let src_units = s.place(&pair.src, s0, count, apart, PlanSide::Source)?;
        let dst_units = d.place(&pair.dst, d0, count, apart, PlanSide::Destination)?;
        out.extend(src_units.into_iter().zip(dst_units).map(|(src, dst)| Unit {
            src,
            dst,
            len_bytes: len,
        }));
    }
    Ok(())
}

fn bytes_differ(
    pair: &Pair,
    s: &SectionSide<'_>,
    what: &'static str,
    src: u64,
    dst: u64,
) -> PlanError {
    PlanError::SectionBytes {
        buffer: pair.name.clone(),
        section: s.name().to_string(),
        what,
        src_bytes: src,
        dst_bytes: dst,
    }
}

/// Merges each unit into the previous one when it continues it on both sides with the same
/// row steps (then it continues it at every row).
fn merged(units: Vec<Unit>) -> Vec<Unit> {
    let mut out: Vec<Unit> = Vec::with_capacity(units.len());
    for u in units {
        if let Some(last) = out.last_mut()
            && last.src.row_step_bytes == u.src.row_step_bytes
            && last.dst.row_step_bytes == u.dst.row_step_bytes
            && last.src.offset_bytes + last.len_bytes == u.src.offset_bytes
            && last.dst.offset_bytes + last.len_bytes == u.dst.offset_bytes
        {
            last.len_bytes += u.len_bytes;
            continue;
        }
        out.push(u);
    }
    out
}
