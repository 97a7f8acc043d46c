//! The GPU backend: one CUDA context and stream, kernels compiled at first use with NVRTC for
//! the device's architecture and cached in the [`Gpu`] (one per context), and the checked
//! launches of the transfer and the index-K quantizer.
//!
//! Every launch is preceded by a check of its index or run list on the same stream (a
//! validation launch, or the first copy launch checking a short list itself); a work kernel
//! reads the error record and moves nothing if any entry was out of range. The safe calls
//! ([`Gpu::copy_items`], [`Gpu::copy_runs`], [`Gpu::transfer_runs`],
//! [`Gpu::quantize_index_k`], [`Gpu::dequantize_index_k`]) then wait for the stream and turn the
//! record into a typed error. The `enqueue_*` calls return before the GPU is done (for batching
//! and timing) and leave the error for [`Gpu::finish`]; an error stays set, and blocks every
//! later launch on the stream, until `finish` reports it. Copy-engine transfers check their
//! runs on the host before the driver sees them.
//!
//! Modules, one concept each: [`options`] (launch shapes, orders, the transfer chooser),
//! [`copy_engine`] (the copy engines' driver calls on a stream),
//! `memory` (allocation, uploads, byte access), `items` (index-list copies), `runs` (run-list
//! copies: SM kernel, copy engines, and the chooser), `staging` (the staged path: host threads
//! and one contiguous copy per chunk), `quantizer` (the index-K launches).

pub mod copy_engine;
mod gathered;
mod items;
mod memory;
pub mod options;
mod quantizer;
mod run_ring;
mod runs;
mod staging;
mod token_runs;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg, result, sys,
};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};

use crate::copy_runs::ByteRun;
use crate::cuda_source::{COPY_KERNELS, COPY_TWO_PARTS_KERNELS, SOURCE, THREADS_PER_BLOCK};
use crate::device_memory::{DeviceIndices, driver_err};
use crate::error::KernelError;

pub use gathered::{GATHER_FIRST_CHUNK_BYTES, GATHER_SLOT_BYTES, GATHER_SLOTS};
pub use options::{
    CARVEOUT_MIN_RUNS, COPY_ENGINE_MIN_MEAN_RUN_BYTES, CopyEngineHint, CopyEngineOptions,
    CopyOrder, KernelReport, LaunchShape, MAX_COPY_ENGINE_LANES, MIN_MEAN_BLOCK_RUNS,
    MIN_PITCHED_LINES, PARALLEL_SORT_MIN_RUNS, RunOrder, SM_BUDGET, TransferDirection,
    TransferPath, sort_ascending_blocks,
};
pub use run_ring::{RUN_RING_SLOT_RUNS, RUN_RING_SLOTS};
pub use staging::{STAGING_CHUNK_BYTES, STAGING_MAX_PIECES, STAGING_SLOTS, STAGING_WARP_RUN_BYTES};

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
pub const SELF_CHECK_MAX_ITEMS: u64 = 4096;

/// A check enqueued since the last `finish`, kept to name the bad entry if one is reported.
enum PendingCheck {
    /// Two index lists and their limits.
    Lists(Arc<[u64]>, u64, Arc<[u64]>, u64),
    /// A run list and the two region lengths.
    Runs(Arc<[ByteRun]>, u64, u64),
}

impl PendingCheck {
    fn same_as(&self, other: &PendingCheck) -> bool {
        match (self, other) {
            (PendingCheck::Lists(a, al, b, bl), PendingCheck::Lists(x, xl, y, yl)) => {
                Arc::ptr_eq(a, x) && al == xl && Arc::ptr_eq(b, y) && bl == yl
            }
            (PendingCheck::Runs(r, sl, dl), PendingCheck::Runs(q, ql, pl)) => {
                Arc::ptr_eq(r, q) && sl == ql && dl == pl
            }
            _ => false,
        }
    }

    /// The CPU's naming of the first bad entry, as the CPU references word it.
    fn recheck(&self) -> Result<(), KernelError> {
        match self {
            PendingCheck::Lists(a, al, b, bl) => crate::copy_cpu::check_lists(a, *al, b, *bl),
            PendingCheck::Runs(runs, sl, dl) => crate::copy_runs::validate_runs(runs, *sl, *dl),
        }
    }
}

struct Kernels {
    _module: Arc<CudaModule>,
    validate: CudaFunction,
    /// By vector width (16, 8, 4, 2, 1): (u32 indexing, u64 indexing).
    copy: Vec<(u64, CudaFunction, CudaFunction)>,
    /// By vector width: both parts of a `section_major` token in one launch.
    copy_two_parts: Vec<(u64, CudaFunction)>,
    quantize: CudaFunction,
    dequantize: CudaFunction,
    validate_runs: CudaFunction,
    copy_runs: CudaFunction,
    copy_runs_uniform: CudaFunction,
}

/// One kernel argument: a parameter struct passed by value, or a 64-bit word (an address or a
/// count).
enum Arg<'a> {
    Copy(&'a items::CopyParams),
    IndexK(&'a quantizer::IndexKParams),
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
        })
    }

    /// Tells the transfer chooser ([`Gpu::enqueue_transfer_runs`]) that the model leaves `sms`
    /// multiprocessors free (`0`: none, the default): its GEMMs target the others, as PyTorch's
    /// and DeepGEMM's SM carve-outs do for communication kernels (`cublasSetSmCountTarget(handle,
    /// sm_count - sms)` for cuBLAS). Loads of at least [`super::CARVEOUT_MIN_RUNS`] page runs
    /// are then split ([`TransferPath::SplitLoad`], [`mod@crate::split_load`]) between the
    /// run-list kernel on those SMs (a grid of [`crate::SPLIT_KERNEL_BLOCKS_PER_SM`] blocks of
    /// 256 threads per SM, on a side stream, its run list read from pinned host memory; CUDA
    /// places blocks itself, so on an idle GPU they may spread wider) and the copy engines,
    /// both at once; token-granular runs, both ways, use a grid for those SMs
    /// ([`LaunchShape::sm_budget`]) instead of [`SM_BUDGET`]'s. Backups of at least as many page
    /// runs are gathered on those SMs into device staging (device to device), then copied to
    /// the host one host-contiguous stretch at a time by the copy engines
    /// ([`TransferPath::GatheredBackup`]; 256 MiB of device memory at first use): SM stores to
    /// host memory slowed the GEMM 31-237% at every launch shape measured, on the free SMs too,
    /// while the gather left it within noise.
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
        if self.compute_capability < (8, 9) {
            return Err(KernelError::Unsupported(format!(
                "the e4m3 conversion needs compute capability 8.9 or later; device is {arch}"
            )));
        }
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
        let mut copy = Vec::new();
        for (w, n32, n64) in COPY_KERNELS {
            copy.push((w, f(n32)?, f(n64)?));
        }
        let mut copy_two_parts = Vec::new();
        for (w, name) in COPY_TWO_PARTS_KERNELS {
            copy_two_parts.push((w, f(name)?));
        }
        Ok(Kernels {
            validate: f("validate_index_lists")?,
            copy,
            copy_two_parts,
            quantize: f("quantize_index_k")?,
            dequantize: f("dequantize_index_k")?,
            validate_runs: f("validate_runs")?,
            copy_runs: f("copy_runs")?,
            copy_runs_uniform: f("copy_runs_uniform")?,
            _module: module,
        })
    }

    /// Registers and residency of every kernel (compiles them first).
    pub fn kernel_report(&self) -> Result<Vec<KernelReport>, KernelError> {
        let k = self.kernels()?;
        let mut fs: Vec<(String, &CudaFunction)> = vec![
            ("validate_index_lists".to_string(), &k.validate),
            ("quantize_index_k".to_string(), &k.quantize),
            ("dequantize_index_k".to_string(), &k.dequantize),
            ("validate_runs".to_string(), &k.validate_runs),
            ("copy_runs".to_string(), &k.copy_runs),
            ("copy_runs_uniform".to_string(), &k.copy_runs_uniform),
        ];
        for (w, f32_, f64_) in &k.copy {
            fs.push((format!("copy_items_v{w}_u32"), f32_));
            fs.push((format!("copy_items_v{w}_u64"), f64_));
        }
        for (w, f) in &k.copy_two_parts {
            fs.push((format!("copy_two_parts_v{w}"), f));
        }
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
        args: &[Arg<'_>],
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
        args: &[Arg<'_>],
    ) -> Result<(), KernelError> {
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut builder = stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Copy(p) => builder.arg(*p),
                Arg::IndexK(p) => builder.arg(*p),
                Arg::Word(w) => builder.arg(w),
            };
        }
        // SAFETY: forwarded to the caller.
        unsafe { builder.launch(cfg) }
            .map(|_| ())
            .map_err(driver_err(call))
    }

    /// Enqueues the validation of two index lists against their limits.
    fn enqueue_validate(
        &self,
        a: &DeviceIndices,
        a_limit: u64,
        b: &DeviceIndices,
        b_limit: u64,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let k = self.kernels()?;
        let n = a.len() as u64;
        let args = [
            Arg::Word(a.address()),
            Arg::Word(b.address()),
            Arg::Word(n),
            Arg::Word(a_limit),
            Arg::Word(b_limit),
            Arg::Word(self.err_address()),
        ];
        // SAFETY: the arguments match validate_index_lists; both lists hold n entries; err is
        // the 2-word record.
        unsafe {
            self.launch(
                &k.validate,
                "cuLaunchKernel(validate_index_lists)",
                self.grid(shape, n),
                &args,
            )?
        };
        self.note(PendingCheck::Lists(
            a.host.clone(),
            a_limit,
            b.host.clone(),
            b_limit,
        ))
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

// SAFETY: plain #[repr(C)] structs of u64, mirrored field for field by the CUDA source.
unsafe impl DeviceRepr for items::CopyParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for quantizer::IndexKParams {}
