//! The staged transfer path's device half: a ring of `STAGING_SLOTS` staging slots (pinned
//! host memory and device memory), each chunk of a run list through one slot. A load: host
//! threads gather the chunk into the pinned slot, ONE contiguous `cuMemcpyAsync` sends it (with
//! its run list appended), and the run-list kernel scatters it into the device pool. A backup:
//! the kernel gathers into the device slot, one copy brings it back, host threads scatter it
//! into the host pool. Both of the ring's streams start after the work enqueued on the `Gpu`'s
//! stream before the call.
//!
//! Copies and kernels sit on two streams of the ring joined by per-slot events, so a kernel waiting for
//! SMs (a GEMM holding them) never holds up the copies behind it: the ring's 8 x 16 MiB (2.4 ms
//! of PCIe at 55 GB/s) absorb the wait. The kernels are short (runs cut to
//! `STAGING_WARP_RUN_BYTES`, a warp each, on every SM: a chunk moves inside HBM in
//! microseconds) so the model gets its SMs back soon. A slot is reused after the events behind
//! its last use; host gather, PCIe and scatter of consecutive chunks overlap, across calls too
//! (layer-by-layer loads). A load's scatters are joined into the `Gpu`'s stream by
//! [`Gpu::join_staged`] (which [`Gpu::finish`] and every other transfer call first).

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaStream, sys};

use super::{Arg, Gpu, LaunchShape};
use crate::copy_runs::{ByteRun, validate_runs};
use crate::device_memory::{DeviceBytes, GpuBytes, PinnedBytes, driver_err};
use crate::error::KernelError;
use crate::staging::{
    STAGING_ALIGN_BYTES, StagedChunk, StagedDirection, device_runs, gather_into_staging,
    plan_staged_chunks, scatter_from_staging, split_runs,
};

/// Staging bytes per chunk (16 MiB: a 61-layer DSA page load of 1,024 pages is 51 MB per layer,
/// four chunks).
pub(crate) const STAGING_CHUNK_BYTES: u64 = 16 << 20;
/// Slots in the ring (chunks in flight).
pub(crate) const STAGING_SLOTS: usize = 8;
/// Most pieces per chunk.
pub(crate) const STAGING_MAX_PIECES: usize = 4096;
/// The device half's runs are cut to at most this many bytes, a warp each.
pub(crate) const STAGING_WARP_RUN_BYTES: u64 = 4096;

/// Most device runs of one chunk: every piece, plus one per warp-run of the chunk's bytes.
const MAX_DEVICE_RUNS: u64 =
    STAGING_MAX_PIECES as u64 + STAGING_CHUNK_BYTES / STAGING_WARP_RUN_BYTES;
/// Bytes of one slot: the chunk, then room for its device run list (3 words per run).
const SLOT_BYTES: u64 = STAGING_CHUNK_BYTES + MAX_DEVICE_RUNS * 24;

/// The ring: `STAGING_SLOTS` slots of `SLOT_BYTES` on each side, its stream, two events per
/// slot.
pub(super) struct Staging {
    host: PinnedBytes,
    dev: DeviceBytes,
    /// The device half's stream (scatter and gather kernels, backup run-list uploads).
    stream: Arc<CudaStream>,
    /// The contiguous copies' stream.
    copy_stream: Arc<CudaStream>,
    /// Per slot: its contiguous copy finished (recorded on the copy stream).
    copied: Vec<CudaEvent>,
    /// Per slot: its kernel finished (recorded on the ring's stream).
    kernel_done: Vec<CudaEvent>,
    /// Whether each slot has been used (its events recorded).
    used: Vec<bool>,
    next: usize,
    /// A load's scatter not yet joined into the `Gpu`'s stream: its slot.
    unjoined: Option<usize>,
}

/// The run list of a chunk as the kernel reads it: `(src, dst, len)` words.
fn list_words(runs: &[ByteRun]) -> Vec<u8> {
    runs.iter()
        .flat_map(|r| [r.src_offset_bytes, r.dst_offset_bytes, r.len_bytes])
        .flat_map(u64::to_le_bytes)
        .collect()
}

/// Copies `bytes` bytes between device-visible addresses on `stream`.
///
/// # Safety
/// Both ranges lie inside live allocations until the stream has finished.
unsafe fn memcpy_on(
    stream: &CudaStream,
    dst: u64,
    src: u64,
    bytes: u64,
) -> Result<(), KernelError> {
    // SAFETY: forwarded to the caller.
    unsafe { sys::cuMemcpyAsync(dst, src, bytes as usize, stream.cu_stream()) }
        .result()
        .map_err(driver_err("cuMemcpyAsync"))
}

impl Gpu {
    fn staging_ring(&self) -> Result<std::sync::MutexGuard<'_, Option<Staging>>, KernelError> {
        let mut guard = self
            .staging
            .lock()
            .map_err(|_| KernelError::Unsupported("poisoned lock".to_string()))?;
        if guard.is_none() {
            let total = (SLOT_BYTES as usize) * STAGING_SLOTS;
            let events = || -> Result<Vec<CudaEvent>, KernelError> {
                (0..STAGING_SLOTS)
                    .map(|_| {
                        self.ctx
                            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                            .map_err(driver_err("cuEventCreate"))
                    })
                    .collect()
            };
            // The pinned half last: dropping pinned memory (if a later step failed) waits for
            // the whole device, the model's kernels included.
            let dev = self.alloc_device(total)?;
            let stream = self
                .ctx
                .new_stream()
                .map_err(driver_err("cuStreamCreate"))?;
            let copy_stream = self
                .ctx
                .new_stream()
                .map_err(driver_err("cuStreamCreate"))?;
            let (copied, kernel_done) = (events()?, events()?);
            *guard = Some(Staging {
                host: self.alloc_pinned(total)?,
                dev,
                stream,
                copy_stream,
                copied,
                kernel_done,
                used: vec![false; STAGING_SLOTS],
                next: 0,
                unjoined: None,
            });
        }
        Ok(guard)
    }

    /// Makes this `Gpu`'s stream wait for the scatters of staged loads enqueued so far (they
    /// run on the staging ring's own stream). [`Gpu::finish`] and every other transfer call
    /// do it first; call it before enqueuing your own work that reads what a staged load
    /// wrote.
    pub fn join_staged(&self) -> Result<(), KernelError> {
        let mut guard = self
            .staging
            .lock()
            .map_err(|_| KernelError::Unsupported("poisoned lock".to_string()))?;
        if let Some(ring) = guard.as_mut()
            && let Some(slot) = ring.unjoined.take()
        {
            self.stream
                .wait(&ring.kernel_done[slot])
                .map_err(driver_err("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    /// Moves `runs` between a host pool and a device pool through the staging ring (module
    /// docs): exactly one of `src` and `dst` must be CPU-readable host memory
    /// ([`GpuBytes::host_bytes`]: pinned, not write-combined), which picks the direction. Every
    /// run is checked against both lengths first ([`KernelError::RunOutOfRange`], nothing
    /// moved); a backup whose runs write overlapping host bytes is refused
    /// ([`KernelError::Spec`]). Returns the number of chunks.
    ///
    /// A load returns once every chunk is gathered and enqueued (the host pool is no longer
    /// read); its scatters finish on the ring's stream ([`Gpu::join_staged`]). A backup
    /// returns once every chunk is in the host pool. Neither waits for the rest of the stream.
    ///
    /// # Safety
    /// As [`Gpu::enqueue_copy_runs`]; in addition, for a load, no work enqueued earlier and
    /// not yet finished may write `src` (the CPU reads it now).
    pub unsafe fn enqueue_staged_runs(
        &self,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        runs: &[ByteRun],
    ) -> Result<u64, KernelError> {
        validate_runs(runs, src.len_bytes(), dst.len_bytes())?;
        let direction = match (src.host_bytes().is_some(), dst.host_bytes().is_some()) {
            (true, false) => StagedDirection::Load,
            (false, true) => StagedDirection::Backup,
            (s, d) => {
                return Err(KernelError::spec(
                    "src, dst",
                    format!(
                        "the staged path moves between CPU-readable host memory and device \
                         memory; src host-readable: {s}, dst host-readable: {d}"
                    ),
                ));
            }
        };
        let chunks = plan_staged_chunks(runs, direction, STAGING_CHUNK_BYTES, STAGING_MAX_PIECES)?;
        let mut guard = self.staging_ring()?;
        let ring = guard
            .as_mut()
            .ok_or_else(|| KernelError::Unsupported("staging ring missing".to_string()))?;
        // The ring's streams follow everything enqueued on the `Gpu`'s stream before.
        for stream in [&ring.stream, &ring.copy_stream] {
            stream
                .join(&self.stream)
                .map_err(driver_err("cuStreamWaitEvent"))?;
        }
        let queued = (|| -> Result<(), KernelError> {
            match direction {
                StagedDirection::Load => {
                    let host = src
                        .host_bytes()
                        .ok_or_else(|| KernelError::spec("src", "not host-readable"))?;
                    let dev = (dst.device_address(), dst.len_bytes());
                    for chunk in &chunks {
                        // SAFETY: the chunk's runs were checked inside `dst` (validate_runs).
                        unsafe { self.stage_load_chunk(ring, host, chunk, dev)? };
                    }
                }
                StagedDirection::Backup => {
                    let dev = (src.device_address(), src.len_bytes());
                    let host = dst
                        .host_bytes_mut()
                        .ok_or_else(|| KernelError::spec("dst", "not host-readable"))?;
                    let mut slots = Vec::with_capacity(chunks.len());
                    for (i, chunk) in chunks.iter().enumerate() {
                        if i >= STAGING_SLOTS {
                            let j = i - STAGING_SLOTS;
                            self.unstage_backup_chunk(ring, slots[j], &chunks[j], host)?;
                        }
                        // SAFETY: the chunk's runs were checked inside `src` (validate_runs).
                        slots.push(unsafe { self.stage_backup_chunk(ring, chunk, dev)? });
                    }
                    let first_left = chunks.len().saturating_sub(STAGING_SLOTS);
                    for (i, chunk) in chunks.iter().enumerate().skip(first_left) {
                        self.unstage_backup_chunk(ring, slots[i], chunk, host)?;
                    }
                }
            }
            Ok(())
        })();
        if queued.is_err() {
            // Part of the transfer may be queued on the ring's streams, which a later `finish`
            // does not wait for (a backup's): wait for them here (best effort: a broken
            // context fails this too, and then nothing runs).
            let _ = ring.stream.synchronize();
            let _ = ring.copy_stream.synchronize();
        }
        queued?;
        Ok(chunks.len() as u64)
    }

    /// Takes the next slot of the ring (its last use is waited for by the caller).
    fn take_slot(ring: &mut Staging) -> (usize, bool) {
        let slot = ring.next;
        ring.next = (slot + 1) % STAGING_SLOTS;
        let used = ring.used[slot];
        ring.used[slot] = true;
        (slot, used)
    }

    /// Launches the run-list kernel over `n` runs at `list` (device address) on the ring's
    /// stream, on every SM, unchecked on the GPU (the host checked them).
    ///
    /// # Safety
    /// Every run lies inside `src_base .. + src_len` and `dst_base .. + dst_len`.
    unsafe fn launch_staged_runs(
        &self,
        ring: &Staging,
        (list, n): (u64, u64),
        (src_base, src_len): (u64, u64),
        (dst_base, dst_len): (u64, u64),
    ) -> Result<(), KernelError> {
        let k = self.kernels()?;
        let args = [
            Arg::Word(list),
            Arg::Word(n),
            Arg::Word(src_base),
            Arg::Word(dst_base),
            Arg::Word(src_len),
            Arg::Word(dst_len),
            Arg::Word(0),
            Arg::Word(self.err_address()),
        ];
        // SAFETY: arguments match copy_runs; the runs fit both ranges (caller).
        unsafe {
            self.launch_on(
                &ring.stream,
                &k.copy_runs,
                "cuLaunchKernel(copy_runs, staged)",
                self.grid(LaunchShape::default(), n * 32),
                &args,
            )
        }
    }

    /// One load chunk: gather on the host, one copy (data and run list), device scatter.
    ///
    /// # Safety
    /// The chunk's device ranges lie inside `dev = (base, len)`.
    unsafe fn stage_load_chunk(
        &self,
        ring: &mut Staging,
        host_pool: &[u8],
        chunk: &StagedChunk,
        dev: (u64, u64),
    ) -> Result<(), KernelError> {
        let (slot, used) = Self::take_slot(ring);
        if used {
            // The host slot is free once its copy is done; the device slot once its scatter is.
            ring.copied[slot]
                .synchronize()
                .map_err(driver_err("cuEventSynchronize"))?;
            ring.copy_stream
                .wait(&ring.kernel_done[slot])
                .map_err(driver_err("cuStreamWaitEvent"))?;
        }
        let at = slot as u64 * SLOT_BYTES;
        let runs = split_runs(
            &device_runs(chunk, StagedDirection::Load),
            STAGING_WARP_RUN_BYTES,
        );
        let list = list_words(&runs);
        let list_at = chunk.used_bytes.next_multiple_of(STAGING_ALIGN_BYTES);
        let send = list_at + list.len() as u64;
        {
            let host_slot = &mut ring.host.as_mut_slice()[at as usize..(at + SLOT_BYTES) as usize];
            gather_into_staging(host_pool, chunk, host_slot)?;
            host_slot[list_at as usize..send as usize].copy_from_slice(&list);
        }
        let (h, d) = (
            ring.host.device_address() + at,
            ring.dev.device_address() + at,
        );
        // SAFETY: `send` <= SLOT_BYTES bytes inside both slots (a chunk of at most
        // STAGING_CHUNK_BYTES, then at most MAX_DEVICE_RUNS runs); the ring outlives the
        // streams' use (slots are reused only after their events).
        unsafe { memcpy_on(&ring.copy_stream, d, h, send)? };
        ring.copied[slot]
            .record(&ring.copy_stream)
            .map_err(driver_err("cuEventRecord"))?;
        ring.stream
            .wait(&ring.copied[slot])
            .map_err(driver_err("cuStreamWaitEvent"))?;
        // SAFETY: the runs read the slot's chunk and write the checked device ranges.
        unsafe {
            self.launch_staged_runs(
                ring,
                (d + list_at, runs.len() as u64),
                (d, STAGING_CHUNK_BYTES),
                dev,
            )?
        };
        ring.kernel_done[slot]
            .record(&ring.stream)
            .map_err(driver_err("cuEventRecord"))?;
        ring.unjoined = Some(slot);
        Ok(())
    }

    /// One backup chunk, enqueued: run list up and device gather into the slot (ring's
    /// stream), one copy down (`Gpu`'s stream). Returns the slot, for
    /// [`Gpu::unstage_backup_chunk`].
    ///
    /// # Safety
    /// The chunk's device ranges lie inside `dev = (base, len)`.
    unsafe fn stage_backup_chunk(
        &self,
        ring: &mut Staging,
        chunk: &StagedChunk,
        dev: (u64, u64),
    ) -> Result<usize, KernelError> {
        let (slot, used) = Self::take_slot(ring);
        if used {
            // The host slot's last copy (a load's send reads its list region) is done before
            // the CPU writes the list; the device slot's before the gather overwrites it.
            ring.copied[slot]
                .synchronize()
                .map_err(driver_err("cuEventSynchronize"))?;
            ring.stream
                .wait(&ring.copied[slot])
                .map_err(driver_err("cuStreamWaitEvent"))?;
        }
        let at = slot as u64 * SLOT_BYTES;
        let runs = split_runs(
            &device_runs(chunk, StagedDirection::Backup),
            STAGING_WARP_RUN_BYTES,
        );
        let list = list_words(&runs);
        let list_at = at + STAGING_CHUNK_BYTES;
        ring.host.as_mut_slice()[list_at as usize..list_at as usize + list.len()]
            .copy_from_slice(&list);
        let (h, d) = (ring.host.device_address(), ring.dev.device_address());
        // SAFETY: the list and the chunk lie inside the slot on both sides; the runs fit the
        // device pool (caller) and the slot's chunk (planned).
        unsafe {
            memcpy_on(&ring.stream, d + list_at, h + list_at, list.len() as u64)?;
            self.launch_staged_runs(
                ring,
                (d + list_at, runs.len() as u64),
                dev,
                (d + at, STAGING_CHUNK_BYTES),
            )?;
        }
        ring.kernel_done[slot]
            .record(&ring.stream)
            .map_err(driver_err("cuEventRecord"))?;
        ring.copy_stream
            .wait(&ring.kernel_done[slot])
            .map_err(driver_err("cuStreamWaitEvent"))?;
        // SAFETY: as above.
        unsafe { memcpy_on(&ring.copy_stream, h + at, d + at, chunk.used_bytes)? };
        ring.copied[slot]
            .record(&ring.copy_stream)
            .map_err(driver_err("cuEventRecord"))?;
        Ok(slot)
    }

    /// Waits for a backup chunk's copy, then scatters it into the host pool on host threads.
    fn unstage_backup_chunk(
        &self,
        ring: &mut Staging,
        slot: usize,
        chunk: &StagedChunk,
        host_pool: &mut [u8],
    ) -> Result<(), KernelError> {
        ring.copied[slot]
            .synchronize()
            .map_err(driver_err("cuEventSynchronize"))?;
        let at = slot as u64 * SLOT_BYTES;
        let staged = &ring.host.as_slice()[at as usize..(at + STAGING_CHUNK_BYTES) as usize];
        scatter_from_staging(staged, chunk, host_pool)
    }
}

/// The ring's place in a [`Gpu`]: created at the first staged transfer.
pub(super) type StagingCell = Mutex<Option<Staging>>;
