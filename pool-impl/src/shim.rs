//! The runtime shim: the checks made before a transfer moves a byte, and the plans a transfer
//! executes.
//!
//! Where each check runs, all before any byte moves:
//! - once, at pairing ([`crate::HiCache::pair`]): the full geometry comparison
//!   ([`kvlayout_core::compare`]: page size, buffer names, per buffer layer count,
//!   arrangement, bytes per token, page stride, sections; the pool fingerprints then agree, but for
//!   `layer_ids` given on one side only, which compare allows), and the page
//!   routes every transfer uses, with the last page of each side proven inside its region
//!   (checked arithmetic);
//! - every transfer, in every build: the layer asked for exists; the list is no longer than the
//!   destination pool's page count ([`TransferError::TooManyPairs`], O(1), before the list is
//!   read); every page index in range on both sides; no destination page named twice;
//! - every transfer, unless the crate is built with the opt-out feature `unchecked`
//!   ([`CHECKS_COMPILED`]): the pools are the paired ones (each pool's fingerprint, page count
//!   and region length re-read and compared with the pairing's:
//!   [`TransferError::PoolChanged`]), and every run of every pair inside both regions
//!   ([`TransferError::PairRange`]).
//!
//! A paired pool cannot be replaced or resized through the API (the caches hand out shared
//! references and write-only handles), so the identity checks guard against a bug in this
//! crate, not a caller; they cost about a nanosecond (BENCHMARKS.md, "CPU").
//!
//! The full plan ([`checked_plan`], what [`crate::HiCache::plan`] shows) is built from each
//! side's own geometry ([`PoolGeometry::page_offset_bytes`], [`PoolGeometry::page_segments`])
//! with [`check_geometry`] (the field-by-field comparison) and [`check_pages`] re-run: the
//! device page's canonical bytes map to the host page's segments, so a `page_head` host or a
//! padded device stride are placed exactly. Transfers execute the same runs, laid from the
//! routes.
//!
//! [`legacy_plan`] is the unverified path SGLang's HiCache kernel took: one item size, the
//! host's page bytes, used as the length *and* the page stride on both sides, with no geometry
//! check. With a host sized by the fp8 formula (8448 B/page) and a bf16 device (16384 B/page) it
//! truncates and misaddresses — the seed bug, reproduced.

use kvlayout_core::{GeometryError, PoolGeometry, compare};

pub use crate::error::{PoolFact, TransferError};

use crate::backend::check_range;
use crate::layer_map::LayerMap;
use crate::plan::{BufferPlan, CopyRun, Direction, Layers, PagePair, TransferPlan};

/// Whether the per-transfer identity and byte-range checks are compiled in: true unless the
/// crate is built with the opt-out feature `unchecked`, in debug and release builds alike.
pub const CHECKS_COMPILED: bool = !cfg!(feature = "unchecked");

/// One side of a transfer, as the shim sees it.
#[derive(Clone, Copy)]
pub struct Side<'a> {
    /// Its geometry.
    pub geometry: &'a PoolGeometry,
    /// Length of its region.
    pub len_bytes: u64,
}

fn field(field: String, device: &str, host: &str) -> TransferError {
    TransferError::Field {
        field,
        device: device.to_string(),
        host: host.to_string(),
    }
}

/// The geometry comparison of a pairing, re-run by the inspection path: [`compare`] at level
/// `pool` (page sizes, buffer set, per buffer layers, arrangement, page stride, sections,
/// attention, shard, `layer_ids` when both sides give them), every differing field in
/// [`TransferError::Mismatch`].
///
/// # Errors
///
/// [`TransferError::Mismatch`] with every differing field and both values.
pub fn check_geometry(device: &PoolGeometry, host: &PoolGeometry) -> Result<(), TransferError> {
    compare(device, host).map_err(TransferError::Mismatch)
}

/// Pairs of a list longer than the destination pool's page count: at least one destination
/// page would be named twice (pigeonhole), so the list is refused in O(1), before any work or
/// allocation proportional to its length.
fn check_pair_count(
    direction: Direction,
    device_pages: u64,
    host_pages: u64,
    pairs: &[PagePair],
) -> Result<(), TransferError> {
    let dst_pages = match direction {
        Direction::Backup => host_pages,
        Direction::Load => device_pages,
    };
    if pairs.len() as u64 > dst_pages {
        return Err(too_many_pairs_error(direction, pairs.len(), dst_pages));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn too_many_pairs_error(direction: Direction, pairs: usize, pages: u64) -> TransferError {
    TransferError::TooManyPairs {
        pairs: pairs as u64,
        side: direction.destination(),
        pages,
    }
}

/// Lists up to this length are searched for duplicates pair by pair (no allocation); longer
/// ones are sorted (an allocation of 16 B per pair, bounded by the destination pool's pages).
const QUADRATIC_DUPLICATE_SEARCH_MAX: usize = 32;

/// The first pair, in list order, whose destination page an earlier pair already names:
/// `(pair, first, page)` with `first` the earliest pair naming it.
pub fn first_duplicate_destination(
    direction: Direction,
    pairs: &[PagePair],
) -> Option<(usize, usize, u64)> {
    let dst = |p: &PagePair| match direction {
        Direction::Backup => p.host_page,
        Direction::Load => p.device_page,
    };
    if pairs.len() <= QUADRATIC_DUPLICATE_SEARCH_MAX {
        for (i, p) in pairs.iter().enumerate().skip(1) {
            let page = dst(p);
            if let Some(j) = pairs[..i].iter().position(|q| dst(q) == page) {
                return Some((i, j, page));
            }
        }
        return None;
    }
    let mut order: Vec<(u64, usize)> = pairs.iter().map(dst).zip(0..).collect();
    order.sort_unstable();
    // Within a run of equal pages the indices ascend, so the run's first window is (first,
    // second) naming the page; later windows of the run have larger second indices. The
    // answer is the window with the smallest second index.
    order
        .windows(2)
        .filter(|w| w[0].0 == w[1].0)
        .map(|w| (w[1].1, w[0].1, w[0].0))
        .min()
}

/// Page indices in range on both sides and (with `check_duplicates`) no destination page
/// named twice. Errors name the pair, the side, the page and the pool's page count; the
/// reported problem is the first in list order (a pair out of range before a later
/// duplicate). Lists longer than the destination's page count are refused first, in O(1)
/// ([`TransferError::TooManyPairs`]). An empty list passes.
///
/// # Errors
///
/// [`TransferError::TooManyPairs`], [`TransferError::PageOutOfRange`] or
/// [`TransferError::DuplicateDestination`], naming the pair, the side, the page and the page count
/// (the first problem in list order).
#[inline]
pub fn check_pair_pages(
    direction: Direction,
    device_pages: u64,
    host_pages: u64,
    pairs: &[PagePair],
    check_duplicates: bool,
) -> Result<(), TransferError> {
    // The hot path, inlined: a length compare, two compares per pair and, for short lists, a
    // pairwise duplicate scan. Any failure re-runs the checks out of line to name it.
    let dst_pages = match direction {
        Direction::Backup => host_pages,
        Direction::Load => device_pages,
    };
    let dst = |p: &PagePair| match direction {
        Direction::Backup => p.host_page,
        Direction::Load => p.device_page,
    };
    let ok = pairs.len() as u64 <= dst_pages
        && pairs
            .iter()
            .all(|p| p.device_page < device_pages && p.host_page < host_pages)
        && (!check_duplicates
            || if pairs.len() <= QUADRATIC_DUPLICATE_SEARCH_MAX {
                pairs
                    .iter()
                    .enumerate()
                    .all(|(i, p)| pairs[..i].iter().all(|q| dst(q) != dst(p)))
            } else {
                first_duplicate_destination(direction, pairs).is_none()
            });
    if ok {
        return Ok(());
    }
    pair_pages_error(direction, device_pages, host_pages, pairs, check_duplicates)
}

/// Pools up to this many pages get a [`DestinationBitmap`] (8 MiB at most); larger ones use
/// [`check_pair_pages`]'s own duplicate search (sorting lists longer than 32 pairs).
pub const BITMAP_MAX_PAGES: u64 = 1 << 26;

/// One bit per page of the larger pool, all clear between calls: finds a destination page named
/// twice in O(n) for lists of any length, without sorting or allocating per call (a checker
/// that keeps one, such as the Python `TransferGuard`, checks warm lists allocation-free).
#[derive(Clone, Debug, Default)]
pub struct DestinationBitmap {
    words: Vec<u64>,
}

impl DestinationBitmap {
    /// An all-clear bitmap for pools of at most `pages` pages; empty (the sorting search is
    /// used) past [`BITMAP_MAX_PAGES`].
    pub fn new(pages: u64) -> DestinationBitmap {
        let words = match pages <= BITMAP_MAX_PAGES {
            true => vec![0; pages.div_ceil(64) as usize],
            false => Vec::new(),
        };
        DestinationBitmap { words }
    }

    /// [`check_pair_pages`] with duplicates found through the bitmap; a duplicate found re-runs
    /// [`check_pair_pages`]'s own search, which names it. Leaves the bitmap all clear.
    ///
    /// # Errors
    /// As [`check_pair_pages`].
    pub fn check_pair_pages(
        &mut self,
        direction: Direction,
        device_pages: u64,
        host_pages: u64,
        pairs: &[PagePair],
    ) -> Result<(), TransferError> {
        check_pair_pages(direction, device_pages, host_pages, pairs, false)?;
        let dst_pages = device_pages.max(host_pages);
        if (self.words.len() as u64) * 64 < dst_pages || self.has_duplicate(direction, pairs) {
            return check_pair_pages(direction, device_pages, host_pages, pairs, true);
        }
        Ok(())
    }

    /// Whether a destination page appears twice (every page already range-checked, so it
    /// fits the bitmap). Leaves the bitmap all clear.
    fn has_duplicate(&mut self, direction: Direction, pairs: &[PagePair]) -> bool {
        let dst = |p: &PagePair| match direction {
            Direction::Backup => p.host_page,
            Direction::Load => p.device_page,
        } as usize;
        let mut found = false;
        let mut marked = 0;
        for p in pairs {
            let (w, bit) = (dst(p) / 64, 1u64 << (dst(p) % 64));
            if self.words[w] & bit != 0 {
                found = true;
                break;
            }
            self.words[w] |= bit;
            marked += 1;
        }
        for p in &pairs[..marked] {
            self.words[dst(p) / 64] = 0;
        }
        found
    }
}

/// The first problem of a list that failed [`check_pair_pages`], named.
#[cold]
#[inline(never)]
fn pair_pages_error(
    direction: Direction,
    device_pages: u64,
    host_pages: u64,
    pairs: &[PagePair],
    check_duplicates: bool,
) -> Result<(), TransferError> {
    check_pair_count(direction, device_pages, host_pages, pairs)?;
    let bad = pairs
        .iter()
        .position(|p| p.device_page >= device_pages || p.host_page >= host_pages)
        .unwrap_or(pairs.len());
    if check_duplicates
        && let Some((pair, first, page)) = first_duplicate_destination(direction, &pairs[..bad])
    {
        return Err(duplicate_error(direction, pair, first, page));
    }
    if bad < pairs.len() {
        return Err(out_of_range_error(
            bad,
            pairs[bad],
            device_pages,
            host_pages,
        ));
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn duplicate_error(direction: Direction, pair: usize, first: usize, page: u64) -> TransferError {
    TransferError::DuplicateDestination {
        pair,
        first,
        side: direction.destination(),
        page,
    }
}

#[cold]
#[inline(never)]
fn out_of_range_error(
    pair: usize,
    p: PagePair,
    device_pages: u64,
    host_pages: u64,
) -> TransferError {
    if p.device_page >= device_pages {
        TransferError::PageOutOfRange {
            pair,
            side: "device",
            page: p.device_page,
            pages: device_pages,
        }
    } else {
        TransferError::PageOutOfRange {
            pair,
            side: "host",
            page: p.host_page,
            pages: host_pages,
        }
    }
}

/// The layer asked for present in at least one buffer.
///
/// # Errors
///
/// [`TransferError::Layer`] naming the layer and the deepest buffer's layer count when no buffer
/// has it.
#[inline]
pub fn check_layer(layers: Layers, deepest_layers: u64) -> Result<(), TransferError> {
    match layers {
        Layers::One(layer) if layer >= deepest_layers => Err(TransferError::Layer {
            layer,
            layers: deepest_layers,
        }),
        _ => Ok(()),
    }
}

/// Page indices in range on both sides, no destination page twice, the layer present (a
/// model layer id where the buffers give `layer_ids`: [`LayerMap`]).
///
/// # Errors
/// The first problem found, named ([`TransferError::Layer`], [`TransferError::ModelLayer`],
/// [`TransferError::TooManyPairs`], [`TransferError::PageOutOfRange`],
/// [`TransferError::DuplicateDestination`]).
pub fn check_pages(
    direction: Direction,
    device: &PoolGeometry,
    host: &PoolGeometry,
    layers: Layers,
    pairs: &[PagePair],
) -> Result<(), TransferError> {
    LayerMap::new(device, host).check(layers)?;
    check_pair_pages(direction, device.pages, host.pages, pairs, true)
}

/// Every run inside both regions.
///
/// # Errors
///
/// [`TransferError::Range`] for the first run outside the device or host region, naming the side,
/// the run and the region's length.
pub fn check_ranges(
    plan: &TransferPlan,
    device_len_bytes: u64,
    host_len_bytes: u64,
) -> Result<(), TransferError> {
    let (src_len, dst_len) = match plan.direction {
        Direction::Backup => (device_len_bytes, host_len_bytes),
        Direction::Load => (host_len_bytes, device_len_bytes),
    };
    for b in &plan.buffers {
        for (i, r) in b.runs.iter().enumerate() {
            let wrap = |source| TransferError::Range {
                buffer: b.buffer.clone(),
                run: i,
                source,
            };
            check_range(
                plan.direction.source(),
                r.src_offset_bytes,
                r.len_bytes,
                src_len,
            )
            .map_err(wrap)?;
            check_range(
                plan.direction.destination(),
                r.dst_offset_bytes,
                r.len_bytes,
                dst_len,
            )
            .map_err(wrap)?;
        }
    }
    Ok(())
}

/// Buffer-local layer indices: the legacy kernel's reading of a one-layer transfer.
fn layer_list(layers: Layers, buffer_layers: u64) -> Vec<u64> {
    match layers {
        Layers::All => (0..buffer_layers).collect(),
        Layers::One(l) if l < buffer_layers => vec![l],
        Layers::One(_) => Vec::new(),
    }
}

fn run(direction: Direction, device_off: u64, host_off: u64, len_bytes: u64) -> CopyRun {
    let (src, dst) = match direction {
        Direction::Backup => (device_off, host_off),
        Direction::Load => (host_off, device_off),
    };
    CopyRun {
        src_offset_bytes: src,
        dst_offset_bytes: dst,
        len_bytes,
    }
}

fn ck_add(a: u64, b: u64) -> Result<u64, GeometryError> {
    a.checked_add(b)
        .ok_or_else(|| GeometryError::new("transfer plan", "overflow computing a run offset"))
}

/// Appends the runs of one page of one layer: the device page's canonical bytes starting at
/// `dev_page` onto host page `host_page`'s segments (one contiguous run unless the host's layout splits pages: `page_head`, `layer_head`,
/// `page_unified`).
fn push_page_runs(
    runs: &mut Vec<CopyRun>,
    direction: Direction,
    dev_page: u64,
    host: &PoolGeometry,
    hi: usize,
    layer: u64,
    host_page: u64,
) -> Result<(), TransferError> {
    if !host.memory_layout.splits_pages() {
        let host_off = host.page_offset_bytes(hi, layer, host_page)?;
        let len = host.stored_page_bytes(hi)?;
        runs.push(run(direction, dev_page, host_off, len));
        return Ok(());
    }
    for seg in host.page_segments(hi, layer, host_page)? {
        let dev_off = ck_add(dev_page, seg.page_offset_bytes)?;
        runs.push(run(
            direction,
            dev_off,
            seg.pool_offset_bytes,
            seg.len_bytes,
        ));
    }
    Ok(())
}

/// The checked plan: for each buffer, layer and pair, the device page's canonical bytes
/// (`layer_first`: one run at [`PoolGeometry::page_offset_bytes`]) mapped onto the host page's
/// segments. Each side's offsets come from its own geometry.
///
/// # Errors
///
/// A geometry error naming the buffer, layer or page when an offset cannot be computed or
/// overflows.
pub fn plan(
    direction: Direction,
    device: &PoolGeometry,
    host: &PoolGeometry,
    layers: Layers,
    pairs: &[PagePair],
) -> Result<TransferPlan, TransferError> {
    plan_buffers(direction, device, host, layers, pairs, false)
}

/// The unverified plan SGLang's HiCache transfer kernel executes: per buffer one item size —
/// the *host's* page bytes — used as the copy length and as the page stride on both sides
/// (device page `p` of a layer at `layer base + p * item`), with no geometry comparison.
/// Buffers present on one side only are skipped; layers past the host's count are skipped.
/// Equal geometries give the same runs as [`plan`]; a host sized by another formula truncates
/// and misaddresses.
///
/// # Errors
///
/// As [`plan`].
pub fn legacy_plan(
    direction: Direction,
    device: &PoolGeometry,
    host: &PoolGeometry,
    layers: Layers,
    pairs: &[PagePair],
) -> Result<TransferPlan, TransferError> {
    plan_buffers(direction, device, host, layers, pairs, true)
}

/// [`plan`] (`legacy` false) or [`legacy_plan`] (true): they differ in where the device page
/// is and in what a buffer or layer missing on the host means.
fn plan_buffers(
    direction: Direction,
    device: &PoolGeometry,
    host: &PoolGeometry,
    layers: Layers,
    pairs: &[PagePair],
    legacy: bool,
) -> Result<TransferPlan, TransferError> {
    let mut buffers = Vec::with_capacity(device.buffers.len());
    let map = LayerMap::new(device, host);
    for (bi, db) in device.buffers.iter().enumerate() {
        let hi = match host.buffer_index(db.name()) {
            Some(hi) => hi,
            None if legacy => continue,
            None => return Err(field(db.name().to_string(), "present", "missing")),
        };
        let item_bytes = host.stored_page_bytes(hi)?;
        let layer_ids: Vec<u64> = if legacy {
            layer_list(layers, db.layers)
                .into_iter()
                .filter(|&l| l < host.buffers[hi].layers)
                .collect()
        } else {
            let (first, end) = map.range(bi, layers);
            (first..end).collect()
        };
        // Reserve at most 64 Ki runs up front: the list's length is the caller's.
        let mut runs = Vec::with_capacity(layer_ids.len().saturating_mul(pairs.len()).min(1 << 16));
        for &l in &layer_ids {
            for p in pairs {
                let dev_page = if legacy {
                    let item_off = p.device_page.checked_mul(item_bytes).ok_or_else(|| {
                        GeometryError::new("transfer plan", "overflow computing a run offset")
                    })?;
                    ck_add(device.page_offset_bytes(bi, l, 0)?, item_off)?
                } else {
                    device.page_offset_bytes(bi, l, p.device_page)?
                };
                push_page_runs(&mut runs, direction, dev_page, host, hi, l, p.host_page)?;
            }
        }
        buffers.push(BufferPlan {
            buffer: db.name().to_string(),
            item_bytes,
            layers: layer_ids,
            runs,
        });
    }
    Ok(TransferPlan {
        direction,
        layers,
        pairs: pairs.to_vec(),
        buffers,
        verified: false,
    })
}

/// Checks and plans one transfer (the inspection path, [`crate::HiCache::plan`]): geometry
/// field by field, pages, then the plan, then its byte ranges, in every build (the opt-out
/// feature `unchecked` concerns the transfer hot path only).
///
/// # Errors
///
/// The first refusal found, in the order above: [`TransferError::Mismatch`], the page errors of
/// [`check_pages`], a plan error, [`TransferError::Range`].
pub fn checked_plan(
    direction: Direction,
    device: Side<'_>,
    host: Side<'_>,
    layers: Layers,
    pairs: &[PagePair],
) -> Result<TransferPlan, TransferError> {
    check_geometry(device.geometry, host.geometry)?;
    check_pages(direction, device.geometry, host.geometry, layers, pairs)?;
    let mut p = plan(direction, device.geometry, host.geometry, layers, pairs)?;
    check_ranges(&p, device.len_bytes, host.len_bytes)?;
    p.verified = true;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bitmap_names_the_same_duplicate_as_the_search_and_stays_clear() {
        let mut seen = DestinationBitmap::new(200);
        // 100 pairs (past the pairwise scan): destination 7 at pairs 3 and 90
        let mut pairs: Vec<PagePair> = (0..100).map(|i| PagePair::new(i + 100, i)).collect();
        pairs[90] = PagePair::new(190, 3);
        let got = seen.check_pair_pages(Direction::Backup, 200, 200, &pairs);
        assert_eq!(
            got,
            check_pair_pages(Direction::Backup, 200, 200, &pairs, true)
        );
        assert_eq!(
            got.unwrap_err().to_string(),
            "pairs[90]: host page 3 is already the destination of pairs[3]"
        );
        assert!(seen.words.iter().all(|&w| w == 0));
        pairs[90] = PagePair::new(190, 150);
        assert_eq!(
            seen.check_pair_pages(Direction::Backup, 200, 200, &pairs),
            Ok(())
        );
        // an out-of-range page is named before any duplicate search
        pairs[5] = PagePair::new(5, 200);
        assert!(matches!(
            seen.check_pair_pages(Direction::Backup, 200, 200, &pairs),
            Err(TransferError::PageOutOfRange { pair: 5, .. })
        ));
        assert!(seen.words.iter().all(|&w| w == 0));
    }

    #[test]
    fn a_run_past_either_region_is_refused_naming_the_range() {
        let plan = TransferPlan {
            direction: Direction::Load,
            layers: Layers::All,
            pairs: vec![PagePair::new(0, 0)],
            buffers: vec![BufferPlan {
                buffer: "index_k".into(),
                item_bytes: 16_384,
                layers: vec![0],
                runs: vec![
                    CopyRun {
                        src_offset_bytes: 0,
                        dst_offset_bytes: 0,
                        len_bytes: 16_384,
                    },
                    // Host region of 4 x 8448 = 33,792 B: [25,344, 41,728) does not fit.
                    CopyRun {
                        src_offset_bytes: 25_344,
                        dst_offset_bytes: 16_384,
                        len_bytes: 16_384,
                    },
                ],
            }],
            verified: false,
        };
        let err = check_ranges(&plan, 1 << 20, 33_792).unwrap_err();
        assert_eq!(
            err.to_string(),
            "index_k run 1: host range [25344, 41728) outside the 33792-byte host region"
        );
    }
}
