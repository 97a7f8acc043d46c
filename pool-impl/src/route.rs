//! Page routes: what [`crate::HiCache::pair`] works out once per device/host pair so that each
//! transfer is a few additions per page and no allocation.
//!
//! Every address still comes from the pools' geometries: a route is read off
//! [`PoolGeometry::page_offset_bytes`] and [`PoolGeometry::page_segments`] at pairing time.
//! For each memory layout the offset of (layer `l`, page `p`) of a buffer is affine,
//! `base + p * page_step + l * layer_step` (`layer_first`: steps `S`, `P * S`; `page_first`:
//! `L * S`, `S`; `page_first_direct`: the page group, `S`; `page_head`: `heads * L * chunk`,
//! `chunk`; `page_head_token`: `heads * L * chunk`, one head row; `layer_head`: `chunk`,
//! `heads * P * chunk`; `page_unified`: `groups * L * cell`,
//! `cell`), so three offsets give the steps; every (layer, page) is then compared against the
//! geometry in the tests, and the corner (last layer, last page) is compared at pairing time.
//! The largest byte any route reaches is computed with checked arithmetic at pairing time and
//! must lie inside both regions, so per-transfer arithmetic on in-range indices cannot overflow
//! or leave a region.

use kvlayout_core::{GeometryError, PoolGeometry};

use crate::backend::{BackendError, check_range};
use crate::layer_map::LayerMap;
use crate::plan::{CopyRun, Direction, Layers, PagePair};
use crate::shim::TransferError;

/// `base + page * page_step + layer * layer_step`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Affine {
    base_bytes: u64,
    page_step_bytes: u64,
    layer_step_bytes: u64,
}

impl Affine {
    fn of(g: &PoolGeometry, b: usize, layers: u64) -> Result<Affine, GeometryError> {
        let base_bytes = g.page_offset_bytes(b, 0, 0)?;
        let step = |off: u64| {
            off.checked_sub(base_bytes).ok_or_else(|| {
                GeometryError::new("page route", "page offsets decrease with the index")
            })
        };
        let page_step_bytes = if g.pages > 1 {
            step(g.page_offset_bytes(b, 0, 1)?)?
        } else {
            0
        };
        let layer_step_bytes = if layers > 1 {
            step(g.page_offset_bytes(b, 1, 0)?)?
        } else {
            0
        };
        let a = Affine {
            base_bytes,
            page_step_bytes,
            layer_step_bytes,
        };
        // The corner must agree with the geometry (an affine layout), else refuse the route.
        let corner = g.page_offset_bytes(b, layers - 1, g.pages - 1)?;
        if a.checked_at(layers - 1, g.pages - 1) != Some(corner) {
            return Err(GeometryError::new(
                "page route",
                format!("page offsets of buffer {b} are not affine in (layer, page)"),
            ));
        }
        Ok(a)
    }

    fn checked_at(&self, layer: u64, page: u64) -> Option<u64> {
        self.base_bytes
            .checked_add(page.checked_mul(self.page_step_bytes)?)?
            .checked_add(layer.checked_mul(self.layer_step_bytes)?)
    }

    /// For `layer`, `page` in range: bounded by the corner checked at pairing time.
    #[inline]
    fn at(&self, layer: u64, page: u64) -> u64 {
        self.base_bytes + page * self.page_step_bytes + layer * self.layer_step_bytes
    }
}

/// One contiguous piece of a page: `len_bytes` at `page_offset_bytes` of the canonical
/// (device) page sit `host_offset_bytes` past the host page's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    page_offset_bytes: u64,
    host_offset_bytes: u64,
    len_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct BufferRoute {
    name: String,
    layers: u64,
    device: Affine,
    host: Affine,
    /// One piece of the whole stored page, except under a `page_head` host.
    pieces: Vec<Piece>,
    /// The largest end of a piece inside the device page (canonical bytes) and past the host
    /// page's start: a page's runs of layer `l` end at most `at(l, page) + end`.
    device_end_bytes: u64,
    host_end_bytes: u64,
}

/// What a pool was at pairing: a transfer re-reads these from the pools and compares
/// ([`crate::shim::CHECKS_COMPILED`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolFacts {
    /// [`PoolGeometry::fingerprint`].
    pub fingerprint: u64,
    /// Pages (of the geometry).
    pub pages: u64,
    /// Length of the memory region.
    pub len_bytes: u64,
}

/// The pairing-time facts of one device/host pair: what each pool was, for the per-transfer
/// checks, and per buffer the affine page addressing of both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Routes {
    pub device: PoolFacts,
    pub host: PoolFacts,
    /// Which layer of each buffer a one-layer transfer names (model layer ids where the
    /// buffers give `layer_ids`).
    pub layers: LayerMap,
    buffers: Vec<BufferRoute>,
}

fn corner_end(
    a: &Affine,
    layers: u64,
    pages: u64,
    piece_end_bytes: u64,
    side: &'static str,
    len_bytes: u64,
) -> Result<(), TransferError> {
    let end = a
        .checked_at(layers - 1, pages - 1)
        .and_then(|o| o.checked_add(piece_end_bytes));
    match end {
        Some(e) if e <= len_bytes => Ok(()),
        _ => Err(TransferError::Geometry(GeometryError::new(
            "page route",
            format!(
                "the last page of the {side} pool ends at {} past the {len_bytes}-byte region",
                end.map_or_else(|| "an overflowing offset".to_string(), |e| e.to_string())
            ),
        ))),
    }
}

impl Routes {
    /// Routes of every device buffer onto the host buffer of the same name. Both geometries
    /// must have passed [`kvlayout_core::compare`] (same buffers, strides, layers).
    pub fn new(
        (dg, device): (&PoolGeometry, PoolFacts),
        (hg, host): (&PoolGeometry, PoolFacts),
    ) -> Result<Routes, TransferError> {
        let (device_len_bytes, host_len_bytes) = (device.len_bytes, host.len_bytes);
        let mut buffers = Vec::with_capacity(dg.buffers.len());
        for (bi, db) in dg.buffers.iter().enumerate() {
            let Some(hi) = hg.buffer_index(db.name()) else {
                return Err(TransferError::Field {
                    field: db.name().to_string(),
                    device: "present".into(),
                    host: "missing".into(),
                });
            };
            let layers = db.layers;
            if hg.buffers[hi].layers != layers {
                return Err(TransferError::Field {
                    field: format!("{}.layers", db.name()),
                    device: layers.to_string(),
                    host: hg.buffers[hi].layers.to_string(),
                });
            }
            let device_a = Affine::of(dg, bi, layers)?;
            let host_a = Affine::of(hg, hi, layers)?;
            let host_start = hg.page_offset_bytes(hi, 0, 0)?;
            let pieces: Vec<Piece> = hg
                .page_segments(hi, 0, 0)?
                .into_iter()
                .map(|s| Piece {
                    page_offset_bytes: s.page_offset_bytes,
                    host_offset_bytes: s.pool_offset_bytes - host_start,
                    len_bytes: s.len_bytes,
                })
                .collect();
            let ends = |f: fn(&Piece) -> u64| {
                pieces
                    .iter()
                    .map(|p| f(p).checked_add(p.len_bytes))
                    .try_fold(0u64, |m, e| e.map(|e| m.max(e)))
                    .ok_or_else(|| GeometryError::new("page route", "overflow in a page piece"))
            };
            let (dev_end, host_end) = (
                ends(|p| p.page_offset_bytes)?,
                ends(|p| p.host_offset_bytes)?,
            );
            corner_end(
                &device_a,
                layers,
                dg.pages,
                dev_end,
                "device",
                device_len_bytes,
            )?;
            corner_end(&host_a, layers, hg.pages, host_end, "host", host_len_bytes)?;
            buffers.push(BufferRoute {
                name: db.name().to_string(),
                layers,
                device: device_a,
                host: host_a,
                pieces,
                device_end_bytes: dev_end,
                host_end_bytes: host_end,
            });
        }
        Ok(Routes {
            device,
            host,
            layers: LayerMap::new(dg, hg),
            buffers,
        })
    }

    /// The layer asked for exists in some buffer: a buffer-local index, or a model layer id
    /// where the buffers give `layer_ids` ([`LayerMap`]).
    #[inline]
    pub fn check_layer(&self, layers: Layers) -> Result<(), TransferError> {
        self.layers.check(layers)
    }

    /// Runs one pair contributes for `layers` (every buffer holding the layer, each of its
    /// pieces).
    #[inline]
    pub fn runs_per_pair(&self, layers: Layers) -> u64 {
        self.buffers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let (first, end) = self.layers.range(i, layers);
                (end - first) * b.pieces.len() as u64
            })
            .sum()
    }

    /// Every run of every pair inside both regions, before any byte moves: per pair and
    /// buffer, the deepest layer the transfer touches, at the pair's page, plus the largest
    /// piece end, with checked arithmetic, against the paired regions' lengths. Steps are
    /// non-negative, so that end bounds every run of the pair. Pages must be in range. Implied
    /// by the routes (the corner proven at pairing); a failure means the routes or the pools
    /// changed after pairing.
    #[inline]
    pub fn check_pair_ranges(
        &self,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<(), TransferError> {
        for (bi, b) in self.buffers.iter().enumerate() {
            let (first, end) = self.layers.range(bi, layers);
            if first == end {
                continue;
            }
            let last = end - 1;
            for (i, p) in pairs.iter().enumerate() {
                let d = b.device.checked_at(last, p.device_page);
                let h = b.host.checked_at(last, p.host_page);
                let fits = |at: Option<u64>, end: u64, len: u64| {
                    at.and_then(|a| a.checked_add(end))
                        .is_some_and(|e| e <= len)
                };
                if !(fits(d, b.device_end_bytes, self.device.len_bytes)
                    && fits(h, b.host_end_bytes, self.host.len_bytes))
                {
                    return Err(self.pair_range_error(b, i, (d, h)));
                }
            }
        }
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn pair_range_error(
        &self,
        b: &BufferRoute,
        pair: usize,
        (d, h): (Option<u64>, Option<u64>),
    ) -> TransferError {
        // The device side first; the host's when the device side fits.
        let source = check_range(
            "device",
            d.unwrap_or(u64::MAX),
            b.device_end_bytes,
            self.device.len_bytes,
        )
        .and_then(|()| {
            check_range(
                "host",
                h.unwrap_or(u64::MAX),
                b.host_end_bytes,
                self.host.len_bytes,
            )
        });
        TransferError::PairRange {
            pair,
            buffer: b.name.clone(),
            source: source.err().unwrap_or(BackendError::OutOfRange {
                side: "host",
                start_bytes: h.unwrap_or(u64::MAX),
                end_bytes: u64::MAX,
                len_bytes: self.host.len_bytes,
            }),
        }
    }

    /// Moves buffer `b`'s host addressing by `by_bytes` (tests corrupt routes with it).
    #[cfg(test)]
    pub(crate) fn shift_host_base(&mut self, b: usize, by_bytes: u64) {
        self.buffers[b].host.base_bytes += by_bytes;
    }

    /// Appends the runs of one pair, in (buffer, layer, piece) order. The pair's pages must
    /// be in range (checked by the caller), which bounds every offset (see the module doc).
    #[inline]
    pub fn push_pair_runs(
        &self,
        direction: Direction,
        layers: Layers,
        pair: PagePair,
        out: &mut Vec<CopyRun>,
    ) {
        debug_assert!(pair.device_page < self.device.pages && pair.host_page < self.host.pages);
        for (bi, b) in self.buffers.iter().enumerate() {
            let (first, end) = self.layers.range(bi, layers);
            for l in first..end {
                let d = b.device.at(l, pair.device_page);
                let h = b.host.at(l, pair.host_page);
                for p in &b.pieces {
                    let (dev, host) = (d + p.page_offset_bytes, h + p.host_offset_bytes);
                    out.push(match direction {
                        Direction::Backup => CopyRun {
                            src_offset_bytes: dev,
                            dst_offset_bytes: host,
                            len_bytes: p.len_bytes,
                        },
                        Direction::Load => CopyRun {
                            src_offset_bytes: host,
                            dst_offset_bytes: dev,
                            len_bytes: p.len_bytes,
                        },
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use kvlayout_core::{BufferGeometry, MemoryLayout, TokenLayout, formats};

    use super::*;
    use crate::shim::{self, Side};

    fn pool(
        buffers: &[(&'static str, TokenLayout, u64)],
        pages: u64,
        m: MemoryLayout,
    ) -> PoolGeometry {
        PoolGeometry {
            name: "route test".into(),
            page_size_tokens: 64,
            pages,
            memory_layout: m,
            buffers: buffers
                .iter()
                .map(|(n, l, layers)| BufferGeometry::new(*n, *layers, l.clone()))
                .collect(),
        }
    }

    fn side(g: &PoolGeometry) -> (&PoolGeometry, PoolFacts) {
        (
            g,
            PoolFacts {
                fingerprint: g.fingerprint().unwrap(),
                pages: g.pages,
                len_bytes: g.total_bytes().unwrap(),
            },
        )
    }

    /// Every (buffer, layer, page) of both sides: the route's offsets and pieces equal the
    /// geometry's `page_offset_bytes` / `page_segments`; and a transfer's runs are exactly the
    /// checked plan's runs (as a set: the plan lists them buffer-major, a transfer pair-major).
    fn routes_agree_with_geometry(
        buffers: &[(&'static str, TokenLayout, u64)],
        host_m: MemoryLayout,
    ) {
        let dg = pool(buffers, 5, MemoryLayout::LayerFirst);
        let hg = pool(buffers, 7, host_m);
        let r = Routes::new(side(&dg), side(&hg)).unwrap();
        for (b, route) in r.buffers.iter().enumerate() {
            for l in 0..route.layers {
                for p in 0..dg.pages {
                    assert_eq!(
                        route.device.at(l, p),
                        dg.page_offset_bytes(b, l, p).unwrap()
                    );
                }
                for p in 0..hg.pages {
                    let segs = hg.page_segments(b, l, p).unwrap();
                    let h = route.host.at(l, p);
                    let pieces: Vec<(u64, u64, u64)> = route
                        .pieces
                        .iter()
                        .map(|x| (x.page_offset_bytes, h + x.host_offset_bytes, x.len_bytes))
                        .collect();
                    let want: Vec<(u64, u64, u64)> = segs
                        .iter()
                        .map(|s| (s.page_offset_bytes, s.pool_offset_bytes, s.len_bytes))
                        .collect();
                    assert_eq!(pieces, want, "{host_m} buffer {b} layer {l} page {p}");
                }
            }
        }
        let pairs = [
            PagePair::new(0, 6),
            PagePair::new(4, 0),
            PagePair::new(2, 3),
            PagePair::new(2, 5),
        ];
        let deepest = r.layers.deepest_layers();
        let mut all_layers = vec![Layers::All];
        all_layers.extend((0..deepest).map(Layers::One));
        for direction in [Direction::Backup, Direction::Load] {
            for &layers in &all_layers {
                let pairs: &[PagePair] = match direction {
                    Direction::Backup => &pairs,
                    // Distinct device destinations for a load.
                    Direction::Load => &pairs[..3],
                };
                let d = Side {
                    geometry: &dg,
                    len_bytes: r.device.len_bytes,
                };
                let h = Side {
                    geometry: &hg,
                    len_bytes: r.host.len_bytes,
                };
                let plan = shim::checked_plan(direction, d, h, layers, pairs).unwrap();
                let mut want = plan.flat_runs();
                let mut got = Vec::new();
                for &p in pairs {
                    let before = got.len();
                    r.push_pair_runs(direction, layers, p, &mut got);
                    assert_eq!((got.len() - before) as u64, r.runs_per_pair(layers));
                }
                want.sort_unstable_by_key(|x| (x.src_offset_bytes, x.dst_offset_bytes));
                got.sort_unstable_by_key(|x| (x.src_offset_bytes, x.dst_offset_bytes));
                assert_eq!(got, want, "{host_m} {direction} {layers:?}");
            }
        }
    }

    #[test]
    fn dsa_routes_agree_with_the_geometry_for_every_host_layout() {
        // index_k in 2 of the 3 layers: a one-layer transfer of layer 2 moves kv only.
        let bufs = [
            ("kv", formats::DSA_MLA_FP8, 3),
            ("index_k", formats::INDEX_K_FP8, 2),
        ];
        for m in [
            MemoryLayout::LayerFirst,
            MemoryLayout::PageFirst,
            MemoryLayout::PageFirstDirect,
        ] {
            routes_agree_with_geometry(&bufs, m);
        }
    }

    #[test]
    fn mha_routes_agree_with_the_geometry_including_page_head() {
        for m in MemoryLayout::ALL {
            routes_agree_with_geometry(&[("kv", formats::MHA_BF16_8X128, 2)], m);
        }
        // page_unified over K and V sides of 8 heads: one group of 8, and 4 groups of 2.
        let side = |name: &'static str| TokenLayout {
            arrangement: kvlayout_core::Arrangement::TokenMajor,
            sections: vec![kvlayout_core::Section::owned(
                name,
                kvlayout_core::Dtype::Bf16,
                vec![8, 128],
            )]
            .into(),
            page_align_bytes: None,
            page_stride_bytes: None,
        };
        for heads_per_group in [8, 2] {
            routes_agree_with_geometry(
                &[("k", side("k"), 2), ("v", side("v"), 2)],
                MemoryLayout::PageUnified { heads_per_group },
            );
        }
    }

    #[test]
    fn runs_per_pair_counts_buffers_holding_the_layer() {
        let bufs = [
            ("kv", formats::DSA_MLA_FP8, 3),
            ("index_k", formats::INDEX_K_BF16, 2),
        ];
        let g = pool(&bufs, 4, MemoryLayout::LayerFirst);
        let h = pool(&bufs, 4, MemoryLayout::PageFirst);
        let r = Routes::new(side(&g), side(&h)).unwrap();
        // All layers: 3 kv + 2 index_k runs (one piece per page off page_head); layer 2: kv only.
        assert_eq!(r.runs_per_pair(Layers::All), 5);
        assert_eq!(r.runs_per_pair(Layers::One(1)), 2);
        assert_eq!(r.runs_per_pair(Layers::One(2)), 1);
        assert_eq!(r.runs_per_pair(Layers::One(3)), 0);
    }

    /// The per-pair range check cannot fail on routes laid at pairing (the corner is proven
    /// then); corrupted routes show it works. DSA fp8, 3 kv layers and 2 index_k layers, 4
    /// device pages and 4 host pages (`page_first`): the host region is 4 x (3 x 41,984 + 2 x
    /// 8,448) = 4 x 142,848 = 571,392 B.
    #[test]
    fn corrupted_routes_fail_the_pair_range_check_naming_pair_buffer_and_range() {
        let bufs = [
            ("kv", formats::DSA_MLA_FP8, 3),
            ("index_k", formats::INDEX_K_FP8, 2),
        ];
        let g = pool(&bufs, 4, MemoryLayout::LayerFirst);
        let h = pool(&bufs, 4, MemoryLayout::PageFirst);
        let mut r = Routes::new(side(&g), side(&h)).unwrap();
        let pairs = [PagePair::new(0, 0), PagePair::new(3, 3)];
        assert_eq!(r.host.len_bytes, 571_392);
        r.check_pair_ranges(Layers::All, &pairs).unwrap();
        // Shift index_k's host base by one page of one layer (8,448 B): host page 3, its last
        // layer (1), ends 8,448 B past the region.
        r.buffers[1].host.base_bytes += 8_448;
        let err = r.check_pair_ranges(Layers::All, &pairs).unwrap_err();
        // page_first: index_k starts after kv's 4 x 3 x 41,984 = 503,808 B; host page 3 layer 1
        // at 503,808 + (3 x 2 + 1) x 8,448 = 562,944, shifted 571,392, ending 579,840.
        assert_eq!(
            err,
            TransferError::PairRange {
                pair: 1,
                buffer: "index_k".into(),
                source: BackendError::OutOfRange {
                    side: "host",
                    start_bytes: 571_392,
                    end_bytes: 579_840,
                    len_bytes: 571_392,
                },
            }
        );
        // Layer 2 is kv's only: index_k is not checked, and kv fits.
        r.check_pair_ranges(Layers::One(2), &pairs).unwrap();
        // An overflowing step is an error, not a wrap.
        r.buffers[0].device.page_step_bytes = u64::MAX;
        let err = r.check_pair_ranges(Layers::One(2), &pairs).unwrap_err();
        assert!(
            matches!(&err, TransferError::PairRange { pair: 1, buffer, .. } if buffer == "kv"),
            "{err}"
        );
    }
}
