//! The host link's device-to-host rate, measured once per `Gpu` with the copy engines, and
//! the pace of token backups next to a model: SM stores to pinned host memory slow a model's
//! GEMM once they come near the link's limit (queued stores take the memory system the GEMM
//! uses), while the copy engines at the full rate do not. On the H200 next to a bf16 GEMM
//! carved out by 4 SMs, page-size-1 backups by the token kernel moved 44.7-45.9 GB/s (0.81-0.83
//! of the 55.3 GB/s memcpy) with the GEMM +0.7% to +2.1%, and 46.9-50.5 GB/s (0.85-0.91) with
//! it +10% to +111% (memcpy: -0.1% to +0.6%; BENCHMARKS.md, "GPU at page size 1"). A token
//! backup on a carve-out is therefore paced to `BACKUP_LINK_SHARE_PERMILLE` of the measured
//! link.

use std::sync::atomic::Ordering;

use cudarc::driver::sys;

use super::Gpu;
use crate::device_memory::{GpuBytes, driver_err};
use crate::error::KernelError;

/// Share of the measured device-to-host link (per mille) a token backup next to a model may
/// take by default ([`Gpu::set_backup_link_share_permille`]). On the H200 next to a bf16 GEMM
/// carved out by 2 or 4 SMs, page-size-1 backups paced to 800 kept the GEMM 0.8-1.5 points
/// over memcpy's cost at 0.70-0.78 of memcpy; unpaced token-kernel backups at 0.85-0.91 of
/// memcpy slowed it 10-111%, and a share of 850 passed 2 points once (BENCHMARKS.md, "GPU at
/// page size 1").
pub const BACKUP_LINK_SHARE_PERMILLE: u32 = 800;

/// Bytes of one measuring copy (8 MiB: about 150 us at 55 GB/s, long against a copy's fixed
/// cost of a few microseconds).
const PROBE_BYTES: usize = 8 << 20;
/// Copies measured; the fastest counts (a copy slowed by other traffic reads low).
const PROBE_COPIES: usize = 4;

impl Gpu {
    /// The device-to-host rate of the copy engines into pinned host memory, in bytes per
    /// microsecond (MB/s), measured once at first call (an 8 MiB device buffer copied to an 8
    /// MiB pinned one, 4 times on a stream of its own, the host waiting for each, the fastest
    /// counting; both buffers then kept for the `Gpu`'s life, so no later free waits for the
    /// device) and remembered: 54,050-54,296 MB/s on the H200 (PCIe 5.0 x16). The first token
    /// backup on a carve-out calls it. Another transfer on the link during all 4 copies would
    /// make it read low and pace later backups slower than needed; the share
    /// ([`Gpu::set_backup_link_share_permille`]) can make up for it.
    ///
    /// Errors: [`KernelError::Driver`] when an allocation, copy or event fails (then asked
    /// again at the next call).
    pub fn host_link_bytes_per_us(&self) -> Result<u64, KernelError> {
        let mut cell = self
            .link
            .lock()
            .map_err(|_| KernelError::Unsupported("poisoned lock".to_string()))?;
        if let Some((rate, ..)) = cell.as_ref() {
            return Ok(*rate);
        }
        let dev = self.alloc_device(PROBE_BYTES)?;
        let host = self.alloc_pinned(PROBE_BYTES)?;
        let stream = self
            .ctx
            .new_stream()
            .map_err(driver_err("cuStreamCreate"))?;
        let event = || {
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(driver_err("cuEventCreate"))
        };
        let mut best_ms = f32::INFINITY;
        for _ in 0..PROBE_COPIES {
            let (start, end) = (event()?, event()?);
            start.record(&stream).map_err(driver_err("cuEventRecord"))?;
            // SAFETY: both are live allocations of PROBE_BYTES, kept until the stream has
            // finished (synchronised below) and then in `self.link`.
            unsafe {
                sys::cuMemcpyAsync(
                    host.device_address(),
                    dev.device_address(),
                    PROBE_BYTES,
                    stream.cu_stream(),
                )
            }
            .result()
            .map_err(driver_err("cuMemcpyAsync"))?;
            end.record(&stream).map_err(driver_err("cuEventRecord"))?;
            stream
                .synchronize()
                .map_err(driver_err("cuStreamSynchronize"))?;
            best_ms = best_ms.min(
                start
                    .elapsed_ms(&end)
                    .map_err(driver_err("cuEventElapsedTime"))?,
            );
        }
        // bytes / (ms x 1000) = bytes per microsecond; at least 1.
        let rate = (PROBE_BYTES as f64 / (f64::from(best_ms.max(1e-6)) * 1000.0)).max(1.0) as u64;
        *cell = Some((rate, dev, host));
        Ok(rate)
    }

    /// Sets the share of the host link (per mille of [`Gpu::host_link_bytes_per_us`]) a token
    /// backup on the model's carve-out may take: the token kernel paces itself to it
    /// ([`super::LaunchShape::rate_limit_bytes_per_us`]). Default
    /// [`BACKUP_LINK_SHARE_PERMILLE`] (800: SM stores to the host slow the model's GEMM only
    /// near the link's limit, figures there); 1000 or more: not paced.
    ///
    /// Errors: 0 ([`KernelError::Spec`] naming `permille`): a backup must move.
    pub fn set_backup_link_share_permille(&self, permille: u32) -> Result<(), KernelError> {
        if permille == 0 {
            return Err(KernelError::spec(
                "permille",
                "a share of 0 of the host link would never finish a backup".to_string(),
            ));
        }
        self.backup_link_share_permille
            .store(permille, Ordering::Relaxed);
        Ok(())
    }

    /// The pace of a token backup on a carve-out: `None` (unpaced) at a share of 1000 or more.
    pub(super) fn backup_rate_limit_bytes_per_us(&self) -> Result<Option<u64>, KernelError> {
        let permille = self.backup_link_share_permille.load(Ordering::Relaxed);
        if permille >= 1000 {
            return Ok(None);
        }
        let link = self.host_link_bytes_per_us()?;
        let limit = u128::from(link) * u128::from(permille) / 1000;
        Ok(Some(u64::try_from(limit).unwrap_or(u64::MAX).max(1)))
    }
}
