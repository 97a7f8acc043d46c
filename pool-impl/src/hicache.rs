//! HiCache: a device pool paired with a host pool, and backup (device -> host) / load
//! (host -> device) of page lists, per layer or for all layers (SGLang `HiCacheController`).

use kvlayout_core::{Mismatch, compare};

use crate::backend::{Backend, BackendError, CpuBackend, check_range};
use crate::plan::{CopyRun, Direction, Layers, PagePair, TransferPlan, Transferred};
use crate::pool::{DevicePool, HostPool, KvPool};
use crate::route::Routes;
use crate::shim::{self, CHECKS_COMPILED, Side, TransferError};

/// Why a pairing was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    /// The host pool's geometry cannot exchange pages with the device pool's: every differing
    /// field, `field: device value, host value`.
    #[error("host pool does not match the device pool:\n{0}")]
    Mismatch(Mismatch),
    /// The geometries compare equal but a page route could not be laid (a page past a
    /// region, an offset overflow); names the buffer and the values.
    #[error("page route: {0}")]
    Route(TransferError),
}

/// How transfers are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferMode {
    /// The shim checks every transfer ([`shim::checked_plan`]).
    Checked,
    /// No check, one item size (the host's) on both sides ([`shim::legacy_plan`]): what an
    /// engine without kvlayout does. For demonstrations (`kvlayout replay --no-verify`).
    Unverified,
}

/// Counters of one HiCache's transfers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Backup calls that moved data.
    pub backups: u64,
    /// Load calls that moved data.
    pub loads: u64,
    /// Pages backed up (pairs, counted once for all layers of an all-layer call; per-layer
    /// calls count pairs of layer 0 only).
    pub pages_backed_up: u64,
    /// Pages loaded (counted as for backups).
    pub pages_loaded: u64,
    /// Bytes copied device -> host.
    pub bytes_backed_up: u64,
    /// Bytes copied host -> device.
    pub bytes_loaded: u64,
    /// Transfers the shim refused (no byte moved).
    pub refused: u64,
    /// Transfers the backend failed part way ([`TransferError::Interrupted`]); their bytes
    /// are not counted above.
    pub interrupted: u64,
}

/// A device pool and its host pool.
///
/// Transfers take `&mut self`: one transfer at a time per cache. For transfers from several
/// threads at once (HiCache's write-back and load threads beside the model), see
/// [`crate::ConcurrentHiCache`].
pub struct HiCache<B: Backend = CpuBackend> {
    device: DevicePool<B>,
    host: HostPool<B>,
    mode: TransferMode,
    stats: TransferStats,
    /// Checked mode: laid once at pairing.
    routes: Option<Routes>,
    /// Runs of the transfer in progress, reused (no allocation per transfer once warm).
    scratch: Vec<CopyRun>,
}

/// Runs handed to the backend at once, at most (whole pairs; at least one pair). Bounds the
/// scratch list however long the pair list (64 Ki runs = 1.5 MiB).
pub(crate) const CHUNK_RUNS: u64 = 1 << 16;

/// Pairs per chunk: the whole list when it fits [`CHUNK_RUNS`] (no division on the hot
/// path), else as many whole pairs as fit, at least one.
#[inline]
pub(crate) fn chunk_pairs(pairs: usize, runs_per_pair: u64) -> usize {
    if (pairs as u64).saturating_mul(runs_per_pair) <= CHUNK_RUNS {
        pairs.max(1)
    } else {
        (CHUNK_RUNS / runs_per_pair.max(1)).max(1) as usize
    }
}

/// The routes of a checked pairing of `device` and `host`.
pub(crate) fn routes_of<B: Backend>(
    device: &DevicePool<B>,
    host: &HostPool<B>,
) -> Result<Routes, TransferError> {
    Routes::new(
        (device.geometry(), device.fingerprint(), device.len_bytes()),
        (host.geometry(), host.fingerprint(), host.len_bytes()),
    )
}

/// The per-transfer checks of a checked pairing, all before any byte moves: the pools'
/// fingerprints re-checked against the pairing's (with the checks compiled in), the layer,
/// the list's length against the destination's pages, every page index on both sides, and
/// no destination page twice.
#[inline]
pub(crate) fn check_transfer(
    routes: &Routes,
    fingerprints: (u64, u64),
    direction: Direction,
    layers: Layers,
    pairs: &[PagePair],
) -> Result<(), TransferError> {
    if CHECKS_COMPILED
        && (fingerprints.0 != routes.device_fingerprint
            || fingerprints.1 != routes.host_fingerprint
            || fingerprints.0 != fingerprints.1)
    {
        return Err(TransferError::Fingerprint {
            device: fingerprints.0,
            host: fingerprints.1,
        });
    }
    shim::check_layer(layers, routes.deepest_layers)?;
    // Duplicate destinations are refused in every build: two copies racing into one page
    // (GPU copies in one launch have no order) would tear it.
    shim::check_pair_pages(
        direction,
        routes.device_pages,
        routes.host_pages,
        pairs,
        true,
    )
}

/// With the checks compiled in: every run inside both regions (implied by the routes; kept
/// as the `verify` belt).
#[inline]
pub(crate) fn check_run_ranges(
    direction: Direction,
    routes: &Routes,
    runs: &[CopyRun],
) -> Result<(), TransferError> {
    if !CHECKS_COMPILED {
        return Ok(());
    }
    let (src_len, dst_len) = match direction {
        Direction::Backup => (routes.device_len_bytes, routes.host_len_bytes),
        Direction::Load => (routes.host_len_bytes, routes.device_len_bytes),
    };
    for (i, r) in runs.iter().enumerate() {
        let wrap = |source| TransferError::Range {
            buffer: "(transfer)".into(),
            run: i,
            source,
        };
        check_range(direction.source(), r.src_offset_bytes, r.len_bytes, src_len).map_err(wrap)?;
        check_range(
            direction.destination(),
            r.dst_offset_bytes,
            r.len_bytes,
            dst_len,
        )
        .map_err(wrap)?;
    }
    Ok(())
}

/// The error of a transfer that failed after `moved_runs` runs (pair-major order,
/// `runs_per_pair` each) with `source`; nothing moved gives [`TransferError::Backend`].
pub(crate) fn interrupted(
    pairs: &[PagePair],
    runs_per_pair: u64,
    moved_runs: u64,
    source: BackendError,
) -> TransferError {
    if moved_runs == 0 && !matches!(source, BackendError::Interrupted { .. }) {
        return TransferError::Backend(source);
    }
    let moved = (moved_runs / runs_per_pair) as usize;
    let torn = (!moved_runs.is_multiple_of(runs_per_pair)).then(|| pairs[moved]);
    TransferError::Interrupted {
        moved_pairs: pairs[..moved].to_vec(),
        torn_pair: torn,
        moved_runs,
        source,
    }
}

impl<B: Backend> HiCache<B> {
    /// Pairs `host` with `device` after comparing their geometries once
    /// ([`kvlayout_core::compare`]); refuses with the full mismatch. A host made by
    /// [`HostPool::mirror_of`] always pairs with its device pool. The page routes every
    /// transfer uses are laid here, from both geometries, once.
    pub fn pair(device: DevicePool<B>, host: HostPool<B>) -> Result<Self, PairError> {
        compare(device.geometry(), host.geometry()).map_err(PairError::Mismatch)?;
        let routes = routes_of(&device, &host).map_err(PairError::Route)?;
        Ok(HiCache {
            device,
            host,
            mode: TransferMode::Checked,
            stats: TransferStats::default(),
            routes: Some(routes),
            scratch: Vec::new(),
        })
    }

    /// Pairs without any check, and transfers without any check, with the host's item size on
    /// both sides: the behaviour of an engine without kvlayout (SGLang's HiCache kernels check
    /// only the index tensors, `item_size % 8 == 0` and the layer count). For demonstrating
    /// what the shim prevents.
    pub fn pair_unverified(device: DevicePool<B>, host: HostPool<B>) -> Self {
        HiCache {
            device,
            host,
            mode: TransferMode::Unverified,
            stats: TransferStats::default(),
            routes: None,
            scratch: Vec::new(),
        }
    }

    /// The transfer mode.
    pub fn mode(&self) -> TransferMode {
        self.mode
    }

    /// The device pool.
    pub fn device(&self) -> &DevicePool<B> {
        &self.device
    }

    /// The device pool, mutable (the model writes new tokens here).
    pub fn device_mut(&mut self) -> &mut DevicePool<B> {
        &mut self.device
    }

    /// The host pool.
    pub fn host(&self) -> &HostPool<B> {
        &self.host
    }

    /// The host pool, mutable.
    pub fn host_mut(&mut self) -> &mut HostPool<B> {
        &mut self.host
    }

    /// Transfer counters so far.
    pub fn stats(&self) -> TransferStats {
        self.stats
    }

    /// Both pools back.
    pub fn into_parts(self) -> (DevicePool<B>, HostPool<B>) {
        (self.device, self.host)
    }

    fn sides(&self) -> (Side<'_>, Side<'_>) {
        (
            Side {
                geometry: self.device.geometry(),
                fingerprint: self.device.fingerprint(),
                len_bytes: self.device.len_bytes(),
            },
            Side {
                geometry: self.host.geometry(),
                fingerprint: self.host.fingerprint(),
                len_bytes: self.host.len_bytes(),
            },
        )
    }

    /// The plan a transfer would execute, checked (in [`TransferMode::Checked`]) — nothing is
    /// copied. Runs are listed per buffer in (layer, pair, segment) order; a transfer executes
    /// the same runs pair by pair (every buffer and layer of a pair, then the next pair).
    pub fn plan(
        &self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<TransferPlan, TransferError> {
        let (d, h) = self.sides();
        match self.mode {
            TransferMode::Checked => shim::checked_plan(direction, d, h, layers, pairs),
            TransferMode::Unverified => {
                shim::legacy_plan(direction, d.geometry, h.geometry, layers, pairs)
            }
        }
    }

    /// Checks, then executes a transfer.
    ///
    /// - Any refusal (the shim's checks, a bad layer, a list longer than the destination
    ///   pool's page count, a page out of range on either side, a destination page named
    ///   twice) happens before any byte moves; both pools are left byte for byte as they were.
    /// - An empty list is a no-op: `Ok` with 0 pairs, 0 runs, 0 bytes, not counted in the
    ///   stats (a bad layer is still refused).
    /// - Duplicate *source* pages are allowed (a device page backed up to two host pages; a
    ///   host page loaded into two device pages): reading a page twice is safe, as in SGLang.
    /// - Runs execute pair by pair; if the backend fails part way the error is
    ///   [`TransferError::Interrupted`] naming the pairs moved in full and the torn one, and
    ///   every later pair's destination page is untouched.
    pub fn transfer(
        &mut self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        let result = match &self.routes {
            Some(routes) => Self::transfer_routed(
                routes,
                (&mut self.device, &mut self.host, &mut self.scratch),
                direction,
                layers,
                pairs,
                true,
            ),
            None => self.transfer_legacy(direction, layers, pairs),
        };
        match &result {
            Ok(t) if t.pairs == 0 => {}
            Ok(t) => {
                let counted_pages = match layers {
                    Layers::All | Layers::One(0) => t.pairs,
                    Layers::One(_) => 0,
                };
                let s = &mut self.stats;
                let (calls, pages, bytes) = match direction {
                    Direction::Backup => (
                        &mut s.backups,
                        &mut s.pages_backed_up,
                        &mut s.bytes_backed_up,
                    ),
                    Direction::Load => (&mut s.loads, &mut s.pages_loaded, &mut s.bytes_loaded),
                };
                *calls += 1;
                *pages += counted_pages;
                *bytes = bytes.saturating_add(t.bytes);
            }
            Err(TransferError::Interrupted { .. }) => self.stats.interrupted += 1,
            Err(_) => self.stats.refused += 1,
        }
        result
    }

    /// The checks a transfer makes on its request before it lays any run, alone: the layer,
    /// the list's length, every page index and duplicate destinations (always); the
    /// fingerprints (with the checks compiled in). Moves nothing; counts nothing. Unverified
    /// pairings have no per-transfer checks: `Ok`.
    pub fn check(
        &self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<(), TransferError> {
        match &self.routes {
            Some(routes) => check_transfer(
                routes,
                (self.device.fingerprint(), self.host.fingerprint()),
                direction,
                layers,
                pairs,
            ),
            None => Ok(()),
        }
    }

    /// Everything a transfer does but the copy: the checks, the runs laid from the routes,
    /// their byte ranges (checks compiled in). Moves nothing; counts nothing. Returns what the
    /// transfer would move.
    pub fn dry_run(
        &mut self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        if let Some(routes) = &self.routes {
            return Self::transfer_routed(
                routes,
                (&mut self.device, &mut self.host, &mut self.scratch),
                direction,
                layers,
                pairs,
                false,
            );
        }
        let plan = self.plan(direction, layers, pairs)?;
        Ok(Transferred {
            direction,
            layers,
            pairs: pairs.len() as u64,
            runs: plan.runs().count() as u64,
            bytes: plan.total_bytes(),
            verified: plan.verified,
        })
    }

    /// A checked transfer along `routes` (`execute` false: everything but the copy).
    fn transfer_routed(
        routes: &Routes,
        (device, host, scratch): (&mut DevicePool<B>, &mut HostPool<B>, &mut Vec<CopyRun>),
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
        execute: bool,
    ) -> Result<Transferred, TransferError> {
        check_transfer(
            routes,
            (device.fingerprint(), host.fingerprint()),
            direction,
            layers,
            pairs,
        )?;
        let mut done = Transferred {
            direction,
            layers,
            pairs: 0,
            runs: 0,
            bytes: 0,
            verified: CHECKS_COMPILED,
        };
        if pairs.is_empty() {
            return Ok(done);
        }
        let per_pair = routes.runs_per_pair(layers);
        let chunk_pairs = chunk_pairs(pairs.len(), per_pair);
        for chunk in pairs.chunks(chunk_pairs) {
            scratch.clear();
            for &p in chunk {
                routes.push_pair_runs(direction, layers, p, scratch);
            }
            if let Err(e) = check_run_ranges(direction, routes, scratch) {
                return Err(match e {
                    TransferError::Range { source, .. } if done.runs > 0 => {
                        interrupted(pairs, per_pair, done.runs, source)
                    }
                    e => e,
                });
            }
            let result = match direction {
                _ if !execute => Ok(()),
                Direction::Backup => {
                    device
                        .backend()
                        .device_to_host(device.memory(), host.memory_mut(), scratch)
                }
                Direction::Load => {
                    host.backend()
                        .host_to_device(host.memory(), device.memory_mut(), scratch)
                }
            };
            if let Err(e) = result {
                let in_chunk = match &e {
                    BackendError::Interrupted { completed_runs, .. } => *completed_runs,
                    _ => 0,
                };
                return Err(interrupted(pairs, per_pair, done.runs + in_chunk, e));
            }
            done.pairs += chunk.len() as u64;
            done.runs += scratch.len() as u64;
            done.bytes += scratch.iter().map(|r| r.len_bytes).sum::<u64>();
        }
        Ok(done)
    }

    fn transfer_legacy(
        &mut self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        // Even unverified, a list longer than the destination's page count is refused in
        // O(1): the legacy plan allocates runs per pair and layer.
        let (d, h) = (self.device.geometry().pages, self.host.geometry().pages);
        let dst_pages = match direction {
            Direction::Backup => h,
            Direction::Load => d,
        };
        if pairs.len() as u64 > dst_pages {
            return Err(TransferError::TooManyPairs {
                pairs: pairs.len() as u64,
                side: direction.destination(),
                pages: dst_pages,
            });
        }
        let plan = self.plan(direction, layers, pairs)?;
        let runs = plan.flat_runs();
        let result = match direction {
            Direction::Backup => self.device.backend().device_to_host(
                self.device.memory(),
                self.host.memory_mut(),
                &runs,
            ),
            Direction::Load => self.host.backend().host_to_device(
                self.host.memory(),
                self.device.memory_mut(),
                &runs,
            ),
        };
        result.map_err(TransferError::Backend)?;
        Ok(Transferred {
            direction,
            layers,
            pairs: pairs.len() as u64,
            runs: runs.len() as u64,
            bytes: plan.total_bytes(),
            verified: plan.verified,
        })
    }

    /// Backs up `pairs` (device page -> host page), all layers.
    pub fn backup(&mut self, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Backup, Layers::All, pairs)
    }

    /// Backs up `pairs` for one layer.
    pub fn backup_layer(
        &mut self,
        layer: u64,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Backup, Layers::One(layer), pairs)
    }

    /// Loads `pairs` (host page -> device page), all layers.
    pub fn load(&mut self, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Load, Layers::All, pairs)
    }

    /// Loads `pairs` for one layer (SGLang's layer-wise load overlapping the forward pass).
    pub fn load_layer(
        &mut self,
        layer: u64,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Load, Layers::One(layer), pairs)
    }

    /// The page routes of a checked pairing (for [`crate::ConcurrentHiCache`]).
    pub(crate) fn routes(&self) -> Option<&Routes> {
        self.routes.as_ref()
    }

    /// Both pools, mutable (for [`crate::ConcurrentHiCache`]).
    pub(crate) fn parts_mut(&mut self) -> (&mut DevicePool<B>, &mut HostPool<B>) {
        (&mut self.device, &mut self.host)
    }

    /// Adds a concurrent cache's counters.
    pub(crate) fn add_stats(&mut self, other: TransferStats) {
        let s = &mut self.stats;
        s.backups += other.backups;
        s.loads += other.loads;
        s.pages_backed_up += other.pages_backed_up;
        s.pages_loaded += other.pages_loaded;
        s.bytes_backed_up = s.bytes_backed_up.saturating_add(other.bytes_backed_up);
        s.bytes_loaded = s.bytes_loaded.saturating_add(other.bytes_loaded);
        s.refused += other.refused;
        s.interrupted += other.interrupted;
    }
}

#[cfg(test)]
mod tests {
    use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};

    use super::*;

    fn cache() -> HiCache {
        let device = DevicePool::new(PoolGeometry {
            name: "unit".into(),
            page_size_tokens: 64,
            pages: 4,
            memory_layout: MemoryLayout::LayerFirst,
            buffers: vec![BufferGeometry::new("index_k", 2, formats::INDEX_K_FP8)],
        })
        .unwrap();
        let host = HostPool::mirror_of(&device, 6, MemoryLayout::PageFirst).unwrap();
        HiCache::pair(device, host).unwrap()
    }

    /// Regression: with the checks compiled out (release without `verify`) a page out of range
    /// used to surface as a bare geometry error ("pages: page 9 out of range (4 pages)"),
    /// naming neither the pair nor the side. Index checks are now always on. This test runs in
    /// both modes (`cargo test -p kvlayout-pool` and `--release`).
    #[test]
    fn a_page_out_of_range_names_pair_and_side_with_or_without_verify() {
        let mut c = cache();
        let err = c
            .load(&[PagePair::new(0, 0), PagePair::new(9, 1)])
            .unwrap_err();
        assert_eq!(
            err,
            TransferError::PageOutOfRange {
                pair: 1,
                side: "device",
                page: 9,
                pages: 4
            }
        );
        assert_eq!(c.device().snapshot().unwrap(), vec![0u8; 2 * 4 * 8448]);
    }

    /// A fault in the second chunk of a transfer: the first chunk's pairs and the second
    /// chunk's completed pairs are reported moved, the rest untouched.
    ///
    /// MHA bf16 8 heads x 128 (`section_major`: the K plane, then the V plane, each
    /// 64 x 8 x 256 B) onto a `page_head` host (`[page][head][layer][token][K_h V_h]`, rows of
    /// 2 x 256 = 512 B): no two pieces are contiguous on both sides, so a page of one layer is
    /// 8 heads x 64 tokens x 2 sections = 1024 runs, and a chunk of 65,536 runs holds 64
    /// pairs. 70 pairs = 71,680 runs: chunk 1 = pairs 0..64, chunk 2 = pairs 64..70 (6,144
    /// runs). A budget of 65,536 + 2 x 1,024 + 100 = 67,684 runs: pairs 0..66 move, pair 66
    /// moves its first 100 runs (head 0, tokens 0..50, K and V: the first 50 x 512 = 25,600 B
    /// of the host page), pairs 67..70 nothing.
    #[test]
    fn a_fault_in_a_later_chunk_reports_every_pair_moved_before_it() {
        use crate::backend::FailingCpuBackend;
        let g = |m| PoolGeometry {
            name: "mha".into(),
            page_size_tokens: 64,
            pages: 70,
            memory_layout: m,
            buffers: vec![BufferGeometry::new("kv", 1, formats::MHA_BF16_8X128)],
        };
        let page_bytes = 262_144usize; // 64 tokens x 4096 B
        let make = |backend: FailingCpuBackend| {
            let mut device =
                DevicePool::new_in(backend.clone(), g(MemoryLayout::LayerFirst)).unwrap();
            let fill: Vec<u8> = (0..70 * page_bytes).map(|i| (i % 251) as u8 + 1).collect();
            device.write_bytes(0, &fill).unwrap();
            let host = HostPool::from_geometry_in(backend, g(MemoryLayout::PageHead)).unwrap();
            HiCache::pair(device, host).unwrap()
        };
        let pairs: Vec<PagePair> = (0..70).map(|p| PagePair::new(p, p)).collect();
        let mut full = make(CpuBackend::failing_after(u64::MAX));
        assert_eq!(
            full.dry_run(Direction::Backup, Layers::All, &pairs)
                .unwrap()
                .runs,
            71_680
        );
        full.backup(&pairs).unwrap();
        let want = full.host().snapshot().unwrap();

        let mut c = make(CpuBackend::failing_after(67_684));
        let err = c.backup(&pairs).unwrap_err();
        let TransferError::Interrupted {
            moved_pairs,
            torn_pair,
            moved_runs,
            source,
        } = err
        else {
            panic!("{err}")
        };
        assert_eq!(moved_pairs, pairs[..66]);
        assert_eq!(torn_pair, Some(PagePair::new(66, 66)));
        assert_eq!(moved_runs, 67_684);
        assert!(matches!(
            source,
            BackendError::Interrupted {
                completed_runs: 2_148,
                total_runs: 6_144,
                ..
            }
        ));
        let got = c.host().snapshot().unwrap();
        let page = |m: &[u8], p: usize| m[p * page_bytes..(p + 1) * page_bytes].to_vec();
        for p in 0..66 {
            assert!(page(&got, p) == page(&want, p), "host page {p}");
        }
        let torn = page(&got, 66);
        assert!(torn[..25_600] == page(&want, 66)[..25_600]);
        assert!(torn[25_600..].iter().all(|&b| b == 0));
        assert!(got[67 * page_bytes..].iter().all(|&b| b == 0));
    }

    /// Regression: an empty list used to count as a backup call in the stats, which count
    /// calls that moved data.
    #[test]
    fn an_empty_list_is_not_counted() {
        let mut c = cache();
        assert_eq!(c.backup(&[]).unwrap().bytes, 0);
        assert_eq!(c.stats(), TransferStats::default());
        // One page of both layers of fp8 index-K: 2 x 64 x 132 = 16,896 B.
        assert_eq!(c.backup(&[PagePair::new(1, 5)]).unwrap().bytes, 16_896);
        assert_eq!((c.stats().backups, c.stats().bytes_backed_up), (1, 16_896));
    }
}
