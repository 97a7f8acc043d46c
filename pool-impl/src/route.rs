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
