//! Run-list copies (the form the pool shim produces): the SM kernel ([`Gpu::copy_runs`], a
//! warp per run, checked on the GPU), the copy engines ([`Gpu::enqueue_copy_runs_dma`],
//! `cuMemcpyBatchAsync`, checked on the host), and the chooser between them
//! ([`Gpu::transfer_runs`]) that leaves the SMs to the model whenever the runs allow.

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::options::{HOST_ORDER_MAX_RUNS, RunKey, in_key_buckets_into};
use super::{
    Arg, CopyEngineOptions, Gpu, LaunchShape, MAX_COPY_ENGINE_LANES, MIN_PITCHED_LINES,
    PendingCheck, RunOrder, SELF_CHECK_MAX_ITEMS, TransferDirection, TransferPath, copy_engine,
};
use crate::copy_runs::{ByteRun, RunScan, scan_runs, validate_runs};
use crate::device_memory::{DeviceRuns, GpuBytes, driver_err};
use crate::error::KernelError;
use crate::pitched::group_pitched;

/// Fewest runs worth a stream of their own.
const MIN_RUNS_PER_LANE: usize = 1024;

/// Run lists up to this long are always sorted before merging (a few hundred microseconds of
/// host time at most); longer lists of token runs are merged in list order only, and put in
/// host order at bucket granularity when they are at most `HOST_ORDER_MAX_RUNS` long.
const SORT_ALWAYS_MAX_RUNS: usize = 4096;

impl Gpu {
    /// Copies every run of `runs` from `src` to `dst` (the contract of the pool crate's CPU
    /// backend, `CpuBackend::host_to_device`): every run is checked against both buffers'
    /// lengths on the GPU before any byte moves (inside the copy launch for at most
    /// `SELF_CHECK_MAX_ITEMS` runs, else by a validation launch), then a warp copies each
    /// run; waits. A bad run: [`KernelError::RunOutOfRange`], nothing copied.
    pub fn copy_runs(
        &self,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        runs: &DeviceRuns,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        // SAFETY: finish() waits before the borrows end.
        let queued = unsafe { self.enqueue_copy_runs(src, dst, runs, shape) };
        let finished = self.finish();
        queued.and(finished)
    }

    /// [`Gpu::copy_runs`] without the wait.
    ///
    /// # Safety
    /// `src` and `dst` must stay alive and untouched by the CPU until [`Gpu::finish`] returns
    /// (the GPU may still be reading and writing them).
    pub unsafe fn enqueue_copy_runs(
        &self,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        runs: &DeviceRuns,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let n = runs.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let (src_len, dst_len) = (src.len_bytes(), dst.len_bytes());
        let k = self.kernels()?;
        let uniform = super::token_runs::uniform_vectors(
            &runs.host,
            (src.device_address(), dst.device_address()),
        );
        // The uniform kernel does not check its list: a validation launch always goes first.
        let self_check = n <= SELF_CHECK_MAX_ITEMS && uniform.is_none();
        if !self_check {
            let args = [
                Arg::Word(runs.address()),
                Arg::Word(n),
                Arg::Word(src_len),
                Arg::Word(dst_len),
                Arg::Word(self.err_address()),
            ];
            // SAFETY: arguments match validate_runs; the list holds n runs of 3 words.
            unsafe {
                self.launch(
                    &k.validate_runs,
                    "cuLaunchKernel(validate_runs)",
                    self.grid(shape, n),
                    &args,
                )?
            };
        }
        self.note(PendingCheck(runs.host.clone(), src_len, dst_len))?;
        if let Some(vectors_per_run) = uniform {
            // SAFETY: the list holds n uniform runs (checked just above), each checked against
            // both lengths by the validation launch before it on the stream.
            return unsafe {
                self.launch_uniform(
                    &self.stream,
                    (runs.address(), n, vectors_per_run),
                    src,
                    dst,
                    shape,
                )
            };
        }
        let args = [
            Arg::Word(runs.address()),
            Arg::Word(n),
            Arg::Word(src.device_address()),
            Arg::Word(dst.device_address()),
            Arg::Word(src_len),
            Arg::Word(dst_len),
            Arg::Word(u64::from(self_check)),
            Arg::Word(self.err_address()),
        ];
        // SAFETY: arguments match copy_runs; every run is checked against both lengths on the
        // GPU before the kernel writes (validation launch or in-launch check).
        unsafe {
            self.launch(
                &k.copy_runs,
                "cuLaunchKernel(copy_runs)",
                self.grid(shape, n * 32),
                &args,
            )
        }
    }

    /// Copies every run with the copy engines (`cuMemcpyBatchAsync`, source read in stream
    /// order), after checking every run against both buffers' lengths on the host: a bad run
    /// is [`KernelError::RunOutOfRange`] and nothing is enqueued. The runs are put in
    /// `opts.order` and neighbours merged ([`RunOrder::sorted_and_merged`]) first, then split
    /// into `opts.lanes` consecutive parts (at most `MAX_COPY_ENGINE_LANES`), each batched
    /// (`opts.runs_per_call` runs per driver call) on its own stream forked from and joined
    /// back into this `Gpu`'s stream. Returns the number of runs after merging (a pitched group
    /// of them goes to the driver as one 2D copy when `opts.pitched`).
    ///
    /// # Safety
    /// As [`Gpu::enqueue_copy_runs`].
    pub unsafe fn enqueue_copy_runs_dma(
        &self,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        runs: &[ByteRun],
        opts: CopyEngineOptions,
    ) -> Result<u64, KernelError> {
        validate_runs(runs, src.len_bytes(), dst.len_bytes())?;
        let merged = opts.order.sorted_and_merged(runs);
        let bases = (src.device_address(), dst.device_address());
        // SAFETY: forwarded to the caller; the merged runs lie inside both buffers.
        unsafe { self.enqueue_lanes(bases, &merged, opts)? };
        Ok(merged.len() as u64)
    }

    /// The helper streams of the copy-engine lanes, created at first use.
    fn copy_streams(&self) -> Result<&[Arc<CudaStream>], KernelError> {
        self.copy_streams
            .get_or_init(|| {
                (0..MAX_COPY_ENGINE_LANES)
                    .map(|_| self.ctx.new_stream().map_err(driver_err("cuStreamCreate")))
                    .collect()
            })
            .as_deref()
            .map_err(Clone::clone)
    }

    /// Checked runs split over `lanes` streams forked from the `Gpu`'s stream and joined back.
    ///
    /// # Safety
    /// As [`Gpu::enqueue_batch`].
    unsafe fn enqueue_lanes(
        &self,
        bases: (u64, u64),
        runs: &[ByteRun],
        opts: CopyEngineOptions,
    ) -> Result<(), KernelError> {
        // Forking costs two events per stream: small lists stay on one stream (1 and 8 pages of
        // a DSA layer went from 0.98 and 0.80 of memcpy on one stream to 0.51 and 0.35 on
        // two, BENCHMARKS.md).
        if runs.is_empty() {
            return Ok(());
        }
        let lanes = opts
            .lanes
            .clamp(1, MAX_COPY_ENGINE_LANES)
            .min(runs.len().div_ceil(MIN_RUNS_PER_LANE));
        if lanes == 1 {
            // SAFETY: forwarded.
            return unsafe { self.enqueue_batch(bases, runs, opts, &self.stream) };
        }
        let streams = self.copy_streams()?;
        let mut forked = 0;
        let mut parts = runs.chunks(runs.len().div_ceil(lanes)).zip(streams);
        let queued = parts.try_for_each(|(part, stream)| {
            stream
                .join(&self.stream)
                .map_err(driver_err("cuStreamWaitEvent"))?;
            forked += 1;
            // SAFETY: forwarded; the part runs after everything enqueued before it on the
            // `Gpu`'s stream (the fork), which waits for it below (the join).
            unsafe { self.enqueue_batch(bases, part, opts, stream)? };
            self.stream
                .join(stream)
                .map_err(driver_err("cuStreamWaitEvent"))
        });
        if queued.is_err() {
            // A lane may hold copies the `Gpu`'s stream does not wait for: wait for them here
            // (best effort: a broken context fails this too, and then nothing runs).
            for stream in &streams[..forked] {
                let _ = stream.synchronize();
            }
        }
        queued
    }

    /// Checked runs on `stream`, in list order: with `opts.pitched`, each group of at least
    /// `MIN_PITCHED_LINES` runs with constant pitches ([`group_pitched`]) as one
    /// `cuMemcpy2DAsync`, the runs between them batched; else all batched.
    ///
    /// # Safety
    /// Every run lies inside both buffers, which stay alive until the stream has finished.
    unsafe fn enqueue_batch(
        &self,
        bases: (u64, u64),
        runs: &[ByteRun],
        opts: CopyEngineOptions,
        stream: &CudaStream,
    ) -> Result<(), KernelError> {
        let batch = |part: &[ByteRun]| {
            // SAFETY: forwarded; `part` is a slice of the checked runs.
            unsafe { copy_engine::batch_on(stream, bases, part, opts.hint, opts.runs_per_call) }
        };
        if !opts.pitched {
            return batch(runs);
        }
        // Groups are consecutive stretches of `runs`: the runs between long groups are batched
        // as slices of the list, in list order.
        let (mut first_single, mut at) = (0, 0);
        for g in group_pitched(runs, self.max_pitch_bytes) {
            let lines = g.lines() as usize;
            if g.lines() >= MIN_PITCHED_LINES {
                batch(&runs[first_single..at])?;
                // SAFETY: forwarded; every line of the group is one of the checked runs.
                unsafe { copy_engine::pitched_on(stream, bases, &g)? };
                first_single = at + lines;
            }
            at += lines;
        }
        batch(&runs[first_single..])
    }

    /// Moves `runs` from `src` to `dst` by the path the runs call for, chosen with no tuning by
    /// the caller ([`TransferPath::choose`] on the runs after merging: page runs put in
    /// `order` first, token runs merged in list order only, then, up to `HOST_ORDER_MAX_RUNS` of
    /// them (a layer's load), put in host order at bucket granularity
    /// ([`super::options::in_key_buckets_into`]); the
    /// direction read from the buffers' memory types, and the model's SM carve-out if one was
    /// set with [`Gpu::set_model_carveout_sms`]): page runs go to the copy engines (no SM taken
    /// from the model) unless a load or backup can use the carve-out (a load: split between
    /// the run-list kernel on it and the copy engines, [`mod@crate::split_load`]; a backup:
    /// gathered on it into device staging, then copied out one host-contiguous stretch at a
    /// time, planned in list order when the list lays each host stretch's runs together, as
    /// the pool shim does, else in host order; a backup whose runs write overlapping host
    /// bytes, or whose merged runs would not merge into stretches at least two runs long on
    /// average, or number fewer than `CARVEOUT_MIN_RUNS` = 64, or whose staging or list
    /// memory cannot be allocated, keeps the copy engines);
    /// token-granular loads go to the
    /// run-list kernel on the carve-out, or on at most `SM_BUDGET` = 8 SMs without one; token
    /// backups of one run length the token kernel takes to it on `TOKEN_BACKUP_BLOCKS` = 8 blocks
    /// of one per SM, paced on a carve-out to a share of the host link
    /// ([`Gpu::set_backup_link_share_permille`]: SM stores near the link's limit slow the
    /// model; the first such backup measures the link, [`Gpu::host_link_bytes_per_us`]: 4
    /// copies of 8 MiB waited for, 16 MiB kept, a failure there a [`KernelError::Driver`]);
    /// a list the token kernel takes as given but not after merging (neighbours that continue
    /// each other make two lengths) moves as given, so it stays paced; other token backups
    /// (several run lengths, or a buffer base not 16-byte aligned) are gathered on a carve-out
    /// when that pays (at least `CARVEOUT_MIN_RUNS` = 64 runs, host stretches of two runs or more
    /// on average), else go unpaced to the run-list kernel, on the carve-out or on
    /// `SM_BUDGET` = 8 SMs ([`TransferPath::choose`]).
    /// The kernel's run lists go through a ring of slots, with no stream synchronisation.
    /// Either way every run is checked on the host before any byte moves
    /// ([`KernelError::RunOutOfRange`]). A list with no bytes to move enqueues nothing and
    /// returns `CopyEngines { runs: 0 }`. Does not wait for the transfer, except to reuse a
    /// slot of the 8-slot run-list ring (eight kernel launches behind) on the SM paths; a
    /// gathered backup's lists go to a pinned buffer of the call's own. (The staged path,
    /// [`Gpu::enqueue_staged_runs`], is not chosen: on the H200 it moved 0.56-0.69 of memcpy
    /// against the copy engines' 0.71-0.95, BENCHMARKS.md.)
    ///
    /// # Safety
    /// As [`Gpu::enqueue_copy_runs`].
    pub unsafe fn enqueue_transfer_runs(
        &self,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        runs: &[ByteRun],
        order: RunOrder,
    ) -> Result<TransferPath, KernelError> {
        let _call = crate::host_timing::start(crate::host_timing::Step::Call);
        // One pass: every run checked, and what the choice below reads from the list.
        let bases = (src.device_address(), dst.device_address());
        let scan = {
            let _t = crate::host_timing::start(crate::host_timing::Step::Scan);
            for_bases(scan_runs(runs, src.len_bytes(), dst.len_bytes())?, bases)
        };
        let direction = match (src.host_bytes().is_some(), dst.host_bytes().is_some()) {
            (true, false) => TransferDirection::Load,
            (false, true) => TransferDirection::Backup,
            _ => TransferDirection::Other,
        };
        let carveout = self.model_carveout_sms().filter(|&k| k > 0);
        if let (TransferDirection::Backup, Some(k)) = (direction, carveout) {
            // A backup is gathered in list order when that pays, with no sort and no merge
            // (the stretches merge what continues on the host; a merged copy of a 124,928-run
            // list took 0.3-1.6 ms of the host before the first gather): the pool shim lays
            // each host stretch's runs one after the other (a page pair's layers).
            if let TransferPath::GatheredBackup { max_sms, .. } =
                TransferPath::choose_scanned(&scan, direction, Some(k))
            {
                // SAFETY: forwarded to the caller; every run was checked just above.
                if let Some(path) = unsafe { self.try_gathered_backup(src, dst, runs, max_sms)? } {
                    return Ok(path);
                }
            }
        }
        // The host side's key, for a token list put in host order.
        let host_key: Option<RunKey> = match direction {
            TransferDirection::Load => Some((|r| r.src_offset_bytes, src.len_bytes())),
            TransferDirection::Backup => Some((|r| r.dst_offset_bytes, dst.len_bytes())),
            TransferDirection::Other => None,
        };
        // The host-ordered copy goes to buffers the `Gpu` keeps (no allocation per layer).
        // The buffers are rewritten before each use: a panic that poisoned the lock left
        // nothing to distrust.
        let mut scratch = self
            .order_scratch
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (merged, same_runs) = prepared_runs(runs, &scan, order, host_key, &mut scratch);
        if merged.is_empty() {
            // Nothing to move (no runs, or only empty ones): nothing enqueued.
            return Ok(TransferPath::CopyEngines { runs: 0 });
        }
        let (merged, scan) = if same_runs {
            (merged, scan)
        } else {
            let merged_scan =
                for_bases(scan_runs(&merged, src.len_bytes(), dst.len_bytes())?, bases);
            let token =
                |s: &RunScan| direction != TransferDirection::Other && s.takes_token_kernel();
            if token(&scan) && !token(&merged_scan) {
                // A token list (of at most SORT_ALWAYS_MAX_RUNS runs: `prepared_runs` keeps
                // longer ones as they are) the token kernel takes as listed but not merged (a
                // few runs that continue each other make two lengths): as listed, so it stays
                // on the token kernel (paced, for a backup).
                (Cow::Borrowed(runs), scan)
            } else {
                (merged, merged_scan)
            }
        };
        let mut path = TransferPath::choose_scanned(&scan, direction, carveout);
        // A staged load before this one may still be scattering on its own stream.
        self.join_staged()?;
        if let TransferPath::GatheredBackup { max_sms, .. } = path {
            // In list order it did not pay (or the list is not a backup's as given): in host
            // order. Backups are merged in host order (`order` is DstAscending for the pool
            // backend; sorted here for any other caller).
            let host_order = match order {
                RunOrder::DstAscending => None,
                _ => Some(RunOrder::DstAscending.sorted_and_merged(runs)),
            };
            let in_host_order = host_order.as_deref().unwrap_or(&*merged);
            // SAFETY: forwarded to the caller; every run was checked just above.
            let gathered = unsafe { self.try_gathered_backup(src, dst, in_host_order, max_sms)? };
            if let Some(path) = gathered {
                return Ok(path);
            }
            // Not gathered (module docs of `gathered`): the copy engines for page runs, the
            // run-list kernel on the carve-out for token runs of several lengths (unpaced: the
            // token kernel does not take them).
            path = if scan.is_page_runs() {
                TransferPath::CopyEngines {
                    runs: merged.len() as u64,
                }
            } else {
                TransferPath::SmKernel {
                    max_sms,
                    runs: merged.len() as u64,
                }
            };
        }
        match path {
            // (A gathered backup has returned, or become CopyEngines, above.)
            TransferPath::CopyEngines { .. } | TransferPath::GatheredBackup { .. } => {
                let bases = (src.device_address(), dst.device_address());
                // SAFETY: forwarded to the caller; checked just above.
                unsafe { self.enqueue_lanes(bases, &merged, CopyEngineOptions::chosen(order))? }
            }
            TransferPath::SplitLoad { max_sms, .. } => {
                // SAFETY: forwarded to the caller; every merged run was checked just above.
                unsafe { self.enqueue_split_load(src, dst, &merged, max_sms, order)? }
            }
            TransferPath::SmKernel { max_sms, .. } => {
                let bases = (src.device_address(), dst.device_address());
                let vectors_per_run = scan
                    .uniform_len_bytes
                    .and_then(|len| super::token_runs::vectors_of_uniform(len, bases));
                // SAFETY: forwarded to the caller; every merged run was checked just above;
                // `vectors_per_run` from the scan of `merged`.
                unsafe {
                    self.enqueue_checked_runs_from_ring(
                        &self.stream,
                        src,
                        dst,
                        (&merged, vectors_per_run),
                        self.token_launch_shape(
                            direction == TransferDirection::Backup && vectors_per_run.is_some(),
                            carveout,
                            max_sms,
                        )?,
                        false,
                    )?
                }
            }
        }
        Ok(path)
    }

    /// The SM path's launch on `max_sms` SMs: as many blocks per SM as the token kernel keeps
    /// resident, except a `token_backup` (a backup the token kernel takes): one block per SM
    /// (`TOKEN_BACKUP_BLOCKS` = 8), paced to a share of the host link when the model declared a
    /// carve-out (`carveout`), measuring the link at the first such call
    /// ([`Gpu::host_link_bytes_per_us`]).
    fn token_launch_shape(
        &self,
        token_backup: bool,
        carveout: Option<u32>,
        max_sms: u32,
    ) -> Result<LaunchShape, KernelError> {
        if !token_backup {
            return Ok(LaunchShape {
                blocks_per_sm: super::token_runs::TOKEN_BLOCKS_PER_SM,
                ..LaunchShape::sm_budget(max_sms)
            });
        }
        let rate_limit_bytes_per_us = match carveout {
            Some(_) => self.backup_rate_limit_bytes_per_us()?,
            None => None,
        };
        Ok(LaunchShape {
            blocks_per_sm: 1,
            rate_limit_bytes_per_us,
            ..LaunchShape::sm_budget(max_sms)
        })
    }

    /// A gathered backup of `runs` (checked against both buffers; planned in this order) with
    /// the gather on `max_sms` SMs, after any staged load's scatter: its path, or `None`, having
    /// enqueued nothing, when it is not to be gathered ([`Gpu::enqueue_gathered_backup`]).
    ///
    /// # Safety
    /// As [`Gpu::enqueue_copy_runs`].
    unsafe fn try_gathered_backup(
        &self,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        runs: &[ByteRun],
        max_sms: u32,
    ) -> Result<Option<TransferPath>, KernelError> {
        self.join_staged()?;
        // SAFETY: forwarded to the caller.
        let gathered = unsafe {
            self.enqueue_gathered_backup(src, dst, runs, LaunchShape::sm_budget(max_sms))?
        };
        Ok(gathered.map(|runs| TransferPath::GatheredBackup { max_sms, runs }))
    }

    /// The stream of a split load's kernel part (normal priority: on a high-priority stream
    /// its blocks took SMs freed between the model's kernels before the model's next blocks,
    /// and slowed a GEMM by 4.5-6.7%, BENCHMARKS.md "Session 5").
    fn split_stream(&self) -> Result<&Arc<CudaStream>, KernelError> {
        self.split_stream
            .get_or_init(|| self.ctx.new_stream().map_err(driver_err("cuStreamCreate")))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// A load split ([`mod@crate::split_load`]): the kernel's part on `max_sms` SMs on a side
    /// stream, the copy engines' part on the `Gpu`'s stream, both after the work
    /// enqueued before, the `Gpu`'s stream then waiting for the kernel's part. On an error
    /// after the fork, waits for the side stream (nothing of the call is left running
    /// that a later `finish` would not wait for).
    ///
    /// # Safety
    /// As [`Gpu::enqueue_copy_runs`]; every run already checked against both buffers.
    unsafe fn enqueue_split_load(
        &self,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        runs: &[ByteRun],
        max_sms: u32,
        order: RunOrder,
    ) -> Result<(), KernelError> {
        let (kernel, engines) =
            crate::split_load::split_load(runs, crate::split_load::kernel_share_permille(max_sms));
        let shape = LaunchShape {
            blocks_per_sm: crate::split_load::SPLIT_KERNEL_BLOCKS_PER_SM,
            ..LaunchShape::sm_budget(max_sms)
        };
        let side = self.split_stream()?;
        side.join(&self.stream)
            .map_err(driver_err("cuStreamWaitEvent"))?;
        let bases = (src.device_address(), dst.device_address());
        let queued = (|| {
            // SAFETY: forwarded; the kernel's part runs on `side` after the fork, and the
            // `Gpu`'s stream waits for it below.
            unsafe {
                let vectors_per_run = super::token_runs::uniform_vectors(&kernel, bases);
                self.enqueue_checked_runs_from_ring(
                    side,
                    src,
                    dst,
                    (&kernel, vectors_per_run),
                    shape,
                    true,
                )?
            };
            // SAFETY: forwarded; a slice of the checked runs on the `Gpu`'s stream.
            unsafe { self.enqueue_lanes(bases, &engines, CopyEngineOptions::chosen(order))? };
            self.stream
                .join(side)
                .map_err(driver_err("cuStreamWaitEvent"))
        })();
        if queued.is_err() {
            // Best effort: a broken context fails this too, and then nothing runs.
            let _ = side.synchronize();
        }
        queued
    }

    /// [`Gpu::enqueue_transfer_runs`], then waits; returns the path taken.
    pub fn transfer_runs(
        &self,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        runs: &[ByteRun],
        order: RunOrder,
    ) -> Result<TransferPath, KernelError> {
        // SAFETY: finish() waits before the borrows end.
        let queued = unsafe { self.enqueue_transfer_runs(src, dst, runs, order) };
        let finished = self.finish();
        let path = queued?;
        finished.map(|()| path)
    }
}

/// `scan` for buffers at device addresses `bases`: a list of one run length the token kernel
/// could take counts as of several lengths when a base is not 16-byte aligned (the token kernel
/// needs both; buffers the driver allocates always are), so the chooser never routes to the
/// paced kernel a list the launch would give to the unpaced one.
fn for_bases(scan: RunScan, bases: (u64, u64)) -> RunScan {
    let aligned = |a: u64| a.is_multiple_of(crate::copy_runs::VECTOR_BYTES);
    if aligned(bases.0) && aligned(bases.1) {
        scan
    } else {
        RunScan {
            uniform_len_bytes: None,
            ..scan
        }
    }
}

/// The list the chooser moves, and whether it holds exactly the runs `scan` read (maybe
/// reordered: the scan's count, bytes and uniform length still hold). Page runs, and lists of
/// at most `SORT_ALWAYS_MAX_RUNS` runs, are put in `order` and merged. Long lists of token runs
/// are merged with their neighbours in list order only (engines list a page's tokens in order),
/// and not at all when the token kernel takes them (merging would make two lengths):
/// sorting 49,152 token runs per layer took the host longer than the GPU takes to move them
/// (BENCHMARKS.md, "Session 4"); merging never shortens the mean run, so a list long before
/// merging is long after. A long token list of at most `HOST_ORDER_MAX_RUNS` runs (a layer's
/// load) is then put in host order at bucket granularity by `host_key` into `scratch`
/// (`in_key_buckets_into`: two passes, no comparison sort), which moved MLA loads 1.35x faster
/// next to a GEMM than the engine's random slot order (BENCHMARKS.md, "GPU at page size 1"); a
/// longer one (a backup of all layers) keeps list order, and one that merges nowhere is used
/// as given when it is not reordered.
fn prepared_runs<'a>(
    runs: &'a [ByteRun],
    scan: &RunScan,
    order: RunOrder,
    host_key: Option<RunKey>,
    (out, starts): &'a mut (Vec<ByteRun>, Vec<usize>),
) -> (Cow<'a, [ByteRun]>, bool) {
    if runs.len() <= SORT_ALWAYS_MAX_RUNS || scan.is_page_runs() {
        return (Cow::Owned(order.sorted_and_merged(runs)), false);
    }
    // A list the token kernel takes is not merged: a few neighbours merging would make two
    // lengths, which it does not take (a trial: 1,000 Llama K+V rows of 4,096 B, two of them
    // continuing each other, went to the copy engines as page runs).
    let merge = scan.changed_by_merging && !scan.takes_token_kernel();
    let (listed, listed_long) = if merge {
        let merged = RunOrder::AsGiven.sorted_and_merged(runs);
        let long = TransferPath::mean_is_long(&merged);
        (Cow::Owned(merged), long)
    } else {
        (Cow::Borrowed(runs), false)
    };
    if listed.len() <= SORT_ALWAYS_MAX_RUNS || listed_long {
        return (Cow::Owned(order.sorted_and_merged(runs)), false);
    }
    let same_runs = !merge;
    match host_key.filter(|_| listed.len() <= HOST_ORDER_MAX_RUNS) {
        Some(key) => {
            let _t = crate::host_timing::start(crate::host_timing::Step::Order);
            in_key_buckets_into(&listed, key, out, starts);
            (Cow::Borrowed(&out[..]), same_runs)
        }
        None => (listed, same_runs),
    }
}

#[cfg(test)]
mod tests {
    use super::{for_bases, prepared_runs};
    use crate::copy_runs::{ByteRun, scan_runs};
    use crate::device::RunOrder;

    #[test]
    fn an_unaligned_base_makes_a_token_list_one_the_token_kernel_does_not_take() {
        // Two MLA rows (1,152 B = 72 x 16) at 16-byte offsets: the token kernel's, when both
        // buffers start 16-byte aligned (the driver's 256 B alignment, 4,096 B here).
        let runs = [ByteRun::new(0, 1152, 1152), ByteRun::new(4608, 0, 1152)];
        let scan = scan_runs(&runs, 1 << 20, 1 << 20).unwrap();
        assert!(for_bases(scan, (4096, 8192)).takes_token_kernel());
        // A base 8 bytes off on either side: not (its 16-byte vectors would straddle).
        assert!(!for_bases(scan, (4104, 8192)).takes_token_kernel());
        assert!(!for_bases(scan, (4096, 8200)).takes_token_kernel());
        // The other facts are kept.
        let off = for_bases(scan, (8, 0));
        assert_eq!((off.runs, off.total_bytes), (2, 2304));
    }

    /// A trial: 1,000 Llama K+V rows of 4,096 B (the token kernel's), two of them continuing
    /// each other on both sides, were merged into 999 runs of two lengths and went to the copy
    /// engines. A list the token kernel takes is not merged past `SORT_ALWAYS_MAX_RUNS`
    /// (4,096): 5,000 such rows stay 5,000, every run kept (host-ordered for a load); a list
    /// of two lengths is still merged.
    #[test]
    fn a_token_list_the_token_kernel_takes_is_not_merged() {
        // Row i at host slot 2i and device slot 3i, 4,096 B; row 1 moved right after row 0 on
        // both sides (host 4,096, device 4,096): they continue each other.
        let mut runs: Vec<ByteRun> = (0..5000u64)
            .map(|i| ByteRun::new(i * 2 * 4096, i * 3 * 4096, 4096))
            .collect();
        runs[1] = ByteRun::new(4096, 4096, 4096);
        // The list a host-ordered load of `runs` moves, and whether it holds exactly `runs`.
        let prepare = |runs: &[ByteRun]| {
            let scan = scan_runs(runs, 1 << 40, 1 << 40).unwrap();
            let key: super::RunKey = (|r| r.src_offset_bytes, 1 << 40);
            let mut scratch = (Vec::new(), Vec::new());
            let (list, same_runs) =
                prepared_runs(runs, &scan, RunOrder::SrcAscending, Some(key), &mut scratch);
            (scan, list.to_vec(), same_runs)
        };
        let (scan, mut got, same_runs) = prepare(&runs);
        assert!(scan.changed_by_merging && scan.takes_token_kernel());
        assert!(same_runs);
        got.sort_by_key(|r| r.src_offset_bytes);
        let mut want = runs.clone();
        want.sort_by_key(|r| r.src_offset_bytes);
        assert_eq!(got, want);
        // The same list with row 1 of 2,048 B (two lengths): merged (rows 0 and 1 become one
        // run of 6,144 B), 4,999 runs.
        runs[1] = ByteRun::new(4096, 4096, 2048);
        let (_, list, same_runs) = prepare(&runs);
        assert!(!same_runs);
        assert_eq!(list.len(), 4999);
        assert!(list.contains(&ByteRun::new(0, 0, 6144)));
    }
}
