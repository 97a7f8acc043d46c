//! Page routes: what [`crate::HiCache::pair`] works out once per device/host pair so that each
//! transfer is a few additions per page and no allocation.
//!
//! Every address still comes from the pools' geometries: a route is read off
//! [`PoolGeometry::page_offset_bytes`] and [`PoolGeometry::page_segments`] at pairing time.
//! For each memory layout the offset of (layer `l`, page `p`) of a buffer is affine,
//! `base + p * page_step + l * layer_step` (`layer_first`: steps `S`, `P * S`; `page_first`:
//! `L * S`, `S`; `page_first_direct`: the page group, `S`; `page_head`: `heads * L * chunk`,
//! `chunk`), so three offsets give the steps; every (layer, page) is then compared against the
//! geometry in the tests, and the corner (last layer, last page) is compared at pairing time.
//! The largest byte any route reaches is computed with checked arithmetic at pairing time and
//! must lie inside both regions, so per-transfer arithmetic on in-range indices cannot overflow
//! or leave a region.

use kvlayout_core::{GeometryError, PoolGeometry};

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
    layers: u64,
    device: Affine,
    host: Affine,
    /// One piece of the whole stored page, except under a `page_head` host.
    pieces: Vec<Piece>,
}

/// The pairing-time facts of one device/host pair: fingerprints and page counts for the
/// per-transfer checks, and per buffer the affine page addressing of both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Routes {
    pub device_fingerprint: u64,
    pub host_fingerprint: u64,
    pub device_pages: u64,
    pub host_pages: u64,
    pub device_len_bytes: u64,
    pub host_len_bytes: u64,
    /// Largest layer count of any buffer.
    pub deepest_layers: u64,
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
        device: (&PoolGeometry, u64, u64),
        host: (&PoolGeometry, u64, u64),
    ) -> Result<Routes, TransferError> {
        let (dg, device_fingerprint, device_len_bytes) = device;
        let (hg, host_fingerprint, host_len_bytes) = host;
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
                layers,
                device: device_a,
                host: host_a,
                pieces,
            });
        }
        Ok(Routes {
            device_fingerprint,
            host_fingerprint,
            device_pages: dg.pages,
            host_pages: hg.pages,
            device_len_bytes,
            host_len_bytes,
            deepest_layers: dg.buffers.iter().map(|b| b.layers).max().unwrap_or(0),
            buffers,
        })
    }

    /// Runs one pair contributes for `layers` (every buffer holding the layer, each of its
    /// pieces).
    #[inline]
    pub fn runs_per_pair(&self, layers: Layers) -> u64 {
        self.buffers
            .iter()
            .map(|b| {
                let n = match layers {
                    Layers::All => b.layers,
                    Layers::One(l) => u64::from(l < b.layers),
                };
                n * b.pieces.len() as u64
            })
            .sum()
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
        debug_assert!(pair.device_page < self.device_pages && pair.host_page < self.host_pages);
        for b in &self.buffers {
            let (first, end) = match layers {
                Layers::All => (0, b.layers),
                Layers::One(l) if l < b.layers => (l, l + 1),
                Layers::One(_) => continue,
            };
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

    fn side(g: &PoolGeometry) -> (&PoolGeometry, u64, u64) {
        (g, g.fingerprint().unwrap(), g.total_bytes().unwrap())
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
        let deepest = r.deepest_layers;
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
                    fingerprint: r.device_fingerprint,
                    len_bytes: r.device_len_bytes,
                };
                let h = Side {
                    geometry: &hg,
                    fingerprint: r.host_fingerprint,
                    len_bytes: r.host_len_bytes,
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
}
