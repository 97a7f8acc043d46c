//! HiCache: a device pool paired with a host pool, and backup (device -> host) / load
//! (host -> device) of page lists, per layer or for all layers (SGLang `HiCacheController`).
//!
//! A pairing owns both pools for its whole life: it hands out shared references
//! ([`HiCache::device`], [`HiCache::host`]) and write-only handles ([`HiCache::device_writer`],
//! [`HiCache::host_writer`]) that change bytes, never a pool's geometry, page count or region,
//! so the routes laid at pairing stay true. [`HiCache::into_parts`] ends the pairing.

use kvlayout_core::compare;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::backend::{Backend, BackendError, CpuBackend, Memory, check_runs};
use crate::checksum::{ChecksumMode, ChecksumTable, copied, load_verdict};
pub use crate::error::PairError;
use crate::error::{PoolError, TransferError};
use crate::plan::{CopyRun, Direction, Layers, PagePair, TransferPlan, Transferred};
use crate::pool::{DevicePool, HostPool, KvPool, PoolWriter};
use crate::route::Routes;
use crate::shim::{self, Side};
use crate::transfer::{TransferStats, check_transfer, facts_of, run_transfer};

/// How transfers are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferMode {
    /// The shim checks every transfer (see [`crate::shim`]).
    Checked,
    /// No check, one item size (the host's) on both sides ([`shim::legacy_plan`]): what an
    /// engine without kvlayout does. For demonstrations (`kvlayout replay --no-verify`).
    Unverified,
}

/// A device pool and its host pool.
///
/// Transfers take `&mut self`: one transfer at a time per cache. For transfers from several
/// threads at once (HiCache's write-back and load threads beside the model), see
/// [`crate::ConcurrentHiCache`].
///
/// A paired pool cannot be replaced: there is no `&mut DevicePool` to swap.
///
/// ```compile_fail
/// # use kvlayout_pool::{DevicePool, HiCache};
/// fn swap(cache: &mut HiCache, other: DevicePool) -> DevicePool {
///     std::mem::replace(cache.device_mut(), other) // no such method
/// }
/// ```
///
/// ```compile_fail
/// # use kvlayout_pool::{DevicePool, HiCache};
/// fn swap(cache: &mut HiCache, mut other: DevicePool) {
///     std::mem::swap(cache.device(), &mut other) // a shared reference
/// }
/// ```
///
/// ```compile_fail
/// # use kvlayout_pool::{DevicePool, HiCache};
/// fn swap(cache: &mut HiCache, mut other: DevicePool) {
///     std::mem::swap(&mut *cache.device_writer(), &mut other) // a writer is not a pool
/// }
/// ```
///
/// What compiles: writing bytes through the handle (the same scaffolding as above).
///
/// ```
/// # use kvlayout_pool::{DevicePool, HiCache};
/// fn write(cache: &mut HiCache) -> Result<(), kvlayout_pool::PoolError> {
///     cache.device_writer().write_bytes(0, &[1, 2, 3])
/// }
/// ```
pub struct HiCache<B: Backend = CpuBackend> {
    /// Copies enqueued and not yet waited for. Declared first, so dropped (waited for) before
    /// the pools are freed.
    in_flight: InFlight<B>,
    device: DevicePool<B>,
    host: HostPool<B>,
    mode: TransferMode,
    stats: TransferStats,
    /// Checked mode: laid once at pairing.
    routes: Option<Routes>,
    /// Runs of the transfer in progress, reused (no allocation per transfer once warm).
    scratch: Vec<CopyRun>,
    /// Page checksums recorded at backup and verified at load ([`HiCache::set_checksum_mode`]);
    /// `None` when off.
    checksums: Option<ChecksumTable>,
    /// Enqueued transfers whose checksums are recorded (backups) or verified (loads) once
    /// their copies are waited for ([`HiCache::complete`]), in enqueue order.
    pending: Vec<PendingChecksums>,
    /// The mismatch (or checksum failure) a wait found, reported once by
    /// [`HiCache::complete`] (or the next transfer).
    checksum_failure: Option<TransferError>,
}

/// An enqueued transfer's pages, to checksum once its copy is waited for.
struct PendingChecksums {
    layers: Layers,
    pairs: Vec<PagePair>,
    /// A backup's checksums are recorded; a load's (with what it moved) verified.
    load: Option<Transferred>,
}

impl<B: Backend> HiCache<B> {
    /// Pairs `host` with `device` after comparing their geometries once
    /// ([`kvlayout_core::compare`]); refuses with the full mismatch. A host made by
    /// [`HostPool::mirror_of`] always pairs with its device pool. The page routes every
    /// transfer uses are laid here, from both geometries, once, and each pool's fingerprint,
    /// page count and region length recorded for the per-transfer checks.
    ///
    /// # Errors
    ///
    /// [`PairError::Mismatch`] with every differing field when the geometries differ;
    /// [`PairError::Route`] when the page routes cannot be laid from the two geometries.
    pub fn pair(device: DevicePool<B>, host: HostPool<B>) -> Result<Self, PairError> {
        compare(device.geometry(), host.geometry()).map_err(PairError::Mismatch)?;
        let routes = Routes::new(
            (device.geometry(), facts_of(&device)),
            (host.geometry(), facts_of(&host)),
        )
        .map_err(PairError::Route)?;
        Ok(HiCache {
            in_flight: InFlight::new([device.backend().clone(), host.backend().clone()]),
            device,
            host,
            mode: TransferMode::Checked,
            stats: TransferStats::default(),
            routes: Some(routes),
            scratch: Vec::new(),
            checksums: None,
            pending: Vec::new(),
            checksum_failure: None,
        })
    }

    /// Pairs without any check, and transfers without any check, with the host's item size on
    /// both sides: the behaviour of an engine without kvlayout (SGLang's HiCache kernels check
    /// only the index tensors, `item_size % 8 == 0` and the layer count). For demonstrating
    /// what the shim prevents.
    pub fn pair_unverified(device: DevicePool<B>, host: HostPool<B>) -> Self {
        HiCache {
            in_flight: InFlight::new([device.backend().clone(), host.backend().clone()]),
            device,
            host,
            mode: TransferMode::Unverified,
            stats: TransferStats::default(),
            routes: None,
            scratch: Vec::new(),
            checksums: None,
            pending: Vec::new(),
            checksum_failure: None,
        }
    }

    /// The transfer mode.
    pub fn mode(&self) -> TransferMode {
        self.mode
    }

    /// Sets which pages are checksummed ([`crate::checksum`]): `Off` (the default), `Sampled(N)`
    /// (host pages whose index is a multiple of N) or `All`. A backup then records each covered
    /// page's checksum (of the device page, under the device geometry: its buffers' token
    /// fingerprints and model layer ids) in a host-side table of one entry per buffer, layer and
    /// host page; a load verifies each covered device page it wrote against the entry of its
    /// host page after the copy and before it returns, and refuses mismatching pages with
    /// [`TransferError::ChecksumMismatch`] (the copy ran: the caller treats those pages as a miss
    /// and recomputes them), counted in [`TransferStats::checksum_mismatches`]. A host page
    /// never backed up with a checksum is not verified. Setting a mode clears the table (pages
    /// backed up before are not verified). Enqueued transfers ([`HiCache::enqueue`]) are
    /// checksummed when they are waited for, not at enqueue, so they still overlap the caller's
    /// work: [`HiCache::complete`] records the backups' checksums and verifies the loads', and
    /// reports a mismatch there (the pages are refused as for [`HiCache::transfer`]); an
    /// enqueued load into a device page that an earlier enqueued transfer still has to checksum
    /// waits for it first. Costs one read of every covered page payload per backup and load
    /// (benchmark: BENCHMARKS.md, "Page checksum").
    ///
    /// # Errors
    /// [`TransferError::Geometry`] when the table's size (layers x host pages per buffer)
    /// overflows, or a buffer's checksum key cannot be computed.
    pub fn set_checksum_mode(&mut self, mode: ChecksumMode) -> Result<(), TransferError> {
        // Pending checksums are made under the old mode (a mismatch stays kept for
        // `complete`), then the table is replaced.
        self.settle_checksums();
        self.checksums =
            ChecksumTable::new(mode, self.device.geometry(), self.host.geometry().pages)?;
        Ok(())
    }

    /// The checksum mode ([`HiCache::set_checksum_mode`]).
    pub fn checksum_mode(&self) -> ChecksumMode {
        self.checksums
            .as_ref()
            .map_or(ChecksumMode::Off, ChecksumTable::mode)
    }

    /// After a transfer whose copy was waited for: a backup that copied records its pages'
    /// checksums; a load that copied verifies them (see [`HiCache::set_checksum_mode`]).
    fn checksum_after(
        &mut self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
        result: Result<Transferred, TransferError>,
    ) -> Result<Transferred, TransferError> {
        let Some(table) = self.checksums.as_mut() else {
            return result;
        };
        if !copied(direction, &result) {
            return result;
        }
        match direction {
            Direction::Backup => {
                let sums = table.device_sums(&self.device, layers, pairs, false)?;
                table.record(&sums);
                result
            }
            Direction::Load => {
                let transferred = result?;
                let sums = table.device_sums(&self.device, layers, pairs, true)?;
                load_verdict(&mut self.stats, transferred, table.compare(&sums))
            }
        }
    }

    /// Waits for enqueued copies, then records (backups) and verifies (loads) the checksums of
    /// the enqueued transfers that wait for them, in enqueue order; a mismatch (or a failure to
    /// checksum) is kept for [`HiCache::complete`], later loads' mismatches added to it.
    fn settle_checksums(&mut self) {
        self.in_flight.settle();
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        let Some(table) = self.checksums.as_mut() else {
            return;
        };
        for p in pending {
            let outcome = match p.load {
                None => table
                    .device_sums(&self.device, p.layers, &p.pairs, false)
                    .map(|sums| table.record(&sums)),
                Some(transferred) => table
                    .device_sums(&self.device, p.layers, &p.pairs, true)
                    .and_then(|sums| {
                        load_verdict(&mut self.stats, transferred, table.compare(&sums)).map(|_| ())
                    }),
            };
            if let Err(e) = outcome {
                match (&mut self.checksum_failure, e) {
                    (
                        Some(TransferError::ChecksumMismatch {
                            checksummed_pages,
                            mismatches,
                            ..
                        }),
                        TransferError::ChecksumMismatch {
                            checksummed_pages: more_pages,
                            mismatches: more,
                            ..
                        },
                    ) => {
                        *checksummed_pages = checksummed_pages.saturating_add(more_pages);
                        mismatches.extend(more);
                    }
                    // A failure to checksum (a device read failing) is kept first; a mismatch
                    // beside it is still counted in the stats.
                    (Some(_), _) => {}
                    (kept @ None, e) => *kept = Some(e),
                }
            }
        }
    }

    /// Whether an enqueued load into the device pages of `pairs` must first wait for the
    /// enqueued transfers whose checksums are pending: it would overwrite a device page one of
    /// them checksums at the wait (a backup's source, a load's destination).
    fn load_overwrites_pending(&self, pairs: &[PagePair]) -> bool {
        self.pending.iter().any(|p| {
            p.pairs
                .iter()
                .any(|q| pairs.iter().any(|n| n.device_page == q.device_page))
        })
    }

    /// The failure an enqueued copy or its checksums showed at a wait, once (the copy's first).
    fn take_wait_failure(&mut self) -> Result<(), TransferError> {
        self.in_flight
            .take_failure()
            .map_err(TransferError::Backend)?;
        self.checksum_failure.take().map_or(Ok(()), Err)
    }

    /// The device pool (read only: a paired pool cannot be replaced or resized). Waits for
    /// enqueued transfers first ([`HiCache::enqueue`]; a failure is kept for
    /// [`HiCache::complete`]). With checksums on, enqueued loads' pages are verified by
    /// [`HiCache::complete`], not here: call it before handing their layers to the model.
    pub fn device(&self) -> &DevicePool<B> {
        self.in_flight.settle();
        &self.device
    }

    /// The host pool (read only); waits as [`HiCache::device`] does.
    pub fn host(&self) -> &HostPool<B> {
        self.in_flight.settle();
        &self.host
    }

    /// Writes into the device pool's bytes, pages and tokens (what the model does); the pool
    /// itself stays paired. Waits as [`HiCache::device`] does.
    pub fn device_writer(&mut self) -> PoolWriter<'_, DevicePool<B>> {
        self.settle_checksums();
        PoolWriter::new(&mut self.device)
    }

    /// Writes into the host pool's bytes, pages and tokens; waits as [`HiCache::device`] does.
    pub fn host_writer(&mut self) -> PoolWriter<'_, HostPool<B>> {
        self.settle_checksums();
        PoolWriter::new(&mut self.host)
    }

    /// Copies `runs` from `src` (`src_offset_bytes`, a host region of this cache's backend)
    /// into the device pool's region (`dst_offset_bytes`), in list order, and waits: how a
    /// model's freshly computed pages land from a staging buffer in one call
    /// ([`crate::page_copy_runs`] lays the runs of a page). Waits for enqueued transfers
    /// first.
    ///
    /// # Errors
    ///
    /// [`BackendError::OutOfRange`] for the first run outside `src` or the device region, with no
    /// byte moved; the backend's copy errors as [`Backend::host_to_device`]; a failure of an
    /// enqueued transfer found by the wait first (as [`HiCache::complete`]).
    pub fn write_device_runs(
        &mut self,
        src: &B::HostMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        self.settle_checksums();
        self.in_flight.take_failure()?;
        check_runs(
            Direction::Load,
            src.len_bytes(),
            self.device.len_bytes(),
            runs,
        )?;
        let device = &mut self.device;
        device
            .backend()
            .clone()
            .host_to_device(src, device.memory_mut(), runs)
    }

    /// Writes a canonical page payload into the device pool ([`KvPool::write_page`]), after
    /// waiting for enqueued transfers.
    ///
    /// # Errors
    ///
    /// The errors of [`KvPool::write_page`] on the device pool; a failure of an enqueued transfer
    /// found by the wait first (as [`HiCache::complete`]).
    pub fn write_page(
        &mut self,
        buffer: usize,
        layer: u64,
        page: u64,
        data: &[u8],
    ) -> Result<(), PoolError> {
        self.settle_checksums();
        self.device.write_page(buffer, layer, page, data)
    }

    /// Writes one token's entry into the device pool ([`KvPool::write_token`]).
    ///
    /// # Errors
    ///
    /// The errors of [`KvPool::write_token`] on the device pool; a failure of an enqueued transfer
    /// found by the wait first (as [`HiCache::complete`]).
    pub fn write_token(
        &mut self,
        buffer: usize,
        layer: u64,
        page: u64,
        token: u64,
        sections: &[&[u8]],
    ) -> Result<(), PoolError> {
        self.settle_checksums();
        self.device
            .write_token(buffer, layer, page, token, sections)
    }

    /// Transfer counters so far.
    pub fn stats(&self) -> TransferStats {
        self.stats
    }

    /// Copies `runs` from the device pool's region (`src_offset_bytes`) into `dst`
    /// (`dst_offset_bytes`, a host region of this cache's backend), in list order, and waits: many
    /// pages read back in one call instead of one read each. Waits for enqueued transfers first.
    ///
    /// # Errors
    ///
    /// As [`HiCache::write_device_runs`] (sides named for a backup: `device` source, `host`
    /// destination).
    pub fn read_device_runs(
        &mut self,
        dst: &mut B::HostMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        self.settle_checksums();
        self.in_flight.take_failure()?;
        check_runs(
            Direction::Backup,
            self.device.len_bytes(),
            dst.len_bytes(),
            runs,
        )?;
        self.device
            .backend()
            .device_to_host(self.device.memory(), dst, runs)
    }

    /// Both pools back (the pairing ends), after waiting for enqueued transfers (a failure
    /// is dropped: call [`HiCache::complete`] first to see it).
    pub fn into_parts(self) -> (DevicePool<B>, HostPool<B>) {
        self.in_flight.settle();
        (self.device, self.host)
    }

    fn sides(&self) -> (Side<'_>, Side<'_>) {
        (
            Side {
                geometry: self.device.geometry(),
                len_bytes: self.device.len_bytes(),
            },
            Side {
                geometry: self.host.geometry(),
                len_bytes: self.host.len_bytes(),
            },
        )
    }

    /// The plan a transfer would execute — nothing is copied. In [`TransferMode::Checked`],
    /// checked in every build by [`shim::checked_plan`] (the field-by-field geometry
    /// comparison, pages, byte ranges). Runs are listed per buffer in (layer, pair, segment)
    /// order; a transfer executes the same runs pair by pair (every buffer and layer of a
    /// pair, then the next pair).
    ///
    /// # Errors
    ///
    /// As [`crate::shim::checked_plan`]: the pools not the paired ones, a geometry mismatch, a bad
    /// layer or page, or a run outside a region, each named.
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
    /// - Any refusal (see [`crate::shim`] for the checks: the pools still the paired ones, a
    ///   bad layer, a list longer than the destination pool's page count, a page out of range
    ///   on either side, a destination page named twice, a run outside a region) happens
    ///   before any byte moves; both pools are left byte for byte as they were.
    /// - An empty list is a no-op: `Ok` with 0 pairs, 0 runs, 0 bytes, not counted in the
    ///   stats (a bad layer is still refused).
    /// - Duplicate *source* pages are allowed (a device page backed up to two host pages; a
    ///   host page loaded into two device pages): reading a page twice is safe, as in SGLang.
    /// - Runs execute pair by pair; if the backend fails part way with
    ///   [`BackendError::Interrupted`] the error is [`TransferError::Interrupted`] naming the
    ///   pairs moved in full and the torn one, and every later pair's destination page is
    ///   untouched. A driver error of the CUDA backend after the checks
    ///   ([`BackendError::Driver`]) may leave destination pages partly written (see
    ///   [`BackendError`]).
    ///
    /// # Errors
    ///
    /// Every refusal of the list above ([`TransferError`], naming the field, the pair and both
    /// values), before any byte moves; [`TransferError::Backend`] when the backend fails after the
    /// checks; with checksums on, [`TransferError::ChecksumMismatch`] for a load whose pages
    /// differ from their backup's. A failure or checksum mismatch of an earlier enqueued
    /// transfer that a wait found and no [`HiCache::complete`] reported is returned first, in
    /// place of this transfer (nothing moved).
    pub fn transfer(
        &mut self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        self.settle_checksums();
        self.take_wait_failure()?;
        let result = match self.routes.is_some() {
            true => self.transfer_routed(direction, layers, pairs, CopyMode::Wait),
            false => self.transfer_legacy(direction, layers, pairs),
        };
        let result = self.checksum_after(direction, layers, pairs, result);
        self.stats.record(direction, layers, &result);
        result
    }

    /// [`HiCache::transfer`] without the wait (checked pairings): the same checks, all before
    /// any byte moves, with the same errors (a refusal leaves both pools untouched and is
    /// counted as [`HiCache::transfer`] counts it); then the copy is started and this returns
    /// what it will move, while the backend copies (CUDA: on the GPU's stream, in order after
    /// every transfer before it; CPU backends: copied before it returns). The CPU work of the
    /// caller's step can run meanwhile.
    ///
    /// The pools cannot be reached while the copy runs: every accessor ([`HiCache::device`],
    /// [`HiCache::host`], the writers, transfers, [`HiCache::into_parts`], dropping the cache)
    /// waits for it first. [`HiCache::complete`] waits and reports a copy that failed while
    /// running ([`TransferError::Backend`]; the transfer stays counted as moved).
    ///
    /// With checksums on ([`HiCache::set_checksum_mode`]) this does not wait either: the
    /// transfer's pages are checksummed when [`HiCache::complete`] (or any other wait) waits
    /// for the copy; a backup's are recorded then, a load's verified then, and a mismatch is
    /// reported by `complete` ([`TransferError::ChecksumMismatch`]). Only a load into a device
    /// page that an earlier enqueued transfer still has to checksum waits for it at enqueue.
    ///
    /// # Errors
    ///
    /// [`HiCache::transfer`]'s; [`TransferError::Unsupported`] for an unverified pairing; a failure
    /// of an earlier enqueued transfer, or a checksum mismatch of an earlier enqueued load, found
    /// by a wait before this call.
    pub fn enqueue(
        &mut self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        if direction == Direction::Load && self.load_overwrites_pending(pairs) {
            self.settle_checksums();
        }
        self.take_wait_failure()?;
        let result = self.transfer_routed(direction, layers, pairs, CopyMode::Enqueue);
        if self.checksums.is_some() && copied(direction, &result) {
            self.pending.push(PendingChecksums {
                layers,
                pairs: pairs.to_vec(),
                // A load that copied is `Ok` (only a backup counts as copied when torn).
                load: match direction {
                    Direction::Backup => None,
                    Direction::Load => result.as_ref().ok().copied(),
                },
            });
        }
        self.stats.record(direction, layers, &result);
        result
    }

    /// The failure of an enqueued copy that an earlier wait found, if any (reported once), so a
    /// caller can stop on it before it enqueues more: without it the next
    /// [`HiCache::enqueue`] returns it, in place of its own transfer. Does not wait.
    ///
    /// # Errors
    ///
    /// [`TransferError::Backend`] with the first enqueued copy found failed; else a
    /// [`TransferError::ChecksumMismatch`] of enqueued loads that an earlier wait verified.
    pub fn copy_failure(&mut self) -> Result<(), TransferError> {
        self.take_wait_failure()
    }

    /// Waits for every transfer started by [`HiCache::enqueue`]; with checksums on, then
    /// records the enqueued backups' checksums and verifies the enqueued loads' pages (in
    /// enqueue order) before it returns, so before the caller hands their layers to the model.
    ///
    /// # Errors
    ///
    /// [`TransferError::Backend`] with the first copy that failed while running (its bytes, and
    /// those of transfers enqueued after it, may have moved in part); else
    /// [`TransferError::ChecksumMismatch`] naming every refused page of the enqueued loads
    /// (`transferred`: the first mismatching load's; `checksummed_pages` and `mismatches` over
    /// all of them), each counted in [`TransferStats::checksum_mismatches`]. A checksum mismatch
    /// found beside a copy failure is kept for the next call.
    pub fn complete(&mut self) -> Result<(), TransferError> {
        self.settle_checksums();
        self.take_wait_failure()
    }

    /// The checks a transfer makes before it lays any run, alone (see [`crate::shim`]). Moves
    /// nothing; counts nothing. Unverified pairings have no per-transfer checks: `Ok`.
    ///
    /// # Errors
    ///
    /// The refusal [`HiCache::transfer`] would make for this list, before laying runs: pools not
    /// the paired ones, a bad layer, too many pairs, a page out of range, a destination page named
    /// twice.
    pub fn check(
        &self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<(), TransferError> {
        match &self.routes {
            Some(routes) => check_transfer(
                routes,
                (facts_of(&self.device), facts_of(&self.host)),
                direction,
                layers,
                pairs,
            ),
            None => Ok(()),
        }
    }

    /// Everything a transfer does but the copy: the checks and the runs laid from the routes.
    /// Moves nothing; counts nothing. Returns what the transfer would move.
    ///
    /// # Errors
    ///
    /// As [`HiCache::check`], plus a run outside a region.
    pub fn dry_run(
        &mut self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        if self.routes.is_some() {
            return self.transfer_routed(direction, layers, pairs, CopyMode::Skip);
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

    /// A checked transfer along the pairing's routes ([`CopyMode`]: waited for, enqueued, or
    /// everything but the copy).
    fn transfer_routed(
        &mut self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
        copy: CopyMode,
    ) -> Result<Transferred, TransferError> {
        let HiCache {
            in_flight,
            device,
            host,
            routes: Some(routes),
            scratch,
            ..
        } = self
        else {
            return Err(TransferError::Unsupported {
                field: "mode".into(),
                reason: "a routed transfer needs a checked pairing",
            });
        };
        check_transfer(
            routes,
            (facts_of(device), facts_of(host)),
            direction,
            layers,
            pairs,
        )?;
        run_transfer(routes, direction, layers, pairs, scratch, |runs| {
            match (copy, direction) {
                (CopyMode::Skip, _) => Ok(()),
                (CopyMode::Wait, Direction::Backup) => {
                    device
                        .backend()
                        .device_to_host(device.memory(), host.memory_mut(), runs)
                }
                (CopyMode::Wait, Direction::Load) => {
                    host.backend()
                        .host_to_device(host.memory(), device.memory_mut(), runs)
                }
                (CopyMode::Enqueue, Direction::Backup) => {
                    in_flight.mark(DEVICE_SIDE);
                    // SAFETY: the pools are owned by this cache, and every way to them (the
                    // accessors, transfers, `into_parts`, dropping the cache: `in_flight` is
                    // its first field) waits for `in_flight` first.
                    unsafe {
                        device.backend().enqueue_device_to_host(
                            device.memory(),
                            host.memory_mut(),
                            runs,
                        )
                    }
                }
                (CopyMode::Enqueue, Direction::Load) => {
                    in_flight.mark(HOST_SIDE);
                    // SAFETY: as for the backup just above.
                    unsafe {
                        host.backend().enqueue_host_to_device(
                            host.memory(),
                            device.memory_mut(),
                            runs,
                        )
                    }
                }
            }
        })
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
    ///
    /// # Errors
    ///
    /// As [`HiCache::transfer`].
    pub fn backup(&mut self, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Backup, Layers::All, pairs)
    }

    /// Backs up `pairs` for one layer.
    ///
    /// # Errors
    ///
    /// As [`HiCache::transfer`].
    pub fn backup_layer(
        &mut self,
        layer: u64,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Backup, Layers::One(layer), pairs)
    }

    /// Loads `pairs` (host page -> device page), all layers.
    ///
    /// # Errors
    ///
    /// As [`HiCache::transfer`].
    pub fn load(&mut self, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Load, Layers::All, pairs)
    }

    /// Loads `pairs` for one layer (SGLang's layer-wise load overlapping the forward pass).
    ///
    /// # Errors
    ///
    /// As [`HiCache::transfer`].
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

    /// Both pools, mutable (for [`crate::ConcurrentHiCache`], which keeps them paired), after
    /// waiting for enqueued transfers.
    pub(crate) fn parts_mut(&mut self) -> (&mut DevicePool<B>, &mut HostPool<B>) {
        self.settle_checksums();
        (&mut self.device, &mut self.host)
    }

    /// The checksum table (pending checksums made first), for [`crate::ConcurrentHiCache`].
    pub(crate) fn take_checksums(&mut self) -> Option<ChecksumTable> {
        self.settle_checksums();
        self.checksums.take()
    }

    /// Puts back a table [`HiCache::take_checksums`] took.
    pub(crate) fn put_checksums(&mut self, table: Option<ChecksumTable>) {
        self.checksums = table;
    }

    /// Adds a concurrent cache's counters.
    pub(crate) fn add_stats(&mut self, other: TransferStats) {
        self.stats.add(other);
    }
}

#[cfg(test)]
mod tests;

/// What a routed transfer does with its runs.
#[derive(Clone, Copy)]
enum CopyMode {
    /// Copies and waits ([`HiCache::transfer`]).
    Wait,
    /// Starts the copy ([`HiCache::enqueue`]).
    Enqueue,
    /// Lays the runs only ([`HiCache::dry_run`]).
    Skip,
}

/// Which backend a copy is enqueued on: the device pool's (backups) or the host pool's (loads).
const DEVICE_SIDE: usize = 0;
const HOST_SIDE: usize = 1;

/// Whether copies were enqueued since the last wait, and the first failure a wait found. Waits
/// when dropped.
///
/// It waits on the backends of both pools (a backup is enqueued on the device pool's backend, a
/// load on the host pool's; two instances of one backend type, such as two `CudaBackend`s with
/// two streams, pair). When they are two queues, an enqueue on one side after copies on the
/// other waits for those first, so transfers keep their order. The lock is held across a wait,
/// so a second reader that finds copies in flight waits until they are done instead of reading
/// while the first one waits.
struct InFlight<B: Backend> {
    /// The device pool's backend, then the host pool's unless one wait covers both
    /// ([`Backend::shares_waits_with`]: a duplicate wait costs a stream synchronisation).
    backends: Vec<B>,
    /// Copies were enqueued since the last wait. Set under the lock before a copy is
    /// enqueued, cleared under it only after the waits returned: read false without the lock,
    /// nothing is in flight (the transfers' and accessors' path takes no lock then).
    enqueued: AtomicBool,
    state: Mutex<InFlightState>,
}

#[derive(Default)]
struct InFlightState {
    /// The side the last copy was enqueued on.
    last_side: Option<usize>,
    failure: Option<BackendError>,
}

impl<B: Backend> InFlight<B> {
    fn new([device, host]: [B; 2]) -> Self {
        let backends = if device.shares_waits_with(&host) {
            vec![device]
        } else {
            vec![device, host]
        };
        InFlight {
            backends,
            enqueued: AtomicBool::new(false),
            state: Mutex::new(InFlightState::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, InFlightState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits on every backend (the lock held by the caller); keeps the first failure; clears
    /// the flag after the waits.
    fn wait_all(&self, state: &mut InFlightState) {
        for backend in &self.backends {
            if let Err(e) = backend.wait() {
                state.failure.get_or_insert(e);
            }
        }
        state.last_side = None;
        self.enqueued.store(false, Ordering::SeqCst);
    }

    /// A copy is about to be enqueued on `side` (marked before it is: a panic part way still
    /// waits). On two queues, copies in flight on the other side are waited for first.
    fn mark(&self, side: usize) {
        let mut state = self.state();
        if self.backends.len() == 2
            && self.enqueued.load(Ordering::SeqCst)
            && state.last_side != Some(side)
        {
            self.wait_all(&mut state);
        }
        self.enqueued.store(true, Ordering::SeqCst);
        state.last_side = Some(side);
    }

    /// Waits for enqueued copies, if any, on both backends; keeps the first failure. Cleared
    /// only after the waits returned, under the lock.
    fn settle(&self) {
        if !self.enqueued.load(Ordering::SeqCst) {
            return;
        }
        let mut state = self.state();
        if self.enqueued.load(Ordering::SeqCst) {
            self.wait_all(&mut state);
        }
    }

    /// The failure a wait found, once.
    fn take_failure(&self) -> Result<(), BackendError> {
        self.state().failure.take().map_or(Ok(()), Err)
    }
}

impl<B: Backend> Drop for InFlight<B> {
    fn drop(&mut self) {
        // The pools are dropped (freed) right after this: a wait that panics, so that a copy
        // may still be running, must not unwind into freeing them.
        let settled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.settle()));
        if settled.is_err() {
            std::process::abort();
        }
    }
}
