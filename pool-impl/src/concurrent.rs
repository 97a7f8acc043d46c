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
//! CPU backend only: there is no concurrent path for the CUDA backend (it has one context and
//! one stream; transfers on it go through [`HiCache`], one at a time).

use std::sync::Mutex;

use kvlayout_core::PoolGeometry;

use crate::backend::{BackendError, CpuBackend, check_range, check_runs};
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
    /// Shares `cache` between threads. Refuses a cache paired with
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
        })
    }

    /// The cache back, with this one's transfer counters added to its stats.
    pub fn into_inner(self) -> HiCache<CpuBackend> {
        let mut cache = self.cache;
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
            copy_shared(direction, src, dst, runs)
        });
        drop(claims);
        done
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
