//! Transfers from several threads at once on one CPU-backend HiCache.
//!
//! A serving engine runs HiCache transfers beside the model: SGLang's `HiCacheController` has
//! a write-back thread (backup) and a load thread, each on its own CUDA stream, while the
//! forward pass writes other device pages. The radix tree guarantees the pages they touch are
//! disjoint; [`ConcurrentHiCache`] takes that as a checked rule instead of a promise: each
//! transfer claims its destination pages exclusively and its source pages shared (one atomic
//! per page of each pool, [`crate::claim`]) before any byte moves, and a transfer that would
//! touch a page claimed by another in a conflicting way is refused with
//! [`TransferError::Busy`] — nothing moved. Distinct (buffer, layer, page) ranges of a pool
//! never overlap (a geometry rule, property-tested in `layout-core`), and every run of a pair
//! lies in that pair's pages, so claimed-disjoint transfers touch disjoint bytes and run in
//! parallel without locks.
//!
//! Checksums ([`ConcurrentHiCache::set_checksum_mode`], as the pairing's): a backup records its
//! device pages' checksums and a load verifies its device pages, each while it still holds its
//! page claims, so before the call returns and the layer is handed to the model.
//!
//! CPU backend only: there is no concurrent path for the CUDA backend (it has one context and
//! one stream; transfers on it go through [`HiCache`], one at a time).

use std::sync::Mutex;

use kvlayout_core::PoolGeometry;

use crate::backend::{BackendError, CpuBackend, check_range, check_runs};
use crate::checksum::{ChecksumMode, ChecksumTable, copied, load_verdict};
use crate::claim::{AtomicU32, Claims};
use crate::error::{PoolError, TransferError};
use crate::hicache::HiCache;
use crate::plan::{CopyRun, Direction, Layers, PagePair, Transferred};
use crate::pool::KvPool;
use crate::route::Routes;
use crate::transfer::{TransferStats, check_transfer, facts_of, run_transfer};

/// A [`HiCache`] (CPU backend, checked pairing) shared by reference between threads:
/// [`backup`](Self::backup) / [`load`](Self::load) (and `_layer`) take `&self`, and the model
/// writes device pages with [`write_device_page`](Self::write_device_page), all at the same
/// time on disjoint pages. Two transfers conflict when one's destination page is the other's
/// source or destination page on the same side; the later claim is refused with
/// [`TransferError::Busy`] and moves no byte. Memory: one 4-byte claim word per page of each
/// pool. The pools stay paired: no method hands out a pool, mutable or not.
pub struct ConcurrentHiCache {
    cache: HiCache<CpuBackend>,
    routes: Routes,
    device: Region,
    host: Region,
    device_claims: Box<[AtomicU32]>,
    host_claims: Box<[AtomicU32]>,
    stats: Mutex<TransferStats>,
    /// Page checksums, taken from the cache (and given back by `into_inner`); `None` when off.
    checksums: Option<ChecksumTable>,
    /// A content fault the next copy of its direction makes (unit tests: the concurrent path
    /// copies through the regions, not a backend, so a fault backend cannot inject it).
    #[cfg(test)]
    fault: Mutex<Option<crate::ContentFault>>,
}

/// A pool's bytes, shared: written only under an exclusive page claim.
struct Region {
    ptr: *mut u8,
    len_bytes: u64,
}

// SAFETY: a `Region` points into a `Vec<u8>` owned by the `HiCache` inside the
// `ConcurrentHiCache` that holds the region; the vector is never moved, resized or accessed
// through the `HiCache` while the region exists (the cache is private and only read for its
// geometry and fingerprints). Through the region, bytes are written only by the holder of the
// exclusive claim of the page containing them and read only under a shared or exclusive claim
// of their page, and pages' byte ranges are disjoint; so no two threads access a byte with one
// of them writing, whichever thread holds the region.
unsafe impl Send for Region {}
// SAFETY: as above: shared access goes through the page claims.
unsafe impl Sync for Region {}

fn claim_words(pages: u64, side: &'static str) -> Result<Box<[AtomicU32]>, TransferError> {
    let n = usize::try_from(pages).map_err(|_| {
        TransferError::Backend(BackendError::Alloc {
            side,
            len_bytes: pages.saturating_mul(4),
            reason: "claim words larger than the address space".into(),
        })
    })?;
    Ok((0..n).map(|_| AtomicU32::new(0)).collect())
}

impl ConcurrentHiCache {
    /// Shares `cache` between threads, with its checksum mode and the checksums it recorded
    /// ([`HiCache::set_checksum_mode`]). Refuses a cache paired with
    /// [`HiCache::pair_unverified`] (its legacy plans may address other pages, so page claims
    /// would not make transfers disjoint): [`TransferError::Unsupported`] on `mode`.
    ///
    /// # Errors
    ///
    /// [`TransferError::Unsupported`] naming `mode` for a cache paired with
    /// [`HiCache::pair_unverified`].
    pub fn new(mut cache: HiCache<CpuBackend>) -> Result<Self, TransferError> {
        let Some(routes) = cache.routes().cloned() else {
            return Err(TransferError::Unsupported {
                field: "mode".into(),
                reason: "an unverified pairing cannot be shared (its transfers are not \
                         confined to the pages they name); pair with HiCache::pair",
            });
        };
        let device_claims = claim_words(routes.device.pages, "device")?;
        let host_claims = claim_words(routes.host.pages, "host")?;
        let checksums = cache.take_checksums();
        let (d, h) = cache.parts_mut();
        let device = Region {
            len_bytes: d.len_bytes(),
            ptr: d.memory_mut().as_mut_ptr(),
        };
        let host = Region {
            len_bytes: h.len_bytes(),
            ptr: h.memory_mut().as_mut_ptr(),
        };
        Ok(ConcurrentHiCache {
            cache,
            routes,
            device,
            host,
            device_claims,
            host_claims,
            stats: Mutex::new(TransferStats::default()),
            checksums,
            #[cfg(test)]
            fault: Mutex::new(None),
        })
    }

    /// Sets which pages are checksummed, as [`HiCache::set_checksum_mode`] (`&mut`: no transfer
    /// runs meanwhile). A backup records each covered page's checksum (of the device page,
    /// under the device geometry) in the host-side table, while it holds the page claims; a
    /// load verifies each covered device page it wrote against its host page's entry before it
    /// releases its claims and returns, and refuses mismatching pages with
    /// [`TransferError::ChecksumMismatch`] (the copy ran: the caller treats them as a miss),
    /// counted in [`TransferStats::checksum_mismatches`]. Setting a mode clears the table.
    ///
    /// # Errors
    /// As [`HiCache::set_checksum_mode`].
    pub fn set_checksum_mode(&mut self, mode: ChecksumMode) -> Result<(), TransferError> {
        self.checksums =
            ChecksumTable::new(mode, self.cache.device().geometry(), self.routes.host.pages)?;
        Ok(())
    }

    /// The checksum mode ([`ConcurrentHiCache::set_checksum_mode`]).
    pub fn checksum_mode(&self) -> ChecksumMode {
        self.checksums
            .as_ref()
            .map_or(ChecksumMode::Off, ChecksumTable::mode)
    }

    /// The cache back, with this one's transfer counters added to its stats.
    pub fn into_inner(self) -> HiCache<CpuBackend> {
        let mut cache = self.cache;
        cache.put_checksums(self.checksums);
        let stats = self
            .stats
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        cache.add_stats(stats);
        cache
    }

    /// The device pool's geometry.
    pub fn device_geometry(&self) -> &PoolGeometry {
        self.cache.device().geometry()
    }

    /// Counters of the transfers made through this handle so far.
    pub fn stats(&self) -> TransferStats {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Backs up `pairs`, all layers (see [`ConcurrentHiCache::transfer`]).
    ///
    /// # Errors
    ///
    /// As [`ConcurrentHiCache::transfer`].
    pub fn backup(&self, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Backup, Layers::All, pairs)
    }

    /// Backs up `pairs` for one layer.
    ///
    /// # Errors
    ///
    /// As [`ConcurrentHiCache::transfer`].
    pub fn backup_layer(
        &self,
        layer: u64,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Backup, Layers::One(layer), pairs)
    }

    /// Loads `pairs`, all layers.
    ///
    /// # Errors
    ///
    /// As [`ConcurrentHiCache::transfer`].
    pub fn load(&self, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Load, Layers::All, pairs)
    }

    /// Loads `pairs` for one layer.
    ///
    /// # Errors
    ///
    /// As [`ConcurrentHiCache::transfer`].
    pub fn load_layer(&self, layer: u64, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Load, Layers::One(layer), pairs)
    }

    /// The checks of [`HiCache::transfer`], then the page claims, then the copy. Refusals,
    /// including [`TransferError::Busy`], move no byte; an empty list is a no-op.
    ///
    /// # Errors
    ///
    /// The refusals of [`HiCache::transfer`], and [`TransferError::Busy`] when another transfer or
    /// a page write holds one of the pages; both move no byte. A backend failure during the copy as
    /// [`HiCache::transfer`].
    pub fn transfer(
        &self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        let result = self.transfer_claimed(direction, layers, pairs);
        self.stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .record(direction, layers, &result);
        result
    }

    fn transfer_claimed(
        &self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        check_transfer(
            &self.routes,
            (facts_of(self.cache.device()), facts_of(self.cache.host())),
            direction,
            layers,
            pairs,
        )?;
        let (src_claims, dst_claims, src, dst) = match direction {
            Direction::Backup => (
                &self.device_claims,
                &self.host_claims,
                &self.device,
                &self.host,
            ),
            Direction::Load => (
                &self.host_claims,
                &self.device_claims,
                &self.host,
                &self.device,
            ),
        };
        let mut claims = Claims::with_capacity(pairs.len().saturating_mul(2));
        for (i, p) in pairs.iter().enumerate() {
            let (sp, dp) = match direction {
                Direction::Backup => (p.device_page, p.host_page),
                Direction::Load => (p.host_page, p.device_page),
            };
            // In range: checked above (pages < the claim words' counts, which are the
            // routes' page counts).
            if !claims.exclusive(&dst_claims[dp as usize]) {
                return Err(TransferError::Busy {
                    pair: i,
                    side: direction.destination(),
                    page: dp,
                });
            }
            if !claims.shared(&src_claims[sp as usize]) {
                return Err(TransferError::Busy {
                    pair: i,
                    side: direction.source(),
                    page: sp,
                });
            }
        }
        let mut runs: Vec<CopyRun> = Vec::new();
        let done = run_transfer(&self.routes, direction, layers, pairs, &mut runs, |runs| {
            #[cfg(test)]
            if let Some(fault) = self.take_fault(direction) {
                return fault_copy(fault, direction, src, dst, runs);
            }
            copy_shared(direction, src, dst, runs)
        });
        // Checksummed under the claims: no other transfer or page write touches these pages.
        let done = self.checksum_claimed(direction, layers, pairs, done);
        drop(claims);
        done
    }

    /// [`HiCache`]'s checksum step on the shared regions: a backup that copied records its
    /// device pages' checksums, a load that copied verifies them. The caller holds the claims
    /// of every page of `pairs`.
    fn checksum_claimed(
        &self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
        result: Result<Transferred, TransferError>,
    ) -> Result<Transferred, TransferError> {
        let Some(table) = &self.checksums else {
            return result;
        };
        if !copied(direction, &result) {
            return result;
        }
        let geometry = self.cache.device().geometry();
        let only_recorded = direction == Direction::Load;
        let sums = table.sums(layers, pairs, only_recorded, |key, b, layer, page| {
            // Device pools are `layer_first`: a page payload is one run at its offset.
            let off = geometry
                .page_offset_bytes(b, layer, page)
                .map_err(TransferError::Geometry)?;
            check_range("device", off, key.payload_bytes, self.device.len_bytes)
                .map_err(TransferError::Backend)?;
            // SAFETY: `[off, off + payload)` is inside the device region (checked) and inside
            // device page `page`, which this transfer holds (a backup's source shared, a
            // load's destination exclusive), so no other thread writes it meanwhile.
            let payload = unsafe {
                std::slice::from_raw_parts(
                    self.device.ptr.add(off as usize),
                    key.payload_bytes as usize,
                )
            };
            Ok(key.checksum(payload)?)
        })?;
        match direction {
            Direction::Backup => {
                table.record(&sums);
                result
            }
            Direction::Load => {
                let verdict = table.compare(&sums);
                let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
                load_verdict(&mut stats, result?, verdict)
            }
        }
    }

    /// Writes one canonical page payload of `layer` of buffer `buffer` into device page
    /// `page` (what the model does while transfers run), under an exclusive claim of the
    /// page: [`PoolError::PageBusy`] if a transfer holds it. `data` must be the page payload
    /// (`page_size_tokens * bytes_per_token` bytes).
    ///
    /// # Errors
    ///
    /// [`PoolError::PageBusy`] when a transfer holds the page; the errors of [`KvPool::write_page`]
    /// (a bad buffer, layer or page, or `data` of another length than the page payload).
    pub fn write_device_page(
        &self,
        buffer: usize,
        layer: u64,
        page: u64,
        data: &[u8],
    ) -> Result<(), PoolError> {
        let g = self.cache.device().geometry();
        let payload = g.page_geometry(buffer)?.page_payload_bytes;
        if data.len() as u64 != payload {
            return Err(PoolError::TokenShape {
                buffer: g.buffer(buffer)?.name().to_string(),
                field: "page payload bytes".into(),
                expected: payload,
                got: data.len() as u64,
            });
        }
        // Device pools are `layer_first`: the canonical page is one run at its offset
        // (`page_offset_bytes` refuses a page out of range).
        let off = g.page_offset_bytes(buffer, layer, page)?;
        check_range("device", off, payload, self.device.len_bytes)?;
        let mut claims = Claims::with_capacity(1);
        // `page` is in range: `page_offset_bytes` refused it otherwise.
        if !claims.exclusive(&self.device_claims[page as usize]) {
            return Err(PoolError::PageBusy { page });
        }
        // SAFETY: `[off, off + payload)` is inside the device region (checked) and inside
        // device page `page`, which this thread holds exclusively. Raw pointers, not slices of
        // the region: other threads access other pages of it at the same time.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.device.ptr.add(off as usize),
                data.len(),
            )
        };
        Ok(())
    }
}

/// Copies `runs` from `src` to `dst` through the shared regions: every run checked against
/// both regions first (nothing moves if one is out), then copied through raw pointers (other
/// threads access other pages of the same regions meanwhile, so no slice of a whole region is
/// made).
fn copy_shared(
    direction: Direction,
    src: &Region,
    dst: &Region,
    runs: &[CopyRun],
) -> Result<(), BackendError> {
    check_runs(direction, src.len_bytes, dst.len_bytes, runs)?;
    for r in runs {
        // SAFETY: both ranges are inside their regions (checked above) and inside pages this
        // transfer has claimed (the source page shared, the destination page exclusive), so no
        // other thread writes them; source and destination are different pools.
        unsafe {
            std::ptr::copy_nonoverlapping(
                src.ptr.add(r.src_offset_bytes as usize),
                dst.ptr.add(r.dst_offset_bytes as usize),
                r.len_bytes as usize,
            )
        };
    }
    Ok(())
}

#[cfg(test)]
impl ConcurrentHiCache {
    /// Arms `fault` for the next copy of its direction ([`crate::ContentFault`]'s meanings).
    fn arm(&self, fault: crate::ContentFault) {
        *self.fault.lock().unwrap() = Some(fault);
    }

    fn take_fault(&self, direction: Direction) -> Option<crate::ContentFault> {
        let mut armed = self.fault.lock().unwrap();
        match *armed {
            Some(f) if f.direction() == direction => armed.take(),
            _ => None,
        }
    }
}

/// [`copy_shared`] making `fault` ([`crate::ContentFault`]'s meanings, as the fault backend).
#[cfg(test)]
fn fault_copy(
    fault: crate::ContentFault,
    direction: Direction,
    src: &Region,
    dst: &Region,
    runs: &[CopyRun],
) -> Result<(), BackendError> {
    check_runs(direction, src.len_bytes, dst.len_bytes, runs)?;
    let (copied, inverted) = fault.apply(runs);
    copy_shared(direction, src, dst, &copied)?;
    for at in inverted {
        // SAFETY: inside a run (checked above), so inside a page this transfer holds
        // exclusively.
        unsafe {
            let p = dst.ptr.add(at as usize);
            *p = !*p;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
