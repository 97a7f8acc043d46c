//! Transfers from several threads at once on one CPU-backend HiCache.
//!
//! A serving engine runs HiCache transfers beside the model: SGLang's `HiCacheController` has
//! a write-back thread (backup) and a load thread, each on its own CUDA stream, while the
//! forward pass writes other device pages. The radix tree guarantees the pages they touch are
//! disjoint; [`ConcurrentHiCache`] takes that as a checked rule instead of a promise: each
//! transfer claims its destination pages exclusively and its source pages shared (one atomic
//! per page of each pool) before any byte moves, and a transfer that would touch a page
//! claimed by another in a conflicting way is refused with [`TransferError::Busy`] — nothing
//! moved. Distinct (buffer, layer, page) ranges of a pool never overlap (a geometry rule,
//! property-tested in `layout-core`), and every run of a pair lies in that pair's pages, so
//! claimed-disjoint transfers touch disjoint bytes and run in parallel without locks.
//!
//! CPU backend only: a CUDA backend gets the same overlap from streams.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use kvlayout_core::PoolGeometry;

use crate::backend::{BackendError, CpuBackend, check_range};
use crate::hicache::{
    HiCache, TransferStats, check_run_ranges, check_transfer, chunk_pairs, interrupted,
};
use crate::plan::{CopyRun, Direction, Layers, PagePair, Transferred};
use crate::pool::{KvPool, PoolError};
use crate::route::Routes;
use crate::shim::{CHECKS_COMPILED, TransferError};

/// A claim word: 0 free, `WRITER` held by one writer, otherwise the number of readers.
const WRITER: u32 = u32::MAX;

/// A [`HiCache`] (CPU backend, checked pairing) shared by reference between threads:
/// [`backup`](Self::backup) / [`load`](Self::load) (and `_layer`) take `&self`, and the model
/// writes device pages with [`write_device_page`](Self::write_device_page), all at the same
/// time on disjoint pages. Two transfers conflict when one's destination page is the other's
/// source or destination page on the same side; the later claim is refused with
/// [`TransferError::Busy`] and moves no byte. Memory: one 4-byte claim word per page of each
/// pool.
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

// SAFETY: `Region` points into a `Vec<u8>` owned by the `ConcurrentHiCache` that holds it, never
// moved or resized while shared. Bytes are written only by the holder of the exclusive claim
// of the page containing them and read only under a shared or exclusive claim of their page;
// pages' byte ranges are disjoint. So no two threads access a byte with one of them writing.
unsafe impl Send for ConcurrentHiCache {}
// SAFETY: as above.
unsafe impl Sync for ConcurrentHiCache {}

/// Claims taken by one transfer, released on drop (also on error or panic).
struct Claims<'a> {
    taken: Vec<(&'a AtomicU32, bool)>,
}

impl Claims<'_> {
    fn release(&mut self) {
        for (word, exclusive) in self.taken.drain(..) {
            if exclusive {
                word.store(0, Ordering::Release);
            } else {
                word.fetch_sub(1, Ordering::Release);
            }
        }
    }
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

impl<'a> Claims<'a> {
    fn exclusive(&mut self, word: &'a AtomicU32) -> bool {
        let ok = word
            .compare_exchange(0, WRITER, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        if ok {
            self.taken.push((word, true));
        }
        ok
    }

    fn shared(&mut self, word: &'a AtomicU32) -> bool {
        let ok = word
            .fetch_update(Ordering::Acquire, Ordering::Relaxed, |n| {
                // Lazily: `then_some(n + 1)` would compute `WRITER + 1` (an overflow) while a
                // writer holds the page.
                (n < WRITER - 1).then(|| n + 1)
            })
            .is_ok();
        if ok {
            self.taken.push((word, false));
        }
        ok
    }
}

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
    /// would not make transfers disjoint): [`TransferError::Field`] on `mode`.
    pub fn new(mut cache: HiCache<CpuBackend>) -> Result<Self, TransferError> {
        let Some(routes) = cache.routes().cloned() else {
            return Err(TransferError::Field {
                field: "mode".into(),
                device: "checked".into(),
                host: "unverified".into(),
            });
        };
        let device_claims = claim_words(routes.device_pages, "device")?;
        let host_claims = claim_words(routes.host_pages, "host")?;
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
    pub fn backup(&self, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Backup, Layers::All, pairs)
    }

    /// Backs up `pairs` for one layer.
    pub fn backup_layer(
        &self,
        layer: u64,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Backup, Layers::One(layer), pairs)
    }

    /// Loads `pairs`, all layers.
    pub fn load(&self, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Load, Layers::All, pairs)
    }

    /// Loads `pairs` for one layer.
    pub fn load_layer(&self, layer: u64, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.transfer(Direction::Load, Layers::One(layer), pairs)
    }

    /// The checks of [`HiCache::transfer`] (always including the duplicate-destination check:
    /// a page is claimed once), then the page claims, then the copy. Refusals, including
    /// [`TransferError::Busy`], move no byte; an empty list is a no-op.
    pub fn transfer(
        &self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        let result = self.transfer_claimed(direction, layers, pairs);
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(t) if t.pairs == 0 => {}
            Ok(t) => {
                let pages = match layers {
                    Layers::All | Layers::One(0) => t.pairs,
                    Layers::One(_) => 0,
                };
                match direction {
                    Direction::Backup => {
                        s.backups += 1;
                        s.pages_backed_up += pages;
                        s.bytes_backed_up = s.bytes_backed_up.saturating_add(t.bytes);
                    }
                    Direction::Load => {
                        s.loads += 1;
                        s.pages_loaded += pages;
                        s.bytes_loaded = s.bytes_loaded.saturating_add(t.bytes);
                    }
                }
            }
            Err(TransferError::Interrupted { .. }) => s.interrupted += 1,
            Err(_) => s.refused += 1,
        }
        result
    }

    fn transfer_claimed(
        &self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        let routes = &self.routes;
        let d = self.cache.device();
        let h = self.cache.host();
        check_transfer(
            routes,
            (d.fingerprint(), h.fingerprint()),
            direction,
            layers,
            pairs,
        )?;
        if !CHECKS_COMPILED
            && let Some((pair, first, page)) =
                crate::shim::first_duplicate_destination(direction, pairs)
        {
            return Err(TransferError::DuplicateDestination {
                pair,
                first,
                side: direction.destination(),
                page,
            });
        }
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
        let mut claims = Claims {
            taken: Vec::with_capacity(pairs.len() * 2),
        };
        for (i, p) in pairs.iter().enumerate() {
            let (sp, dp) = pages_of(direction, p);
            // In range: checked above.
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
        let per_pair = routes.runs_per_pair(layers);
        let chunk_pairs = chunk_pairs(pairs.len(), per_pair);
        let mut runs: Vec<CopyRun> = Vec::new();
        for chunk in pairs.chunks(chunk_pairs) {
            runs.clear();
            for &p in chunk {
                routes.push_pair_runs(direction, layers, p, &mut runs);
            }
            if let Err(e) = check_run_ranges(direction, routes, &runs) {
                return Err(match e {
                    TransferError::Range { source, .. } if done.runs > 0 => {
                        interrupted(pairs, per_pair, done.runs, source)
                    }
                    e => e,
                });
            }
            if let Err(e) = copy_shared(direction, src, dst, &runs) {
                return Err(interrupted(pairs, per_pair, done.runs, e));
            }
            done.pairs += chunk.len() as u64;
            done.runs += runs.len() as u64;
            done.bytes += runs.iter().map(|r| r.len_bytes).sum::<u64>();
        }
        drop(claims);
        Ok(done)
    }

    /// Writes one canonical page payload of `layer` of buffer `buffer` into device page
    /// `page` (what the model does while transfers run), under an exclusive claim of the
    /// page: [`TransferError::Busy`] if a transfer holds it. `data` must be the page payload
    /// (`page_size_tokens * bytes_per_token` bytes).
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
        // Device pools are `layer_first`: the canonical page is one run at its offset.
        let off = g.page_offset_bytes(buffer, layer, page)?;
        check_range("device", off, payload, self.device.len_bytes)?;
        let mut claims = Claims { taken: Vec::new() };
        if !claims.exclusive(&self.device_claims[page as usize]) {
            return Err(PoolError::PageBusy { page });
        }
        // SAFETY: `[off, off + payload)` is inside the device region (checked) and inside
        // device page `page`, which this thread holds exclusively.
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

fn pages_of(direction: Direction, p: &PagePair) -> (u64, u64) {
    match direction {
        Direction::Backup => (p.device_page, p.host_page),
        Direction::Load => (p.host_page, p.device_page),
    }
}

/// Copies `runs` from `src` to `dst` through the shared regions.
fn copy_shared(
    direction: Direction,
    src: &Region,
    dst: &Region,
    runs: &[CopyRun],
) -> Result<(), BackendError> {
    for r in runs {
        check_range(
            direction.source(),
            r.src_offset_bytes,
            r.len_bytes,
            src.len_bytes,
        )?;
        check_range(
            direction.destination(),
            r.dst_offset_bytes,
            r.len_bytes,
            dst.len_bytes,
        )?;
    }
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
mod tests {
    use super::*;

    /// Regression: a shared claim on a page a writer held computed `u32::MAX + 1` (a panic in
    /// debug builds, found by `conflicting_transfers_are_refused_or_serialized_never_torn`
    /// when a backup met a load on the same host page).
    #[test]
    fn claims_exclude_writers_and_count_readers() {
        let word = AtomicU32::new(0);
        let mut writer = Claims { taken: Vec::new() };
        assert!(writer.exclusive(&word));
        assert_eq!(word.load(Ordering::SeqCst), WRITER);
        let mut reader = Claims { taken: Vec::new() };
        assert!(!reader.shared(&word), "a reader got a page a writer holds");
        assert!(!reader.exclusive(&word));
        drop(writer);
        assert_eq!(word.load(Ordering::SeqCst), 0);
        // Two readers (one transfer naming the page twice, or two transfers) then a writer.
        assert!(reader.shared(&word) && reader.shared(&word));
        assert_eq!(word.load(Ordering::SeqCst), 2);
        let mut writer = Claims { taken: Vec::new() };
        assert!(!writer.exclusive(&word), "a writer got a page being read");
        drop(reader);
        assert_eq!(word.load(Ordering::SeqCst), 0);
        assert!(writer.exclusive(&word));
    }
}
