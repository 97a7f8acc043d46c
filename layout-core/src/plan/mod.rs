//! Transfer plans between two pools (prefill -> decode, one rank to another): which bytes of
//! the source's regions go where in the destination's, as maximal runs.
//!
//! - [`page_plan`]: pools compatible at the `pool` level (same token layouts and page sizes,
//!   any memory layouts): page `src_pages[i]` -> `dst_pages[i]` in every layer, each page of a
//!   layer one run of its stored bytes (its heads or head groups under `page_head`,
//!   `layer_head`, `page_unified`).
//! - [`token_plan`]: pools compatible at the `token` level (page sizes, tensor-parallel head
//!   splits and memory layouts may differ): the source pages form one token stream, cut into
//!   the destination's pages; per layer and section the run holds the heads both ranks have
//!   (rank `r` of `N` holds heads `[r * H / N, (r + 1) * H / N)` of a heads split).
//!
//! Runs are computed once per buffer pair as units (a section's head slice, with its byte
//! offset at token 0 and its distance between tokens, taken from
//! [`crate::TokenLayout::offset_bytes`] and [`crate::Placement`]); a stretch of tokens inside
//! one source page and one destination page is one run per unit when the unit fills its token
//! rows on both sides, and adjacent runs merge. A DeepSeek-V3.2 page (61 layers, 64 tokens,
//! index-K `[64 x 128 B][64 x 4 B]`) planned TP 1 -> TP 2 is 61 runs per buffer, not one per
//! token and section (7,808).
//!
//! Geometry v3: the stream's unit is a row ([`rows_per_page`]: one per token, one per
//! `compress_ratio` tokens); a rank's heads are [`head_window`] (one head `r / replicas` when
//! heads are replicated over ranks); a `split_groups` section is moved group by group (each
//! group's slice, the private `units` module). A pool of `state` buffers alone is planned with
//! its pages read as request slots; a `state` buffer beside token pages is refused by name.

mod error;
mod runs;
mod units;

use std::ops::Range;

pub use error::{PlanError, PlanSide};

use crate::buffer::Attention;
use crate::diff::compare_at;
use crate::geometry::PoolGeometry;
use crate::level::Level;
use crate::regions::Placement;
use runs::RunList;
use units::{Unit, Units, units};

/// `len_bytes` bytes at `src_offset_bytes` in the source buffer's region go to
/// `dst_offset_bytes` in the destination buffer's region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Run {
    /// Offset inside the source region.
    pub src_offset_bytes: u64,
    /// Offset inside the destination region.
    pub dst_offset_bytes: u64,
    /// Bytes moved.
    pub len_bytes: u64,
}

/// The runs of one buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BufferPlan {
    /// The buffer's name (the same on both sides).
    pub buffer: String,
    /// Index of the source region ([`PoolGeometry::regions`]) the source offsets are in.
    pub src_region: usize,
    /// Index of the destination region the destination offsets are in.
    pub dst_region: usize,
    /// Global heads `[lo, hi)` moved, for a buffer split by heads on both sides (empty when
    /// this source rank holds none of the destination's heads); `None` otherwise.
    pub heads: Option<Range<u64>>,
    /// Maximal runs, in plan order.
    pub runs: Vec<Run>,
}

/// A transfer plan: the level it was built for and the runs of each buffer, in the
/// destination's buffer order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    /// [`Level::Pool`] (whole pages) or [`Level::Token`].
    pub level: Level,
    /// One entry per buffer.
    pub buffers: Vec<BufferPlan>,
}

impl Plan {
    /// Bytes moved over every buffer.
    pub fn bytes_total(&self) -> u64 {
        self.runs().map(|r| r.len_bytes).sum()
    }

    /// Runs over every buffer.
    pub fn run_count(&self) -> usize {
        self.buffers.iter().map(|b| b.runs.len()).sum()
    }

    /// Every run, buffer after buffer.
    pub fn runs(&self) -> impl Iterator<Item = &Run> {
        self.buffers.iter().flat_map(|b| b.runs.iter())
    }
}

/// Rows a page of buffer `b` holds: one per token, one per `compress_ratio` tokens (v3), one
/// slot for a `state` buffer ([`crate::BufferGeometry::rows_per_page`]).
pub fn rows_per_page(pool: &PoolGeometry, b: usize) -> u64 {
    pool.buffers[b].rows_per_page(pool.page_size_tokens)
}

/// Global heads `[lo, hi)` buffer `b` holds, or `None` when it is not split by heads: rank
/// `r` of `N` holds `[r * H / N, (r + 1) * H / N)`, or the one head `r / replicas` when heads
/// are replicated over ranks (v3; [`crate::Shard::heads_held`]).
pub fn head_window(pool: &PoolGeometry, b: usize) -> Option<Range<u64>> {
    let (lo, hi) = pool.buffers[b].shard?.heads_held()?;
    Some(lo..hi)
}

/// Whole pages: `src_pages[i]` -> `dst_pages[i]` in every layer of every buffer, for pools
/// compatible at the `pool` level (any memory layouts).
///
/// # Errors
/// A geometry that breaks a rule ([`PlanError::Geometry`]); pools incompatible at the `pool`
/// level ([`PlanError::Incompatible`], the diff lines); page lists of different lengths, a
/// page out of range, a destination page listed twice; a `state` buffer beside buffers with a
/// token axis (a pool of `state` buffers alone is planned, its pages being request slots).
pub fn page_plan(
    src: &PoolGeometry,
    dst: &PoolGeometry,
    src_pages: &[u64],
    dst_pages: &[u64],
) -> Result<Plan, PlanError> {
    let pairs = prepare(src, dst, src_pages, dst_pages, Level::Pool)?;
    if src_pages.len() != dst_pages.len() {
        return Err(PlanError::PageCount {
            src_pages: src_pages.len(),
            dst_pages: dst_pages.len(),
        });
    }
    let mut out = Plan {
        level: Level::Pool,
        buffers: Vec::with_capacity(pairs.len()),
    };
    for pair in pairs {
        let pieced = src.memory_layout.splits_pages() || dst.memory_layout.splits_pages();
        let runs = if !pieced {
            whole_pages(&pair, src_pages, dst_pages)?
        } else {
            // `page_head`, `layer_head` and `page_unified` store a page of a layer as pieces
            // (heads or head groups) in their own row order, even when there is one piece.
            let rows = rows_per_page(src, pair.src_index);
            stream(src, dst, &pair, src_pages, dst_pages, rows, rows)?.runs
        };
        out.buffers.push(BufferPlan {
            buffer: pair.name,
            src_region: pair.src.region,
            dst_region: pair.dst.region,
            heads: None,
            runs,
        });
    }
    Ok(out)
}

/// Token runs with head slices, for pools compatible at the `token` level: the source pages
/// are one stream of rows, cut into the destination's pages (so the two lists may differ in
/// length: 2 source pages of 32 tokens fill 1 destination page of 64).
///
/// # Errors
/// As [`page_plan`] at the `token` level, and: the two lists holding different token counts
/// for a buffer ([`PlanError::TokenCount`]); a section whose bytes per head (or per token, or
/// whose head count) differ between the sides.
pub fn token_plan(
    src: &PoolGeometry,
    dst: &PoolGeometry,
    src_pages: &[u64],
    dst_pages: &[u64],
) -> Result<Plan, PlanError> {
    let pairs = prepare(src, dst, src_pages, dst_pages, Level::Token)?;
    let mut out = Plan {
        level: Level::Token,
        buffers: Vec::with_capacity(pairs.len()),
    };
    for pair in pairs {
        let src_rows = rows_per_page(src, pair.src_index);
        let dst_rows = rows_per_page(dst, pair.dst_index);
        let counted = |pages: &[u64], rows: u64| (pages.len() as u64).checked_mul(rows);
        let (sn, dn) = (counted(src_pages, src_rows), counted(dst_pages, dst_rows));
        if sn.is_none() || sn != dn {
            return Err(PlanError::TokenCount {
                buffer: pair.name,
                src_pages: src_pages.len(),
                src_page_rows: src_rows,
                dst_pages: dst_pages.len(),
                dst_page_rows: dst_rows,
                tokens_per_row: src.buffers[pair.src_index].compress_ratio,
            });
        }
        let planned = stream(src, dst, &pair, src_pages, dst_pages, src_rows, dst_rows)?;
        out.buffers.push(BufferPlan {
            buffer: pair.name,
            src_region: pair.src.region,
            dst_region: pair.dst.region,
            heads: planned.heads,
            runs: planned.runs,
        });
    }
    Ok(out)
}

/// One buffer on both sides.
struct Pair {
    name: String,
    src_index: usize,
    dst_index: usize,
    src: Placement,
    dst: Placement,
}

/// Validates both pools, compares them at `level`, checks the page lists, and pairs the buffers
/// by name in the destination's order.
fn prepare(
    src: &PoolGeometry,
    dst: &PoolGeometry,
    src_pages: &[u64],
    dst_pages: &[u64],
    level: Level,
) -> Result<Vec<Pair>, PlanError> {
    for (side, pool) in [(PlanSide::Source, src), (PlanSide::Destination, dst)] {
        pool.validate()
            .map_err(|error| PlanError::Geometry { side, error })?;
    }
    compare_at(src, dst, level).map_err(|m| PlanError::Incompatible {
        level,
        lines: m.lines(),
    })?;
    check_pages(PlanSide::Source, src_pages, src.pages)?;
    check_pages(PlanSide::Destination, dst_pages, dst.pages)?;
    let mut seen = std::collections::HashMap::with_capacity(dst_pages.len());
    for (i, &p) in dst_pages.iter().enumerate() {
        if let Some(first) = seen.insert(p, i) {
            return Err(PlanError::DuplicateDestination {
                index: i,
                first,
                page: p,
            });
        }
    }
    let all_state = dst.buffers.iter().all(|b| b.attention == Attention::State);
    let mut pairs = Vec::with_capacity(dst.buffers.len());
    for (d, buf) in dst.buffers.iter().enumerate() {
        // Equal buffer sets: `compare_at` refused any difference.
        let Some(s) = src.buffer_index(buf.name()) else {
            unreachable!("compare_at compares the buffer sets")
        };
        // A state buffer's "page" is a request slot: only a pool of state buffers alone is
        // planned (its lists then name slots), never slots beside token pages.
        if buf.attention == Attention::State && !all_state {
            return Err(PlanError::State {
                buffer: buf.name().to_string(),
            });
        }
        let placed = |pool: &PoolGeometry, b: usize, side| {
            pool.placement(b)
                .map_err(|error| PlanError::Geometry { side, error })
        };
        pairs.push(Pair {
            name: buf.name().to_string(),
            src_index: s,
            dst_index: d,
            src: placed(src, s, PlanSide::Source)?,
            dst: placed(dst, d, PlanSide::Destination)?,
        });
    }
    Ok(pairs)
}

fn check_pages(side: PlanSide, pages: &[u64], count: u64) -> Result<(), PlanError> {
    match pages.iter().position(|&p| p >= count) {
        Some(index) => Err(PlanError::PageOutOfRange {
            side,
            index,
            page: pages[index],
            pages: count,
        }),
        None => Ok(()),
    }
}

/// Whole stored pages, one run per page of a layer; pages outermost when the source keeps a
/// page's layers together (`page_first`, `page_first_direct`), so they merge.
fn whole_pages(pair: &Pair, src_pages: &[u64], dst_pages: &[u64]) -> Result<Vec<Run>, PlanError> {
    let (s, d) = (&pair.src, &pair.dst);
    let mut runs = RunList::with_capacity(src_pages.len());
    let mut push = |layer: u64, sp: u64, dp: u64| -> Result<(), PlanError> {
        runs.push(Run {
            src_offset_bytes: offset(s, layer, sp, 0, PlanSide::Source)?,
            dst_offset_bytes: offset(d, layer, dp, 0, PlanSide::Destination)?,
            len_bytes: s.run_bytes,
        })
    };
    if pages_outermost(s) {
        for (&sp, &dp) in src_pages.iter().zip(dst_pages) {
            for layer in 0..s.layers {
                push(layer, sp, dp)?;
            }
        }
    } else {
        for layer in 0..s.layers {
            for (&sp, &dp) in src_pages.iter().zip(dst_pages) {
                push(layer, sp, dp)?;
            }
        }
    }
    Ok(runs.finish())
}

fn pages_outermost(p: &Placement) -> bool {
    p.layer_step_bytes < p.page_step_bytes
}

fn offset(
    p: &Placement,
    layer: u64,
    page: u64,
    head: u64,
    side: PlanSide,
) -> Result<u64, PlanError> {
    p.offset_unchecked_range(layer, page, head)
        .map_err(|error| PlanError::Geometry { side, error })
}

/// What [`stream`] planned for one buffer.
struct Streamed {
    heads: Option<Range<u64>>,
    runs: Vec<Run>,
}

/// The rows of `src_pages` (in order, `src_rows` a page) into the rows of `dst_pages`: for
/// every stretch inside one source and one destination page, and every layer, the units'
/// runs.
fn stream(
    src: &PoolGeometry,
    dst: &PoolGeometry,
    pair: &Pair,
    src_pages: &[u64],
    dst_pages: &[u64],
    src_rows: u64,
    dst_rows: u64,
) -> Result<Streamed, PlanError> {
    let Units { heads, units } = units(src, dst, pair)?;
    let stretches = stretches(src_pages, dst_pages, src_rows, dst_rows);
    let mut runs = RunList::with_capacity(stretches.len() * units.len());
    let mut emit = |layer: u64, st: &Stretch| -> Result<(), PlanError> {
        emit_stretch(pair, &units, layer, st, &mut runs)
    };
    if pages_outermost(&pair.src) {
        for st in &stretches {
            for layer in 0..pair.src.layers {
                emit(layer, st)?;
            }
        }
    } else {
        for layer in 0..pair.src.layers {
            for st in &stretches {
                emit(layer, st)?;
            }
        }
    }
    // `page_head` keeps a head's layers together (`page_unified` a group's, `layer_head` a
    // head's pages), while the loops above go layer by layer.
    let heads_apart = src.memory_layout.splits_pages() || dst.memory_layout.splits_pages();
    Ok(Streamed {
        heads,
        runs: if heads_apart {
            runs.finish_sorted()?
        } else {
            runs.finish()
        },
    })
}

/// `rows` rows starting at row `src_row` of source page `src_page` and `dst_row` of
/// destination page `dst_page`.
struct Stretch {
    src_page: u64,
    src_row: u64,
    dst_page: u64,
    dst_row: u64,
    rows: u64,
}

/// Cuts the two page lists' row streams where either side changes page.
fn stretches(src_pages: &[u64], dst_pages: &[u64], src_rows: u64, dst_rows: u64) -> Vec<Stretch> {
    let mut out = Vec::with_capacity(src_pages.len().max(dst_pages.len()));
    let (mut i, mut j, mut si, mut dj) = (0usize, 0usize, 0u64, 0u64);
    while i < src_pages.len() && j < dst_pages.len() {
        let rows = (src_rows - si).min(dst_rows - dj);
        out.push(Stretch {
            src_page: src_pages[i],
            src_row: si,
            dst_page: dst_pages[j],
            dst_row: dj,
            rows,
        });
        si += rows;
        dj += rows;
        if si == src_rows {
            (i, si) = (i + 1, 0);
        }
        if dj == dst_rows {
            (j, dj) = (j + 1, 0);
        }
    }
    out
}

fn emit_stretch(
    pair: &Pair,
    units: &[Unit],
    layer: u64,
    st: &Stretch,
    runs: &mut RunList,
) -> Result<(), PlanError> {
    let f = |what| PlanError::overflow(&pair.name, what);
    let s_page = offset(&pair.src, layer, st.src_page, 0, PlanSide::Source)?;
    let d_page = offset(&pair.dst, layer, st.dst_page, 0, PlanSide::Destination)?;
    // Inside a validated pool every row's offset is below its region's length; still checked.
    let at = |page: u64, side: &units::UnitSide, row: u64| {
        row.checked_mul(side.row_step_bytes)
            .and_then(|x| x.checked_add(page))
            .and_then(|x| x.checked_add(side.offset_bytes))
    };
    for u in units {
        let s0 = at(s_page, &u.src, st.src_row).ok_or_else(|| f("source offset"))?;
        let d0 = at(d_page, &u.dst, st.dst_row).ok_or_else(|| f("destination offset"))?;
        let rows_contiguous =
            u.len_bytes == u.src.row_step_bytes && u.len_bytes == u.dst.row_step_bytes;
        if st.rows == 1 || rows_contiguous {
            runs.push(Run {
                src_offset_bytes: s0,
                dst_offset_bytes: d0,
                len_bytes: u
                    .len_bytes
                    .checked_mul(st.rows)
                    .ok_or_else(|| f("run length"))?,
            })?;
            continue;
        }
        for r in 0..st.rows {
            runs.push(Run {
                src_offset_bytes: at(s_page, &u.src, st.src_row + r)
                    .ok_or_else(|| f("source offset"))?,
                dst_offset_bytes: at(d_page, &u.dst, st.dst_row + r)
                    .ok_or_else(|| f("destination offset"))?,
                len_bytes: u.len_bytes,
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
