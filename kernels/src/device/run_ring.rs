//! Run lists for the SM path without a stream synchronisation: a ring of `RUN_RING_SLOTS`
//! slots of `RUN_RING_SLOT_RUNS` runs, each a pinned host half and a device half. A list (the
//! host has checked every run against both buffers) is written into the next slot's host
//! half, then either copied to its device half with one `cuMemcpyAsync` on the ring's own list
//! stream, which the kernel's stream waits for by an event, or (a split load's kernel part)
//! read by the kernel from the host half in place; the run-list kernel is launched right
//! behind; an event after the kernel marks the slot free again. The copy of the next layer's
//! list runs while the kernel of this one moves, so the kernel's stream holds kernels and
//! event waits only (on the H200 next to a GEMM, page-size-1 loads through the chooser moved
//! 0-4% more than with the copy on the kernel's stream: within run-to-run spread; session 11,
//! BENCHMARKS.md "GPU at page size 1"). A list longer than a slot goes as several launches, one slot each. The
//! host waits only when the ring wraps onto a slot whose kernel has not finished (eight
//! launches behind), so a layer-by-layer load is enqueued without a stall per layer; the old
//! path (`Gpu::upload_runs`, a synchronous upload per call) cost the token-granular load most
//! of its time (0.084 of memcpy, BENCHMARKS.md). (A gathered backup's lists do not use the
//! ring: they go to a pinned buffer of the call's own, `gathered.rs`.)

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaEvent, CudaStream, sys};

use super::{Arg, Gpu, LaunchShape};
use crate::copy_runs::ByteRun;
use crate::device_memory::{DeviceBytes, GpuBytes, PinnedBytes, driver_err};
use crate::error::KernelError;

/// Slots in the ring (launches in flight before the host waits).
pub(crate) const RUN_RING_SLOTS: usize = 8;
/// Runs per slot (one launch): 32,768 runs of 24 bytes, 768 KiB per half. A layer of a
/// 4,096-page DSA load is 8,192 runs; a layer of Llama-3.1-8B's page-size-1 load of 16,384
/// tokens, 32,768 (K and V).
pub(crate) const RUN_RING_SLOT_RUNS: usize = 32 * 1024;

/// Bytes of one run in a list (three little-endian `u64`: src, dst, len).
pub(super) const RUN_BYTES: usize = 24;
const SLOT_BYTES: usize = RUN_RING_SLOT_RUNS * RUN_BYTES;

/// Writes `runs` into `words` (`runs.len() * RUN_BYTES` bytes) as the run-list kernel reads
/// them: three little-endian `u64` per run (src, dst, len).
pub(super) fn write_run_list(words: &mut [u8], runs: &[ByteRun]) {
    for (w, r) in words.chunks_exact_mut(RUN_BYTES).zip(runs) {
        w[..8].copy_from_slice(&r.src_offset_bytes.to_le_bytes());
        w[8..16].copy_from_slice(&r.dst_offset_bytes.to_le_bytes());
        w[16..].copy_from_slice(&r.len_bytes.to_le_bytes());
    }
}

/// The ring: both halves of every slot, two events per slot, the stream of the list copies.
pub(super) struct RunRing {
    host: PinnedBytes,
    dev: DeviceBytes,
    /// Per slot: the kernel that read it has finished (recorded on the stream it ran on).
    done: Vec<CudaEvent>,
    /// Per slot: its list has reached the device half (recorded on `lists`).
    copied: Vec<CudaEvent>,
    /// The stream the lists are copied on, ahead of the kernels that read them.
    lists: Arc<CudaStream>,
    used: Vec<bool>,
    next: usize,
}

pub(super) type RunRingCell = Mutex<Option<RunRing>>;

impl Gpu {
    /// Enqueues the run-list kernel over `runs` (already checked against both buffers'
    /// lengths; `vectors_per_run` as [`Gpu::launch_run_list`] takes it) under `shape` on
    /// `stream` (the `Gpu`'s, or another of its context), the list
    /// through the ring. Does not wait. With `list_from_host` the kernel reads the list from
    /// the slot's pinned host half (no copy to the device half): a split load's kernel then
    /// does not wait for a list copy queued on the copy engines behind the load's own batch.
    ///
    /// # Safety
    /// Every run lies inside both buffers, which stay alive and untouched by the CPU until the
    /// stream has finished.
    pub(super) unsafe fn enqueue_checked_runs_from_ring(
        &self,
        stream: &CudaStream,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        (runs, vectors_per_run): (&[ByteRun], Option<u64>),
        shape: LaunchShape,
        list_from_host: bool,
    ) -> Result<(), KernelError> {
        let mut guard = self
            .run_ring
            .lock()
            .map_err(|_| KernelError::Unsupported("poisoned lock".to_string()))?;
        if guard.is_none() {
            // The pinned half last: dropping pinned memory (if a later step failed) waits for
            // the whole device, the model's kernels included.
            let dev = self.alloc_device(SLOT_BYTES * RUN_RING_SLOTS)?;
            let events = || {
                (0..RUN_RING_SLOTS)
                    .map(|_| {
                        self.ctx
                            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                            .map_err(driver_err("cuEventCreate"))
                    })
                    .collect::<Result<Vec<_>, _>>()
            };
            let (done, copied) = (events()?, events()?);
            let lists = self
                .ctx
                .new_stream()
                .map_err(driver_err("cuStreamCreate"))?;
            *guard = Some(RunRing {
                host: self.alloc_pinned(SLOT_BYTES * RUN_RING_SLOTS)?,
                dev,
                done,
                copied,
                lists,
                used: vec![false; RUN_RING_SLOTS],
                next: 0,
            });
        }
        let ring = guard
            .as_mut()
            .ok_or_else(|| KernelError::Unsupported("run ring missing".to_string()))?;
        for part in runs.chunks(RUN_RING_SLOT_RUNS) {
            // SAFETY: forwarded to the caller.
            let queued = unsafe {
                self.enqueue_one_slot(
                    stream,
                    ring,
                    (src, dst),
                    (part, vectors_per_run),
                    shape,
                    list_from_host,
                )
            };
            if let Err(e) = queued {
                // Something may be queued that reads a slot whose event was not recorded:
                // wait for both streams, so no later call rewrites a slot the GPU still reads.
                let lists_done = ring.lists.synchronize();
                if stream.synchronize().is_err() || lists_done.is_err() {
                    // The context is broken: keep the ring's memory alive rather than free
                    // it under work that may still reference it.
                    if let Some(ring) = guard.take() {
                        std::mem::forget(ring);
                    }
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// One launch of [`Gpu::enqueue_checked_runs_from_ring`]: `part` (at most
    /// `RUN_RING_SLOT_RUNS` runs) through the next slot.
    ///
    /// # Safety
    /// As [`Gpu::enqueue_checked_runs_from_ring`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn enqueue_one_slot(
        &self,
        stream: &CudaStream,
        ring: &mut RunRing,
        (src, dst): (&dyn GpuBytes, &mut dyn GpuBytes),
        (part, vectors_per_run): (&[ByteRun], Option<u64>),
        shape: LaunchShape,
        list_from_host: bool,
    ) -> Result<(), KernelError> {
        let slot = ring.next;
        if ring.used[slot] {
            // Both halves are rewritten below: the kernel (and the copy before it) that used
            // this slot must be done; the list stream's next copy needs no other wait.
            let _t = crate::host_timing::start(crate::host_timing::Step::RingWait);
            ring.done[slot]
                .synchronize()
                .map_err(driver_err("cuEventSynchronize"))?;
        }
        ring.next = (slot + 1) % RUN_RING_SLOTS;
        let at_bytes = slot * SLOT_BYTES;
        let list_bytes = part.len() * RUN_BYTES;
        {
            let _t = crate::host_timing::start(crate::host_timing::Step::ListWrite);
            write_run_list(
                &mut ring.host.as_mut_slice()[at_bytes..at_bytes + list_bytes],
                part,
            );
        }
        let _driver = crate::host_timing::start(crate::host_timing::Step::Driver);
        let (host_list, dev_list) = (
            ring.host.device_address() + at_bytes as u64,
            ring.dev.device_address() + at_bytes as u64,
        );
        // From here the slot is in use until its event: a failure below leaves it marked used
        // with an event from an earlier use, and the caller waits for the whole stream.
        ring.used[slot] = true;
        let list = if list_from_host {
            host_list
        } else {
            // SAFETY: both halves are live allocations of the ring; `list_bytes` bytes at
            // `at_bytes` lie in slot `slot` of each; the kernel that last read the device half
            // has finished (waited for above).
            unsafe { sys::cuMemcpyAsync(dev_list, host_list, list_bytes, ring.lists.cu_stream()) }
                .result()
                .map_err(driver_err("cuMemcpyAsync"))?;
            ring.copied[slot]
                .record(&ring.lists)
                .map_err(driver_err("cuEventRecord"))?;
            stream
                .wait(&ring.copied[slot])
                .map_err(driver_err("cuStreamWaitEvent"))?;
            dev_list
        };
        // SAFETY: the list holds the part's runs (the host half, written above, or the device
        // half, copied on the list stream before the event the kernel's stream waits for);
        // every run lies inside both buffers (caller).
        unsafe { self.launch_run_list(stream, list, part, vectors_per_run, src, dst, shape)? };
        ring.done[slot]
            .record(stream)
            .map_err(driver_err("cuEventRecord"))?;
        Ok(())
    }

    /// The run-list kernel (no check in the launch) over the `n` runs at device-readable
    /// address `list` (device memory, or pinned host memory mapped for the device), under
    /// `shape` on `stream`.
    ///
    /// # Safety
    /// The list holds `n` runs written as [`write_run_list`] writes them, readable until the
    /// kernel has run; every run lies inside both buffers, which stay alive and untouched by
    /// the CPU until the stream has finished.
    pub(super) unsafe fn launch_checked_run_list(
        &self,
        stream: &CudaStream,
        copy_runs: &cudarc::driver::CudaFunction,
        (list, n): (u64, usize),
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let n = n as u64;
        let args = [
            Arg::Word(list),
            Arg::Word(n),
            Arg::Word(src.device_address()),
            Arg::Word(dst.device_address()),
            Arg::Word(src.len_bytes()),
            Arg::Word(dst.len_bytes()),
            // Checked on the host before this call: no check in the launch.
            Arg::Word(0),
            Arg::Word(self.err_address()),
        ];
        // SAFETY: arguments match copy_runs; the list and the buffers as the caller promises.
        unsafe {
            self.launch_on(
                stream,
                copy_runs,
                "cuLaunchKernel(copy_runs)",
                self.grid(shape, n * 32),
                &args,
            )
        }
    }
}
