//! The gathered backup's device half ([`Gpu::enqueue_gathered_backup`]; the plan is
//! [`crate::gather_plan`]): the run-list kernel, on the model's SM carve-out and a
//! high-priority stream, gathers each chunk of a backup from the device pool into a slot of
//! device staging (device to device: short launches that leave a GEMM on the other SMs alone),
//! then the copy engines copy every host-contiguous stretch of the slot to the host pool
//! (`cuMemcpyBatchAsync`, at most 2,048 stretches per call) on a second stream. Slots are
//! reused after the copies out behind their last use (an event each); both streams start
//! after the work enqueued on the `Gpu`'s stream before the call, which waits for the last
//! copy out. A list is planned in its own order ([`crate::gather_plan`]) and each chunk is
//! enqueued as soon as it is planned, the first of `GATHER_FIRST_CHUNK_BYTES`; the gather
//! lists of a call go to a pinned host buffer of its own (reused once no gather reads it) that
//! the kernel reads in place, so the call returns without waiting, however many chunks.
//! Measured on the H200 next to a bf16 GEMM carved out by 2 SMs (BENCHMARKS.md, "Session 5"),
//! 1,024 random pages x 61 layers of DeepSeek-V3.2 laid page pair by page pair (as the pool
//! shim lays them) through the chooser: 0.958-0.967 of pinned memcpy alone, 0.889-0.894 next
//! to the GEMM (GEMM -0.2% to +0.5%), against 0.55-0.79 on the copy engines (one run per page,
//! layer and buffer). The same GPU pipeline with its plan made before the timed window moved
//! 0.986-0.990 alone and 0.914-0.917 next to the GEMM: the copies out lose about 0.07 next to
//! the GEMM while the gather runs beside them (0.989 without the gather). Session 6 timed each
//! chunk: next to the GEMM the copies out run at 49.4-50.1 GB/s (54.1 alone; as alone once the
//! last gather has ended) and the gathers are done before they are needed, so a faster gather
//! does not help (a TMA bulk-copy gather, more loads in flight and 4 SMs were tried); against a control loop with no transfer the GEMM is
//! slowed about as much as by pinned memcpy of the same bytes (+1.9% to +5.0%, memcpy +0.3% to
//! +5.5%: the GEMM runs at the power cap).
//!
//! A backup is not gathered (the caller keeps the copy engines) when two runs write
//! overlapping host bytes, when gathering would not pay
//! ([`crate::gather_plan::HostStretches::gathering_pays`]), when its runs merged in list order
//! are fewer than `CARVEOUT_MIN_RUNS`, when the 256 MiB of staging cannot
//! be allocated at the first gathered backup (then never again on this `Gpu`: engines often
//! hold most of the device memory for their pools), or when the pinned memory for its lists
//! (24 bytes per run) cannot be allocated.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaStream, sys};

use super::run_ring::{RUN_BYTES, write_run_list};
use super::{CopyEngineHint, Gpu, LaunchShape, copy_engine};
use crate::copy_runs::ByteRun;
use crate::device_memory::{DeviceBytes, GpuBytes, PinnedBytes, driver_err};
use crate::error::KernelError;
use crate::gather_plan::{GatherChunk, GatherChunks, gather_chunks, host_stretches};

/// Staging slots (chunks in flight).
pub(crate) const GATHER_SLOTS: usize = 4;
/// Bytes of one staging slot: 4 x 64 MiB = 256 MiB of device memory, allocated at the first
/// gathered backup and kept by the `Gpu` (the configuration measured).
pub(crate) const GATHER_SLOT_BYTES: u64 = 64 << 20;
/// Bytes of a gathered backup's first chunk; each next chunk holds twice as many, up to a
/// slot ([`crate::gather_plan::gather_chunks`]): the copies out start after 8 MiB of gather
/// instead of 64 MiB.
pub(crate) const GATHER_FIRST_CHUNK_BYTES: u64 = 8 << 20;
/// Stretches per `cuMemcpyBatchAsync` call of the copies out.
const STRETCHES_PER_CALL: usize = 2048;

/// The staging slots, the two streams, per slot the event after its last copies out, and the
/// gather lists.
pub(super) struct GatherRing {
    staging: DeviceBytes,
    gather_stream: Arc<CudaStream>,
    out_stream: Arc<CudaStream>,
    copied: Vec<Option<CudaEvent>>,
    lists: Vec<GatherList>,
    /// The chunk each call plans into, its memory kept from call to call.
    chunk: GatherChunk,
}

/// Pinned host memory holding a whole call's gather lists, read by the gather kernel in place
/// (mapped for the device), and the event after the last gather that read it (`None`: free).
/// Buffers are reused once their event has completed and kept by the `Gpu` (one per gathered
/// backup in flight at once, each a power of two of bytes): a call never waits for an earlier
/// one to reuse a list; it allocates one when none is free and large enough (host time).
struct GatherList {
    host: PinnedBytes,
    read: Option<CudaEvent>,
}

/// Smallest gather-list buffer allocated, and the one allocated with the ring (16 MiB: 699,050
/// runs; a 4,096-page, 61-layer DSA backup is 499,712 runs plus its cut pieces).
const GATHER_LIST_MIN_BYTES: usize = 16 << 20;

/// The gathered backup's state on a `Gpu`.
pub(super) enum GatherState {
    /// No gathered backup yet.
    Untried,
    /// Staging and streams allocated.
    Ready(GatherRing),
    /// Their allocation failed (the error kept for the record): backups stay on the copy
    /// engines.
    Unavailable(KernelError),
}

pub(super) type GatherCell = Mutex<GatherState>;

fn event(stream: &CudaStream) -> Result<CudaEvent, KernelError> {
    stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(driver_err("cuEventRecord"))
}

impl Gpu {
    /// Enqueues a backup of `runs` (device pool `src` -> host pool `dst`; every run already
    /// checked against both lengths; in list order, merged or not) as a gathered backup
    /// (module docs) with the gather under `shape`. Returns `Ok(None)`, having enqueued
    /// nothing, when the backup is not to be gathered (module docs), else the number of
    /// non-empty runs gathered. Does not wait: the gather kernel reads the call's lists in
    /// place from a pinned buffer no earlier call still reads (allocated when none is free).
    ///
    /// # Safety
    /// As [`Gpu::enqueue_copy_runs`].
    pub(super) unsafe fn enqueue_gathered_backup(
        &self,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        runs: &[ByteRun],
        shape: LaunchShape,
    ) -> Result<Option<u64>, KernelError> {
        // Counted after merging (the copy engines' count): a list padded with empty runs, or
        // of runs that continue each other on the device too, is not gathered on its raw count.
        let stretches = match host_stretches(runs) {
            Some(s) if s.gathering_pays() && s.merged_runs >= super::CARVEOUT_MIN_RUNS => s,
            _ => return Ok(None),
        };
        let mut guard = self
            .gathered
            .lock()
            .map_err(|_| KernelError::Unsupported("poisoned lock".to_string()))?;
        if matches!(*guard, GatherState::Untried) {
            *guard = match self.new_gather_ring() {
                Ok(ring) => GatherState::Ready(ring),
                Err(e) => GatherState::Unavailable(e),
            };
        }
        let GatherState::Ready(ring) = &mut *guard else {
            return Ok(None);
        };
        let pieces = stretches.max_gather_pieces(GATHER_SLOT_BYTES, GATHER_FIRST_CHUNK_BYTES);
        let Some(list_bytes) = usize::try_from(pieces)
            .ok()
            .and_then(|p| p.checked_mul(RUN_BYTES))
        else {
            return Ok(None);
        };
        let Some(list_at) = self.free_gather_list(ring, list_bytes) else {
            // No pinned memory for the lists: the copy engines.
            return Ok(None);
        };
        let chunks = gather_chunks(
            runs,
            GATHER_SLOT_BYTES,
            GATHER_SLOTS,
            GATHER_FIRST_CHUNK_BYTES,
        );
        // SAFETY: forwarded to the caller; the plan's offsets lie in the checked runs and in
        // the staging buffer.
        let queued = unsafe { self.enqueue_chunks(ring, list_at, src, dst, chunks, shape) }
            .and_then(|planned_bytes| {
                // Unreachable for checked runs (the plan stops short only past u64::MAX).
                if planned_bytes == stretches.bytes {
                    Ok(())
                } else {
                    Err(KernelError::Unsupported(format!(
                        "a gathered backup planned {planned_bytes} of its {} bytes",
                        stretches.bytes
                    )))
                }
            });
        if let Err(e) = &queued {
            // Part of the backup may be queued on the ring's streams: wait for them, so that
            // the caller may free the pools, and no slot's event is left unrecorded.
            let gather_synced = ring.gather_stream.synchronize();
            let out_synced = ring.out_stream.synchronize();
            if gather_synced.is_err() || out_synced.is_err() {
                // The context is broken: keep the staging alive rather than free it under
                // work that may still reference it (as the run-list ring does).
                let broken = std::mem::replace(&mut *guard, GatherState::Unavailable(e.clone()));
                std::mem::forget(broken);
            } else {
                // Nothing of the call is left running: its list is free again.
                ring.lists[list_at].read = None;
            }
        }
        queued.map(|()| Some(stretches.runs))
    }

    /// Why backups are not gathered on this `Gpu`: the error of the staging's allocation at
    /// the first gathered backup (or of a broken context after a failed one); `None` while
    /// gathered backups are possible.
    pub fn gathered_backup_unavailable(&self) -> Option<KernelError> {
        match &*self.gathered.lock().ok()? {
            GatherState::Unavailable(e) => Some(e.clone()),
            GatherState::Untried | GatherState::Ready(_) => None,
        }
    }

    /// The staging slots and the two streams of the gathered backup.
    fn new_gather_ring(&self) -> Result<GatherRing, KernelError> {
        let (_least, greatest) = cudarc::driver::result::stream::get_priority_range()
            .map_err(driver_err("cuCtxGetStreamPriorityRange"))?;
        let staging = self.alloc_device(GATHER_SLOT_BYTES as usize * GATHER_SLOTS)?;
        let gather_stream = self
            .ctx
            .new_stream_with_priority(greatest)
            .map_err(driver_err("cuStreamCreateWithPriority"))?;
        let out_stream = self
            .ctx
            .new_stream()
            .map_err(driver_err("cuStreamCreate"))?;
        // The pinned list last: nothing after it can fail and drop it (a drop of pinned memory
        // waits for the whole device).
        let first_list = GatherList {
            host: self.alloc_pinned(GATHER_LIST_MIN_BYTES)?,
            read: None,
        };
        Ok(GatherRing {
            staging,
            gather_stream,
            out_stream,
            copied: (0..GATHER_SLOTS).map(|_| None).collect(),
            lists: vec![first_list],
            chunk: GatherChunk::default(),
        })
    }

    /// The index of the smallest gather-list buffer of at least `len_bytes` that no gather
    /// still reads (its event complete, asked once per buffer), else of a new one of the next
    /// power of two bytes (at least [`GATHER_LIST_MIN_BYTES`]). Buffers are never freed here:
    /// freeing pinned memory waits for the whole device, the model's kernels included; and
    /// allocating it may briefly stop other streams' work too (the CUDA guide's implicit
    /// synchronisation), so the ring starts with one buffer of [`GATHER_LIST_MIN_BYTES`].
    /// `None` when the allocation fails.
    fn free_gather_list(&self, ring: &mut GatherRing, len_bytes: usize) -> Option<usize> {
        // The smallest large-enough buffer no gather reads (best fit: a small call leaves the
        // large buffers to large calls); each buffer is asked at most once.
        let at = ring
            .lists
            .iter()
            .enumerate()
            .filter(|(_, l)| l.host.as_slice().len() >= len_bytes)
            .filter(|(_, l)| l.read.as_ref().is_none_or(CudaEvent::is_complete))
            .min_by_key(|(_, l)| l.host.as_slice().len())
            .map(|(at, _)| at);
        if let Some(at) = at {
            ring.lists[at].read = None;
            return Some(at);
        }
        let alloc_bytes = len_bytes
            .max(GATHER_LIST_MIN_BYTES)
            .checked_next_power_of_two()?;
        let host = self.alloc_pinned(alloc_bytes).ok()?;
        ring.lists.push(GatherList { host, read: None });
        Some(ring.lists.len() - 1)
    }

    /// The chunks of a gathered backup on the ring's streams, each enqueued as soon as it is
    /// planned, joined into the `Gpu`'s stream; returns the bytes the chunks gather.
    ///
    /// # Safety
    /// As [`Gpu::enqueue_gathered_backup`].
    unsafe fn enqueue_chunks(
        &self,
        ring: &mut GatherRing,
        list_at: usize,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        mut chunks: GatherChunks<'_>,
        shape: LaunchShape,
    ) -> Result<u64, KernelError> {
        let mut chunk = std::mem::take(&mut ring.chunk);
        // SAFETY: forwarded to the caller.
        let planned = unsafe {
            self.enqueue_planned(ring, list_at, src, dst, &mut chunks, &mut chunk, shape)
        };
        ring.chunk = chunk;
        planned
    }

    /// The loop of [`Gpu::enqueue_chunks`], planning each chunk into `chunk`.
    ///
    /// # Safety
    /// As [`Gpu::enqueue_gathered_backup`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn enqueue_planned(
        &self,
        ring: &mut GatherRing,
        list_at: usize,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        chunks: &mut GatherChunks<'_>,
        chunk: &mut GatherChunk,
        shape: LaunchShape,
    ) -> Result<u64, KernelError> {
        for stream in [&ring.gather_stream, &ring.out_stream] {
            stream
                .join(&self.stream)
                .map_err(driver_err("cuStreamWaitEvent"))?;
        }
        let (staging_base, host_base) = (ring.staging.device_address(), dst.device_address());
        let k = self.kernels()?;
        let mut planned_bytes = 0u64;
        let mut list_used_bytes = 0usize;
        while chunks.next_into(chunk) {
            if let Some(done) = &ring.copied[chunk.slot] {
                // The slot's previous copies out must have read it before the gather rewrites it.
                ring.gather_stream
                    .wait(done)
                    .map_err(driver_err("cuStreamWaitEvent"))?;
            }
            // The chunk's list, after the lists of the chunks before it in the call's buffer
            // (sized for the most pieces the plan can hold, `max_gather_pieces`).
            let list = &mut ring.lists[list_at];
            let chunk_list_bytes = chunk.gather.len() * RUN_BYTES;
            let words = list
                .host
                .as_mut_slice()
                .get_mut(list_used_bytes..list_used_bytes + chunk_list_bytes)
                .ok_or_else(|| {
                    KernelError::Unsupported("gather list longer than its bound".to_string())
                })?;
            write_run_list(words, &chunk.gather);
            let list_address = list.host.device_address() + list_used_bytes as u64;
            list_used_bytes += chunk_list_bytes;
            // SAFETY: the list was written just above; no call picks this buffer again until
            // the event recorded after this call's last gather has completed (the ring's lock
            // is held until that event is recorded, or, after an error, until the streams are
            // synchronised). Every gather run lies inside the device pool (a piece of a checked
            // run) and inside the staging buffer (the plan); both live until the streams finish.
            unsafe {
                self.launch_checked_run_list(
                    &ring.gather_stream,
                    &k.copy_runs,
                    (list_address, chunk.gather.len()),
                    src,
                    &mut ring.staging,
                    shape,
                )?
            };
            ring.out_stream
                .join(&ring.gather_stream)
                .map_err(driver_err("cuStreamWaitEvent"))?;
            // SAFETY: every stretch lies inside the staging buffer (the plan) and inside the
            // host pool (pieces of checked runs, host-contiguous); both live until the stream
            // finishes.
            unsafe {
                copy_engine::batch_on(
                    &ring.out_stream,
                    (staging_base, host_base),
                    &chunk.stretches,
                    CopyEngineHint::PreferOverlapWithCompute,
                    STRETCHES_PER_CALL,
                )?
            };
            ring.copied[chunk.slot] = Some(event(&ring.out_stream)?);
            planned_bytes += chunk.gather.iter().map(|r| r.len_bytes).sum::<u64>();
        }
        // The list is free once the last gather has read it.
        ring.lists[list_at].read = Some(event(&ring.gather_stream)?);
        // Every copy out waited for its gather: the last copy out ends the backup.
        self.stream
            .join(&ring.out_stream)
            .map_err(driver_err("cuStreamWaitEvent"))?;
        Ok(planned_bytes)
    }
}
