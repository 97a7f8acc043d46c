//! The GPU backend: one CUDA context and stream, kernels compiled at first use with NVRTC for
//! the device's architecture and cached in the [`Gpu`] (one per context), and the checked
//! run-list transfers.
//!
//! Every kernel launch is preceded by a check of its run list: on the host (the chooser,
//! [`Gpu::transfer_runs`]) or on the same stream (a validation launch, or the first copy launch
//! checking a short list itself, [`Gpu::copy_runs`]); a work kernel reads the error record and
//! moves nothing if any run was out of range. The safe calls then wait for the stream and turn
//! the record into a typed error. The `enqueue_*` calls return before the GPU is done (for batching
//! and timing) and leave the error for [`Gpu::finish`]; an error stays set, and blocks every
//! later launch on the stream, until `finish` reports it. Copy-engine transfers check their
//! runs on the host before the driver sees them.
//!
//! Modules, one concept each: [`options`] (launch shapes, orders, the transfer chooser),
//! [`copy_engine`] (the copy engines' driver calls on a stream),
//! `memory` (allocation, uploads, byte access), `runs` (run-list copies: SM kernel, copy
//! engines, and the chooser), `token_runs` (the token-granular kernel), `run_ring` (run lists
//! uploaded without a host sync), `gathered` (backups gathered on the device), `staging` (the
//! staged path: host threads and one contiguous copy per chunk).

pub mod copy_engine;
mod gathered;
mod link;
mod memory;
pub mod options;
mod run_ring;
mod runs;
mod staging;
mod token_runs;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchConfig,
    PushKernelArg, result, sys,
};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

use crate::copy_runs::ByteRun;
use crate::cuda_source::{SOURCE, THREADS_PER_BLOCK};
use crate::device_memory::driver_err;
use crate::error::KernelError;

pub use link::BACKUP_LINK_SHARE_PERMILLE;
pub(crate) use options::{CARVEOUT_MIN_RUNS, MAX_COPY_ENGINE_LANES, MIN_PITCHED_LINES};
pub use options::{
    CopyEngineHint, CopyEngineOptions, KernelReport, LaunchShape, RunOrder, TransferDirection,
    TransferPath, sort_ascending_blocks,
};
pub(crate) use token_runs::vectors_of_uniform;

/// True when the CUDA driver library can be loaded. Checked before any cudarc driver call,
/// because cudarc panics when it cannot load the library.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// True when the NVRTC library can be loaded.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Longest index or run lists checked inside the copy launch itself (no separate validation
/// launch).
pub(crate) const SELF_CHECK_MAX_ITEMS: u64 = 4096;

/// A check enqueued since the last `finish`, kept to name the bad entry if one is reported: a
/// run list and the two region lengths.
struct PendingCheck(Arc<[ByteRun]>, u64, u64);

impl PendingCheck {
    fn same_as(&self, other: &PendingCheck) -> bool {
        Arc::ptr_eq(&self.0, &other.0) && self.1 == other.1 && self.2 == other.2
    }

    /// The CPU's naming of the first bad run, as the CPU references word it.
    fn recheck(&self) -> Result<(), KernelError> {
        crate::copy_runs::validate_runs(&self.0, self.1, self.2)
    }
}

struct Kernels {
    _module: Arc<CudaModule>,
    validate_runs: CudaFunction,
    copy_runs: CudaFunction,
    copy_runs_uniform: CudaFunction,
    copy_runs_uniform_paced: CudaFunction,
}

/// One kernel argument: a 64-bit word (an address or a count).
enum Arg {
    Word(u64),
}

/// One GPU: context, stream, compiled kernels, error record.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    sm_count: u32,
    /// Largest pitch a 2D copy takes (`CU_DEVICE_ATTRIBUTE_MAX_PITCH`, 2^31 - 1 on an H200).
    max_pitch_bytes: u64,
    compute_capability: (i32, i32),
    kernels: OnceLock<Result<Kernels, KernelError>>,
    /// `[bad positions, !first bad position]`, zero when no validation failed.
    err: CudaSlice<u64>,
    /// The lists of the last validations since `finish`, to name a bad entry in the error.
    pending: Mutex<Vec<PendingCheck>>,
    /// Helper streams of the copy-engine lanes (forked from and joined into `stream`).
    copy_streams: OnceLock<Result<Vec<Arc<CudaStream>>, KernelError>>,
    /// The side stream of a split load's kernel part, created at first use.
    split_stream: OnceLock<Result<Arc<CudaStream>, KernelError>>,
    /// The staged path's ring of staging slots, created at first use.
    staging: staging::StagingCell,
    /// The SM path's ring of run-list slots, created at first use.
    run_ring: run_ring::RunRingCell,
    /// The gathered backup's staging slots and streams, created at first use.
    gathered: gathered::GatherCell,
    /// Multiprocessors the model leaves free ([`Gpu::set_model_carveout_sms`]); 0: none.
    model_carveout_sms: AtomicU32,
    /// The chooser's host-ordered copy of a token list and its bucket counts, reused from
    /// call to call ([`options::in_key_buckets_into`]).
    order_scratch: Mutex<(Vec<ByteRun>, Vec<usize>)>,
    /// The host link's measured device-to-host rate (bytes per microsecond) and the buffers
    /// it was measured with ([`Gpu::host_link_bytes_per_us`]).
    link: Mutex<Option<(u64, crate::DeviceBytes, crate::PinnedBytes)>>,
    /// Share of that link a token backup on a carve-out may take, per mille
    /// ([`Gpu::set_backup_link_share_permille`]).
    backup_link_share_permille: AtomicU32,
}

impl Gpu {
    /// Opens device `ordinal`: [`KernelError::NoDriver`] (never a panic) when libcuda cannot be
    /// loaded, [`KernelError::Driver`] when there is no such device. Kernels are compiled later,
    /// at first use.
    pub fn new(ordinal: usize) -> Result<Gpu, KernelError> {
        if !driver_present() {
            return Err(KernelError::NoDriver);
        }
        let ctx =
            CudaContext::new(ordinal).map_err(driver_err("cuInit / cuDevicePrimaryCtxRetain"))?;
        // One stream, ordered by us: cudarc's per-buffer event tracking is not needed.
        // SAFETY: every launch and copy of this Gpu goes through `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err("cuStreamCreate"))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(driver_err("cuDeviceGetAttribute"))? as u32;
        let max_pitch_bytes = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH)
            .map_err(driver_err("cuDeviceGetAttribute"))?
            .max(0) as u64;
        let compute_capability = ctx
            .compute_capability()
            .map_err(driver_err("cuDeviceGetAttribute"))?;
        let err = stream
            .alloc_zeros::<u64>(2)
            .map_err(driver_err("cuMemAlloc"))?;
        stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        Ok(Gpu {
            ctx,
            stream,
            sm_count,
            max_pitch_bytes,
            compute_capability,
            kernels: OnceLock::new(),
            err,
            pending: Mutex::new(Vec::new()),
            copy_streams: OnceLock::new(),
            split_stream: OnceLock::new(),
            staging: Mutex::new(None),
            run_ring: Mutex::new(None),
            gathered: Mutex::new(gathered::GatherState::Untried),
            model_carveout_sms: AtomicU32::new(0),
            order_scratch: Mutex::new((Vec::new(), Vec::new())),
            link: Mutex::new(None),
            backup_link_share_permille: AtomicU32::new(link::BACKUP_LINK_SHARE_PERMILLE),
        })
    }

    /// Tells the transfer chooser ([`Gpu::enqueue_transfer_runs`]) that the model leaves `sms`
    /// multiprocessors free (`0`: none, the default): its GEMMs target the others, as PyTorch's
    /// and DeepGEMM's SM carve-outs do for communication kernels (`cublasSetSmCountTarget(handle,
    /// sm_count - sms)` for cuBLAS). Loads of at least `CARVEOUT_MIN_RUNS` = 64 page runs
    /// are then split ([`TransferPath::SplitLoad`], [`mod@crate::split_load`]) between the
    /// run-list kernel on those SMs (a grid of `SPLIT_KERNEL_BLOCKS_PER_SM` = 4 blocks of
    /// 256 threads per SM, on a side stream, its run list read from pinned host memory; CUDA
    /// places blocks itself, so on an idle GPU they may spread wider) and the copy engines,
    /// both at once; token-granular loads use a grid for those SMs
    /// ([`LaunchShape::sm_budget`]) instead of the `SM_BUDGET` = 8 SMs'. Backups of at least
    /// as many page runs are gathered on those SMs into device staging (device to device), then
    /// copied to the host one host-contiguous stretch at a time by the copy engines
    /// ([`TransferPath::GatheredBackup`]; 256 MiB of device memory at first use): unpaced SM
    /// stores to host memory slowed the GEMM 31-237% at every launch shape measured, on the
    /// free SMs too, while the gather left it within noise. Token backups of one run length go
    /// to the token kernel paced to a share of the host link
    /// ([`Gpu::set_backup_link_share_permille`]), which kept the GEMM within 0.8-1.5 points of
    /// memcpy's cost at page size 1; those of several lengths are gathered as page runs are
    /// when that pays, else moved unpaced by the run-list kernel on the carve-out.
    ///
    /// Measured on the H200 next to a bf16 GEMM carved out by 2 SMs (BENCHMARKS.md, "Session
    /// 5"), random DSA pages x 61 layers: a load layer by layer at 0.909-0.911 of pinned memcpy
    /// for 1,024 pages (GEMM +2.3% to +3.0%) and 0.907-0.909 for 4,096 (GEMM -1.1% to +1.9%),
    /// 0.945-0.957 alone, against 0.67-0.78 on the copy engines next to the GEMM; a backup laid
    /// page pair by page pair (as the pool shim lays it) at 0.889-0.897 (GEMM -0.2% to +2.1%),
    /// 0.958-0.967 alone, against 0.55-0.79. The carve-out itself cost the GEMM -0.3% to +16.3%
    /// over the machines measured (its time is bimodal, 1.36-1.42 or 1.50-1.60 ms).
    ///
    /// Errors: `sms` equal to or above the device's multiprocessor count ([`KernelError::Spec`]
    /// naming `sms` and both values): the model must keep at least one.
    pub fn set_model_carveout_sms(&self, sms: u32) -> Result<(), KernelError> {
        if sms >= self.sm_count {
            return Err(KernelError::spec(
                "sms",
                format!(
                    "a carve-out of {sms} SMs leaves the model none of the device's {} SMs",
                    self.sm_count
                ),
            ));
        }
        self.model_carveout_sms.store(sms, Ordering::Relaxed);
        Ok(())
    }

    /// The model's SM carve-out ([`Gpu::set_model_carveout_sms`]); `None` when unset or 0.
    pub fn model_carveout_sms(&self) -> Option<u32> {
        match self.model_carveout_sms.load(Ordering::Relaxed) {
            0 => None,
            k => Some(k),
        }
    }

    /// The CUDA context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every call of this `Gpu` runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Multiprocessors of the device (132 on an H200).
    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// Largest pitch of a 2D copy, bytes (`CU_DEVICE_ATTRIBUTE_MAX_PITCH`).
    pub fn max_pitch_bytes(&self) -> u64 {
        self.max_pitch_bytes
    }

    /// Compute capability (9.0 on an H200).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// The NVRTC target the kernels are compiled for (`sm_90` on an H200).
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }

    /// Compiles the kernels now (otherwise the first launch does), so that timing and error
    /// handling see compilation separately.
    pub fn compile(&self) -> Result<(), KernelError> {
        self.kernels().map(|_| ())
    }

    fn kernels(&self) -> Result<&Kernels, KernelError> {
        self.kernels
            .get_or_init(|| self.build_kernels())
            .as_ref()
            .map_err(Clone::clone)
    }

    fn build_kernels(&self) -> Result<Kernels, KernelError> {
        if !nvrtc_present() {
            return Err(KernelError::NoNvrtc);
        }
        let arch = self.arch();
        let opts = CompileOptions {
            ftz: Some(false),
            prec_div: Some(true),
            prec_sqrt: Some(true),
            fmad: Some(false),
            options: vec![
                format!("--gpu-architecture={arch}"),
                "--std=c++17".to_string(),
            ],
            name: Some("kvlayout_kernels.cu".to_string()),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(SOURCE, opts).map_err(|e| KernelError::Compile {
            arch: arch.clone(),
            log: format!("{e:?}"),
        })?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(driver_err("cuModuleLoadData"))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(driver_err("cuModuleGetFunction"))
        };
        Ok(Kernels {
            validate_runs: f("validate_runs")?,
            copy_runs: f("copy_runs")?,
            copy_runs_uniform: f("copy_runs_uniform")?,
            copy_runs_uniform_paced: f("copy_runs_uniform_paced")?,
            _module: module,
        })
    }

    /// Registers and residency of every kernel (compiles them first).
    pub fn kernel_report(&self) -> Result<Vec<KernelReport>, KernelError> {
        let k = self.kernels()?;
        let fs: Vec<(String, &CudaFunction)> = vec![
            ("validate_runs".to_string(), &k.validate_runs),
            ("copy_runs".to_string(), &k.copy_runs),
            ("copy_runs_uniform".to_string(), &k.copy_runs_uniform),
            (
                "copy_runs_uniform_paced".to_string(),
                &k.copy_runs_uniform_paced,
            ),
        ];
        fs.into_iter()
            .map(|(name, f)| {
                Ok(KernelReport {
                    name,
                    registers: f.num_regs().map_err(driver_err("cuFuncGetAttribute"))?,
                    blocks_per_sm: f
                        .occupancy_max_active_blocks_per_multiprocessor(THREADS_PER_BLOCK, 0, None)
                        .map_err(driver_err("cuOccupancyMaxActiveBlocksPerMultiprocessor"))?,
                })
            })
            .collect()
    }

    /// Blocks for `work_threads` threads of work under `shape` (at least 1).
    fn grid(&self, shape: LaunchShape, work_threads: u64) -> u32 {
        let sms = shape
            .max_sms
            .map_or(self.sm_count, |m| m.clamp(1, self.sm_count));
        let most = u64::from(sms) * u64::from(shape.blocks_per_sm.max(1));
        let needed = work_threads.div_ceil(u64::from(THREADS_PER_BLOCK)).max(1);
        most.min(needed) as u32
    }

    /// The device address of the error record, passed to every kernel.
    fn err_address(&self) -> u64 {
        let (ptr, _sync) = self.err.device_ptr(&self.stream);
        ptr
    }

    /// The one launcher: `f` on `grid` blocks of [`THREADS_PER_BLOCK`] threads on the stream,
    /// with `args` in order.
    ///
    /// # Safety
    /// `args` must match the kernel's signature, and every address in them must stay valid
    /// for what the kernel reads and writes until the stream has finished.
    unsafe fn launch(
        &self,
        f: &CudaFunction,
        call: &'static str,
        grid: u32,
        args: &[Arg],
    ) -> Result<(), KernelError> {
        // SAFETY: forwarded to the caller.
        unsafe { self.launch_on(&self.stream, f, call, grid, args) }
    }

    /// [`Gpu::launch`] on another stream of this context.
    ///
    /// # Safety
    /// As [`Gpu::launch`].
    unsafe fn launch_on(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        call: &'static str,
        grid: u32,
        args: &[Arg],
    ) -> Result<(), KernelError> {
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(f);
        for Arg::Word(w) in args {
            builder.arg(w);
        }
        // SAFETY: forwarded to the caller.
        unsafe { builder.launch(cfg) }
            .map(|_| ())
            .map_err(driver_err(call))
    }

    /// Remembers a check being enqueued, to name the bad entry if one is reported (identical
    /// checks are remembered once: bounded memory in long batches).
    fn note(&self, check: PendingCheck) -> Result<(), KernelError> {
        let mut pending = self
            .pending
            .lock()
            .map_err(|_| KernelError::Unsupported("poisoned lock".to_string()))?;
        if !pending.iter().any(|c| c.same_as(&check)) {
            pending.push(check);
        }
        Ok(())
    }

    /// Waits for the stream and reports the first failed validation since the last `finish`
    /// (then clears it).
    pub fn finish(&self) -> Result<(), KernelError> {
        self.join_staged()?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        let rec = self
            .stream
            .clone_dtoh(&self.err)
            .map_err(driver_err("cuMemcpyDtoH"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        let checks = std::mem::take(
            &mut *self
                .pending
                .lock()
                .map_err(|_| KernelError::Unsupported("poisoned lock".to_string()))?,
        );
        if rec[0] == 0 {
            return Ok(());
        }
        // SAFETY: err is a live 2 x u64 device allocation.
        unsafe { result::memset_d8_async(self.err_address(), 0, 16, self.stream.cu_stream()) }
            .map_err(driver_err("cuMemsetD8Async"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        // The GPU found a bad entry; name it exactly as the CPU reference does, from the host
        // copies of the checked lists (the first check, in launch order, that fails).
        for check in &checks {
            check.recheck()?;
        }
        Err(KernelError::Driver {
            call: "index validation",
            message: format!(
                "the GPU reported {} bad entries that the host copies of the lists do not show",
                rec[0]
            ),
        })
    }
}
