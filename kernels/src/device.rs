//! The GPU backend: one CUDA context and stream, kernels compiled at first use with NVRTC for
//! the device's architecture and cached in the [`Gpu`] (one per context), and the checked
//! launches of the transfer and the index-K quantizer.
//!
//! Every launch is preceded by the validation kernel over its index lists on the same stream;
//! the work kernel reads the validation's error record and moves nothing if any index was out
//! of range. The safe calls ([`Gpu::copy_items`], [`Gpu::quantize_index_k`],
//! [`Gpu::dequantize_index_k`]) then wait for the stream and turn the record into
//! [`KernelError::IndexOutOfRange`]. The `enqueue_*` calls return before the GPU is done (for
//! batching and timing) and leave the error for [`Gpu::finish`]; an error stays set, and blocks
//! every later launch on the stream, until `finish` reports it.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg, result, sys,
};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use half::bf16;

use crate::copy_runs::ByteRun;
use crate::copy_spec::CopySpec;
use crate::cuda_source::{
    COPY_KERNELS, COPY_UNROLL, QUANT_TOKENS_PER_WARP, SOURCE, THREADS_PER_BLOCK,
};
use crate::device_memory::{
    DeviceBytes, DeviceIndices, DeviceRuns, GpuBytes, PinnedBytes, driver_err,
};
use crate::error::{KernelError, Side};
use crate::index_k::{HEAD_DIM_ELEMS, IndexKPages, ScaleFormat, check_rows};

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

/// How many multiprocessors a launch may use, to leave the rest to the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaunchShape {
    /// Most multiprocessors to use (`None`: all). The grid is `max_sms * blocks_per_sm` blocks
    /// of 256 threads at most; the work is strided over it.
    pub max_sms: Option<u32>,
    /// Blocks per multiprocessor (8 blocks of 256 threads fill an H200 SM).
    pub blocks_per_sm: u32,
    /// Order in which a copy walks (layer, item) pairs.
    pub order: CopyOrder,
}

impl Default for LaunchShape {
    fn default() -> LaunchShape {
        LaunchShape {
            max_sms: None,
            blocks_per_sm: 8,
            order: CopyOrder::Auto,
        }
    }
}

/// The order a copy walks its (layer, item) pairs in; every order moves the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyOrder {
    /// [`CopyOrder::PageThenLayer`] when either side is page-major (its layer stride is
    /// smaller than its page stride: `page_first`, `page_first_direct`), else
    /// [`CopyOrder::LayerThenItem`].
    Auto,
    /// All items of layer 0, then of layer 1, ... (suits two `layer_first` sides).
    LayerThenItem,
    /// Items in chunks of one page's worth of list positions (`items_per_page`), each chunk
    /// layer by layer: the bytes of one page of a page-major side are visited in address order.
    PageThenLayer,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct SideParams {
    base: u64,
    layer_stride: u64,
    page_stride: u64,
    item_stride: u64,
    index_limit: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct CopyParams {
    src: SideParams,
    dst: SideParams,
    item_bytes: u64,
    items_per_page: u64,
    layer_begin: u64,
    layer_count: u64,
    n_items: u64,
    total_vectors: u64,
    group_items: u64,
    self_check: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct IndexKParams {
    base: u64,
    page_stride: u64,
    page_size_tokens: u64,
    slot_limit: u64,
    ue8m0: u64,
}

// SAFETY: plain #[repr(C)] structs of u64, mirrored field for field by the CUDA source.
unsafe impl DeviceRepr for CopyParams {}
// SAFETY: as above.
unsafe impl DeviceRepr for IndexKParams {}

/// A check enqueued since the last `finish`, kept to name the bad entry if one is reported.
enum PendingCheck {
    /// Two index lists and their limits.
    Lists(Arc<[u64]>, u64, Arc<[u64]>, u64),
    /// A run list and the two region lengths.
    Runs(Arc<[ByteRun]>, u64, u64),
}

type PendingLists = Vec<PendingCheck>;

struct Kernels {
    _module: Arc<CudaModule>,
    validate: CudaFunction,
    /// By vector width (16, 8, 4, 2, 1): (u32 indexing, u64 indexing).
    copy: Vec<(u64, CudaFunction, CudaFunction)>,
    quantize: CudaFunction,
    dequantize: CudaFunction,
    validate_runs: CudaFunction,
    copy_runs: CudaFunction,
}

/// Longest index lists checked inside the copy launch itself (no separate validation launch).
pub const SELF_CHECK_MAX_ITEMS: u64 = 4096;

/// `offset .. offset + len` inside a buffer of `buffer_len` bytes, or [`KernelError::Length`].
fn checked_range(
    what: &str,
    offset_bytes: u64,
    len: usize,
    buffer_len: usize,
) -> Result<std::ops::Range<usize>, KernelError> {
    let end = offset_bytes.checked_add(len as u64);
    match end {
        Some(end) if end <= buffer_len as u64 => Ok(offset_bytes as usize..end as usize),
        _ => Err(KernelError::Length {
            what: format!("{what} of {len} bytes at offset {offset_bytes}: buffer"),
            expected: offset_bytes.saturating_add(len as u64),
            actual: buffer_len as u64,
            unit: "bytes",
        }),
    }
}

/// List positions per chunk of the copy's work order (see the copy kernel).
fn group_items(spec: &CopySpec, n: u64, order: CopyOrder) -> u64 {
    let page_major = |s: &crate::copy_spec::SideSpec| s.layer_stride_bytes < s.page_stride_bytes;
    let order = match order {
        CopyOrder::Auto if page_major(&spec.src) || page_major(&spec.dst) => {
            CopyOrder::PageThenLayer
        }
        CopyOrder::Auto => CopyOrder::LayerThenItem,
        o => o,
    };
    match order {
        CopyOrder::PageThenLayer if n.is_multiple_of(spec.items_per_page) => spec.items_per_page,
        CopyOrder::PageThenLayer => 1,
        _ => n,
    }
}

/// The order a run list is executed in. Every order moves the same bytes (destination ranges
/// must not overlap); walking the host side in address order keeps PCIe writes and reads
/// sequential when the host pool is page-major (`page_first`): about 0.87 -> 0.95 of memcpy for
/// a 4096-page backup on the H200 (BENCHMARKS.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunOrder {
    /// The caller's order.
    AsGiven,
    /// By source offset (loads: the host is the source).
    SrcAscending,
    /// By destination offset (backups: the host is the destination).
    DstAscending,
}

/// Registers and residency of one compiled kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelReport {
    /// Kernel name.
    pub name: String,
    /// Registers per thread.
    pub registers: i32,
    /// Blocks of 256 threads resident per multiprocessor.
    pub blocks_per_sm: u32,
}

/// One GPU: context, stream, compiled kernels, error record.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    sm_count: u32,
    compute_capability: (i32, i32),
    kernels: OnceLock<Result<Kernels, KernelError>>,
    /// `[bad positions, !first bad position]`, zero when no validation failed.
    err: CudaSlice<u64>,
    /// The lists of the last validations since `finish`, to name a bad index in the error.
    pending_lists: std::sync::Mutex<PendingLists>,
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
            compute_capability,
            kernels: OnceLock::new(),
            err,
            pending_lists: std::sync::Mutex::new(Vec::new()),
        })
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
        Ok(Kernels {
            validate: f("validate_index_lists")?,
            copy,
            quantize: f("quantize_index_k")?,
            dequantize: f("dequantize_index_k")?,
            validate_runs: f("validate_runs")?,
            copy_runs: f("copy_runs")?,
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
        ];
        for (w, f32_, f64_) in &k.copy {
            fs.push((format!("copy_items_v{w}_u32"), f32_));
            fs.push((format!("copy_items_v{w}_u64"), f64_));
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

    /// Device memory of `len_bytes` bytes, zeroed.
    pub fn alloc_device(&self, len_bytes: usize) -> Result<DeviceBytes, KernelError> {
        if len_bytes == 0 {
            return Err(KernelError::spec(
                "len_bytes",
                "a device buffer needs at least 1 byte",
            ));
        }
        let slice = self
            .stream
            .alloc_zeros::<u8>(len_bytes)
            .map_err(driver_err("cuMemAlloc"))?;
        Ok(DeviceBytes {
            slice,
            stream: self.stream.clone(),
        })
    }

    /// Pinned, device-mapped host memory of `len_bytes` bytes (contents unspecified until
    /// written).
    pub fn alloc_pinned(&self, len_bytes: usize) -> Result<PinnedBytes, KernelError> {
        PinnedBytes::new(&self.ctx, len_bytes)
    }

    /// Device memory holding `bytes`.
    pub fn upload(&self, bytes: &[u8]) -> Result<DeviceBytes, KernelError> {
        let mut d = self.alloc_device(bytes.len())?;
        self.write(&mut d, bytes)?;
        Ok(d)
    }

    /// Overwrites device memory with `bytes` (same length).
    pub fn write(&self, dst: &mut DeviceBytes, bytes: &[u8]) -> Result<(), KernelError> {
        if bytes.len() != dst.slice.len() {
            return Err(KernelError::Length {
                what: "bytes written to a device buffer".to_string(),
                expected: dst.slice.len() as u64,
                actual: bytes.len() as u64,
                unit: "bytes",
            });
        }
        self.stream
            .memcpy_htod(bytes, &mut dst.slice)
            .map_err(driver_err("cuMemcpyHtoDAsync"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }

    /// The bytes of device memory.
    pub fn read(&self, src: &DeviceBytes) -> Result<Vec<u8>, KernelError> {
        let v = self
            .stream
            .clone_dtoh(&src.slice)
            .map_err(driver_err("cuMemcpyDtoHAsync"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        Ok(v)
    }

    /// Copies `out.len()` bytes at `offset_bytes` of device memory into `out` (checked range).
    pub fn read_at(
        &self,
        src: &DeviceBytes,
        offset_bytes: u64,
        out: &mut [u8],
    ) -> Result<(), KernelError> {
        let range = checked_range("device read", offset_bytes, out.len(), src.slice.len())?;
        if range.is_empty() {
            return Ok(());
        }
        let view = src.slice.slice(range);
        self.stream
            .memcpy_dtoh(&view, out)
            .map_err(driver_err("cuMemcpyDtoHAsync"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }

    /// Writes `data` at `offset_bytes` of device memory (checked range).
    pub fn write_at(
        &self,
        dst: &mut DeviceBytes,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), KernelError> {
        let range = checked_range("device write", offset_bytes, data.len(), dst.slice.len())?;
        if range.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice.slice_mut(range);
        self.stream
            .memcpy_htod(data, &mut view)
            .map_err(driver_err("cuMemcpyHtoDAsync"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }

    /// Pinned, device-mapped host memory of `len_bytes` bytes, zeroed by the CPU.
    pub fn alloc_pinned_zeroed(&self, len_bytes: usize) -> Result<PinnedBytes, KernelError> {
        let mut p = PinnedBytes::new(&self.ctx, len_bytes)?;
        p.as_mut_slice().fill(0);
        Ok(p)
    }

    /// An index list on the device.
    pub fn upload_indices(&self, indices: &[u64]) -> Result<DeviceIndices, KernelError> {
        let mut slice = self
            .stream
            .alloc_zeros::<u64>(indices.len().max(1))
            .map_err(driver_err("cuMemAlloc"))?;
        if !indices.is_empty() {
            let mut view = slice.slice_mut(0..indices.len());
            self.stream
                .memcpy_htod(indices, &mut view)
                .map_err(driver_err("cuMemcpyHtoDAsync"))?;
        }
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        Ok(DeviceIndices {
            slice,
            stream: self.stream.clone(),
            host: Arc::from(indices),
        })
    }

    fn grid(&self, shape: LaunchShape, work_threads: u64) -> u32 {
        let sms = shape
            .max_sms
            .map_or(self.sm_count, |m| m.clamp(1, self.sm_count));
        let most = u64::from(sms) * u64::from(shape.blocks_per_sm.max(1));
        let needed = work_threads.div_ceil(u64::from(THREADS_PER_BLOCK)).max(1);
        most.min(needed) as u32
    }

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
        let (a_ptr, b_ptr) = (a.address(), b.address());
        let (err_ptr, _s) = self.err.device_ptr(&self.stream);
        let cfg = LaunchConfig {
            grid_dim: (self.grid(shape, n), 1, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match validate_index_lists' signature; both lists hold n
        // entries; err is the 2-word record.
        unsafe {
            self.stream
                .launch_builder(&k.validate)
                .arg(&a_ptr)
                .arg(&b_ptr)
                .arg(&n)
                .arg(&a_limit)
                .arg(&b_limit)
                .arg(&err_ptr)
                .launch(cfg)
        }
        .map_err(driver_err("cuLaunchKernel(validate_index_lists)"))?;
        self.note_lists(a, a_limit, b, b_limit)
    }

    /// Remembers lists being validated, to name the bad index if one is reported.
    fn note_lists(
        &self,
        a: &DeviceIndices,
        a_limit: u64,
        b: &DeviceIndices,
        b_limit: u64,
    ) -> Result<(), KernelError> {
        let mut lists = self
            .pending_lists
            .lock()
            .map_err(|_| KernelError::Unsupported("poisoned lock".to_string()))?;
        // Bounded memory in long batches: identical lists are remembered once.
        let same = |c: &PendingCheck| match c {
            PendingCheck::Lists(x, xl, y, yl) => {
                Arc::ptr_eq(x, &a.host)
                    && *xl == a_limit
                    && Arc::ptr_eq(y, &b.host)
                    && *yl == b_limit
            }
            PendingCheck::Runs(..) => false,
        };
        if !lists.iter().any(same) {
            lists.push(PendingCheck::Lists(
                a.host.clone(),
                a_limit,
                b.host.clone(),
                b_limit,
            ));
        }
        Ok(())
    }

    /// Waits for the stream and reports the first failed validation since the last `finish`
    /// (then clears it).
    pub fn finish(&self) -> Result<(), KernelError> {
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
        let lists = std::mem::take(
            &mut *self
                .pending_lists
                .lock()
                .map_err(|_| KernelError::Unsupported("poisoned lock".to_string()))?,
        );
        if rec[0] == 0 {
            return Ok(());
        }
        let (err_ptr, _s) = self.err.device_ptr(&self.stream);
        // SAFETY: err is a live 2 x u64 device allocation.
        unsafe { result::memset_d8_async(err_ptr, 0, 16, self.stream.cu_stream()) }
            .map_err(driver_err("cuMemsetD8Async"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        // The GPU found a bad entry; name it exactly as the CPU reference does, from the host
        // copies of the checked lists (the first check, in launch order, that fails).
        for check in &lists {
            match check {
                PendingCheck::Lists(a, al, b, bl) => crate::copy_cpu::check_lists(a, *al, b, *bl)?,
                PendingCheck::Runs(runs, sl, dl) => {
                    crate::copy_runs::validate_runs(runs, *sl, *dl)?
                }
            }
        }
        Err(KernelError::Driver {
            call: "index validation",
            message: format!(
                "the GPU reported {} bad entries that the host copies of the lists do not show",
                rec[0]
            ),
        })
    }

    /// A run list on the device, executed in `order` (errors still name positions of `runs`
    /// as given).
    pub fn upload_runs(
        &self,
        runs: &[ByteRun],
        order: RunOrder,
    ) -> Result<DeviceRuns, KernelError> {
        let mut sorted: Vec<ByteRun> = runs.to_vec();
        match order {
            RunOrder::AsGiven => {}
            RunOrder::SrcAscending => sorted.sort_by_key(|r| r.src_offset_bytes),
            RunOrder::DstAscending => sorted.sort_by_key(|r| r.dst_offset_bytes),
        }
        let words: Vec<u64> = sorted
            .iter()
            .flat_map(|r| [r.src_offset_bytes, r.dst_offset_bytes, r.len_bytes])
            .collect();
        let mut slice = self
            .stream
            .alloc_zeros::<u64>(words.len().max(3))
            .map_err(driver_err("cuMemAlloc"))?;
        if !words.is_empty() {
            let mut view = slice.slice_mut(0..words.len());
            self.stream
                .memcpy_htod(&words, &mut view)
                .map_err(driver_err("cuMemcpyHtoDAsync"))?;
        }
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        Ok(DeviceRuns {
            slice,
            stream: self.stream.clone(),
            host: Arc::from(runs),
        })
    }

    /// Copies every run of `runs` from `src` to `dst` (the contract of
    /// [`crate::copy_runs_cpu`]): every run is checked against both buffers' lengths on the
    /// GPU before any byte moves (inside the copy launch for at most [`SELF_CHECK_MAX_ITEMS`]
    /// runs, else by a validation launch), then a warp copies each run; waits.
    /// A bad run: [`KernelError::RunOutOfRange`], nothing copied.
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
    /// As [`Gpu::enqueue_copy_items`].
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
        let runs_addr = runs.address();
        let (err_ptr, _s) = self.err.device_ptr(&self.stream);
        let self_check = n <= SELF_CHECK_MAX_ITEMS;
        if !self_check {
            let cfg = LaunchConfig {
                grid_dim: (self.grid(shape, n), 1, 1),
                block_dim: (THREADS_PER_BLOCK, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: arguments match validate_runs; the list holds n runs of 3 words.
            unsafe {
                self.stream
                    .launch_builder(&k.validate_runs)
                    .arg(&runs_addr)
                    .arg(&n)
                    .arg(&src_len)
                    .arg(&dst_len)
                    .arg(&err_ptr)
                    .launch(cfg)
            }
            .map_err(driver_err("cuLaunchKernel(validate_runs)"))?;
        }
        {
            let mut lists = self
                .pending_lists
                .lock()
                .map_err(|_| KernelError::Unsupported("poisoned lock".to_string()))?;
            let same = |c: &PendingCheck| match c {
                PendingCheck::Runs(r, sl, dl) => {
                    Arc::ptr_eq(r, &runs.host) && *sl == src_len && *dl == dst_len
                }
                PendingCheck::Lists(..) => false,
            };
            if !lists.iter().any(same) {
                lists.push(PendingCheck::Runs(runs.host.clone(), src_len, dst_len));
            }
        }
        let (src_addr, dst_addr) = (src.device_address(), dst.device_address());
        let check = u64::from(self_check);
        let cfg = LaunchConfig {
            grid_dim: (self.grid(shape, n * 32), 1, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments match copy_runs; every run is checked against both lengths on the
        // GPU before the kernel writes (validation launch or in-launch check).
        unsafe {
            self.stream
                .launch_builder(&k.copy_runs)
                .arg(&runs_addr)
                .arg(&n)
                .arg(&src_addr)
                .arg(&dst_addr)
                .arg(&src_len)
                .arg(&dst_len)
                .arg(&check)
                .arg(&err_ptr)
                .launch(cfg)
        }
        .map_err(driver_err("cuLaunchKernel(copy_runs)"))?;
        Ok(())
    }

    /// Copies item `src_idx[i]` of `src` to item `dst_idx[i]` of `dst` for every position `i`
    /// and every layer of `spec.layers` (the contract of [`crate::copy_items_cpu`]): checks the
    /// spec and both buffers' lengths on the host, validates the lists on the GPU, copies, and
    /// waits. Out-of-range indices: [`KernelError::IndexOutOfRange`], nothing copied.
    pub fn copy_items(
        &self,
        spec: &CopySpec,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        src_idx: &DeviceIndices,
        dst_idx: &DeviceIndices,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        self.copy_items_multi(
            std::slice::from_ref(spec),
            src,
            dst,
            src_idx,
            dst_idx,
            shape,
        )
    }

    /// [`Gpu::copy_items`] for several specs driven by the same index lists (the parts of a
    /// token of a `section_major` page, as [`CopySpec::for_pool_buffer`] plans them): the lists
    /// are validated once, then each part is copied. Every spec must have the same index limits
    /// on each side.
    pub fn copy_items_multi(
        &self,
        specs: &[CopySpec],
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        src_idx: &DeviceIndices,
        dst_idx: &DeviceIndices,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        // SAFETY: finish() waits for the launches before the borrows end.
        let queued =
            unsafe { self.enqueue_copy_items_multi(specs, src, dst, src_idx, dst_idx, shape) };
        let finished = self.finish();
        queued.and(finished)
    }

    /// [`Gpu::copy_items`] without the wait: enqueues validation and copy and returns.
    ///
    /// # Safety
    /// `src`, `dst` and both lists must stay alive and untouched by the CPU until
    /// [`Gpu::finish`] returns (the GPU may still be reading and writing them).
    pub unsafe fn enqueue_copy_items(
        &self,
        spec: &CopySpec,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        src_idx: &DeviceIndices,
        dst_idx: &DeviceIndices,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        // SAFETY: forwarded to the caller.
        unsafe {
            self.enqueue_copy_items_multi(
                std::slice::from_ref(spec),
                src,
                dst,
                src_idx,
                dst_idx,
                shape,
            )
        }
    }

    /// [`Gpu::copy_items_multi`] without the wait.
    ///
    /// Lists of at most [`SELF_CHECK_MAX_ITEMS`] positions are checked inside the first copy
    /// launch (every block checks every index before it writes); longer lists get a separate
    /// validation launch first. Either way no byte moves unless every index is in range.
    ///
    /// # Safety
    /// As [`Gpu::enqueue_copy_items`].
    pub unsafe fn enqueue_copy_items_multi(
        &self,
        specs: &[CopySpec],
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        src_idx: &DeviceIndices,
        dst_idx: &DeviceIndices,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let Some(first) = specs.first() else {
            return Ok(());
        };
        let src_limit = first.index_limit(Side::Src)?;
        let dst_limit = first.index_limit(Side::Dst)?;
        for (i, spec) in specs.iter().enumerate() {
            spec.validate()?;
            crate::copy_cpu::check_len("src buffer", spec.src.total_bytes, src.len_bytes())?;
            crate::copy_cpu::check_len("dst buffer", spec.dst.total_bytes, dst.len_bytes())?;
            let limits = (spec.index_limit(Side::Src)?, spec.index_limit(Side::Dst)?);
            if limits != (src_limit, dst_limit) {
                return Err(KernelError::spec(
                    format!("specs[{i}]"),
                    format!(
                        "index limits (src {}, dst {}) differ from specs[0]'s (src {src_limit}, \
                         dst {dst_limit}); parts sharing index lists must share page counts",
                        limits.0, limits.1
                    ),
                ));
            }
        }
        if src_idx.len() != dst_idx.len() {
            return Err(KernelError::Length {
                what: "dst index list (must match the src index list)".to_string(),
                expected: src_idx.len() as u64,
                actual: dst_idx.len() as u64,
                unit: "indices",
            });
        }
        let n = src_idx.len() as u64;
        if n == 0 {
            return Ok(());
        }
        let self_check = n <= SELF_CHECK_MAX_ITEMS;
        if self_check {
            self.note_lists(src_idx, src_limit, dst_idx, dst_limit)?;
        } else {
            self.enqueue_validate(src_idx, src_limit, dst_idx, dst_limit, shape)?;
        }
        for (i, spec) in specs.iter().enumerate() {
            // Only the first part checks; later parts see its error record and return.
            self.launch_copy(
                spec,
                src,
                dst,
                src_idx,
                dst_idx,
                shape,
                self_check && i == 0,
            )?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_copy(
        &self,
        spec: &CopySpec,
        src: &dyn GpuBytes,
        dst: &mut dyn GpuBytes,
        src_idx: &DeviceIndices,
        dst_idx: &DeviceIndices,
        shape: LaunchShape,
        self_check: bool,
    ) -> Result<(), KernelError> {
        let n = src_idx.len() as u64;
        let src_limit = spec.index_limit(Side::Src)?;
        let dst_limit = spec.index_limit(Side::Dst)?;
        let (src_addr, dst_addr) = (src.device_address(), dst.device_address());
        let width = spec.vector_bytes(src_addr, dst_addr);
        let vectors_per_item = spec.item_bytes / width;
        let total_vectors = n
            .checked_mul(spec.layer_count())
            .and_then(|x| x.checked_mul(vectors_per_item))
            .ok_or_else(|| KernelError::spec("items", "overflow: items * layers * vectors"))?;
        let grid = self.grid(shape, total_vectors.div_ceil(COPY_UNROLL));
        let grid_threads = u64::from(grid) * u64::from(THREADS_PER_BLOCK);
        let fits_u32 = |x: u64| x < (1u64 << 32);
        let use_u32 = fits_u32(total_vectors + grid_threads * COPY_UNROLL)
            && fits_u32(src_limit)
            && fits_u32(dst_limit);
        let k = self.kernels()?;
        let (_, f32_, f64_) = k
            .copy
            .iter()
            .find(|(w, _, _)| *w == width)
            .ok_or_else(|| KernelError::Unsupported(format!("vector width {width}")))?;
        let f = if use_u32 { f32_ } else { f64_ };
        let side = |s: &crate::copy_spec::SideSpec, limit: u64| SideParams {
            base: s.base_bytes,
            layer_stride: s.layer_stride_bytes,
            page_stride: s.page_stride_bytes,
            item_stride: s.item_stride_bytes,
            index_limit: limit,
        };
        let params = CopyParams {
            src: side(&spec.src, src_limit),
            dst: side(&spec.dst, dst_limit),
            item_bytes: spec.item_bytes,
            items_per_page: spec.items_per_page,
            layer_begin: spec.layers.start,
            layer_count: spec.layer_count(),
            n_items: n,
            total_vectors,
            group_items: group_items(spec, n, shape.order),
            self_check: u64::from(self_check),
        };
        let (si, di) = (src_idx.address(), dst_idx.address());
        let (err_ptr, _s) = self.err.device_ptr(&self.stream);
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments match the copy kernels' signature; spec.validate() and check_len
        // bound every address of every in-range index by both buffers' lengths, and the kernel
        // only copies when every index was found in range (validation launch or self-check).
        unsafe {
            self.stream
                .launch_builder(f)
                .arg(&params)
                .arg(&src_addr)
                .arg(&dst_addr)
                .arg(&si)
                .arg(&di)
                .arg(&err_ptr)
                .launch(cfg)
        }
        .map_err(driver_err("cuLaunchKernel(copy_items)"))?;
        Ok(())
    }

    fn index_k_params(
        &self,
        spec: &IndexKPages,
        cache: &dyn GpuBytes,
        format: ScaleFormat,
    ) -> Result<IndexKParams, KernelError> {
        spec.validate()?;
        crate::copy_cpu::check_len("index-K cache", spec.total_bytes, cache.len_bytes())?;
        if !cache.device_address().is_multiple_of(4) {
            return Err(KernelError::spec(
                "cache",
                format!(
                    "address {:#x} is not 4-byte aligned",
                    cache.device_address()
                ),
            ));
        }
        Ok(IndexKParams {
            base: spec.base_bytes,
            page_stride: spec.page_stride_bytes,
            page_size_tokens: spec.page_size_tokens,
            slot_limit: spec.slot_limit()?,
            ue8m0: u64::from(format == ScaleFormat::Ue8m0),
        })
    }

    /// Quantizes `keys` (bf16 `[tokens, 128]`, row-major, `tokens = slots.len()`) into the
    /// index-K pages of `cache` at `slots` (the contract of
    /// [`crate::index_k::quantize_index_k_cpu`], bit for bit), and waits. Out-of-range slots:
    /// [`KernelError::IndexOutOfRange`] (`dst_index` = the slot), nothing written.
    pub fn quantize_index_k(
        &self,
        spec: &IndexKPages,
        keys: &dyn GpuBytes,
        slots: &DeviceIndices,
        cache: &mut dyn GpuBytes,
        format: ScaleFormat,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        // SAFETY: finish() waits before the borrows end.
        unsafe { self.enqueue_quantize_index_k(spec, keys, slots, cache, format, shape)? };
        self.finish()
    }

    /// [`Gpu::quantize_index_k`] without the wait.
    ///
    /// # Safety
    /// As [`Gpu::enqueue_copy_items`]: every buffer alive and untouched until [`Gpu::finish`].
    pub unsafe fn enqueue_quantize_index_k(
        &self,
        spec: &IndexKPages,
        keys: &dyn GpuBytes,
        slots: &DeviceIndices,
        cache: &mut dyn GpuBytes,
        format: ScaleFormat,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let params = self.index_k_params(spec, &*cache, format)?;
        let key_bytes = keys.len_bytes();
        if !key_bytes.is_multiple_of(2) || !keys.device_address().is_multiple_of(8) {
            return Err(KernelError::spec(
                "keys",
                "bf16 keys need an even byte length and an 8-byte aligned address",
            ));
        }
        let tokens = check_rows("keys", (key_bytes / 2) as usize, slots.as_host())? as u64;
        if tokens == 0 {
            return Ok(());
        }
        self.enqueue_validate(slots, params.slot_limit, slots, params.slot_limit, shape)?;
        let k = self.kernels()?;
        let warps = tokens.div_ceil(QUANT_TOKENS_PER_WARP);
        let cfg = LaunchConfig {
            grid_dim: (self.grid(shape, warps * 32), 1, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let (keys_addr, cache_addr, slots_addr) = (
            keys.device_address(),
            cache.device_address(),
            slots.address(),
        );
        let (err_ptr, _s) = self.err.device_ptr(&self.stream);
        // SAFETY: arguments match quantize_index_k; keys hold tokens * 128 bf16; the cache
        // length bounds every page (validate + check_len); slots are validated first.
        unsafe {
            self.stream
                .launch_builder(&k.quantize)
                .arg(&params)
                .arg(&keys_addr)
                .arg(&tokens)
                .arg(&slots_addr)
                .arg(&cache_addr)
                .arg(&err_ptr)
                .launch(cfg)
        }
        .map_err(driver_err("cuLaunchKernel(quantize_index_k)"))?;
        Ok(())
    }

    /// Reads `slots` of `cache` back as f32 keys (`[tokens, 128]` into `out`, 512 bytes per
    /// token), as [`crate::index_k::dequantize_index_k_cpu`] does, bit for bit; waits.
    pub fn dequantize_index_k(
        &self,
        spec: &IndexKPages,
        cache: &dyn GpuBytes,
        slots: &DeviceIndices,
        out: &mut dyn GpuBytes,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let params = self.index_k_params(spec, cache, ScaleFormat::F32)?;
        let tokens = slots.len() as u64;
        let out_bytes = tokens * HEAD_DIM_ELEMS * 4;
        if out.len_bytes() != out_bytes || !out.device_address().is_multiple_of(16) {
            return Err(KernelError::Length {
                what: "dequantized output (f32 [tokens, 128], 16-byte aligned)".to_string(),
                expected: out_bytes,
                actual: out.len_bytes(),
                unit: "bytes",
            });
        }
        if tokens == 0 {
            return Ok(());
        }
        self.enqueue_validate(slots, params.slot_limit, slots, params.slot_limit, shape)?;
        let k = self.kernels()?;
        let cfg = LaunchConfig {
            grid_dim: (self.grid(shape, tokens * 32), 1, 1),
            block_dim: (THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let (cache_addr, out_addr, slots_addr) = (
            cache.device_address(),
            out.device_address(),
            slots.address(),
        );
        let (err_ptr, _s) = self.err.device_ptr(&self.stream);
        // SAFETY: arguments match dequantize_index_k; out holds tokens * 128 f32.
        unsafe {
            self.stream
                .launch_builder(&k.dequantize)
                .arg(&params)
                .arg(&cache_addr)
                .arg(&tokens)
                .arg(&slots_addr)
                .arg(&out_addr)
                .arg(&err_ptr)
                .launch(cfg)
        }
        .map_err(driver_err("cuLaunchKernel(dequantize_index_k)"))?;
        self.finish()
    }

    /// Enqueues one `cuMemcpyAsync` of `bytes` bytes between two device-visible addresses
    /// (device or pinned host memory; unified addressing picks the direction). For baselines.
    ///
    /// # Safety
    /// Both ranges must lie inside live allocations until [`Gpu::finish`] returns.
    pub unsafe fn enqueue_memcpy(&self, dst: u64, src: u64, bytes: u64) -> Result<(), KernelError> {
        // SAFETY: forwarded to the caller.
        unsafe { sys::cuMemcpyAsync(dst, src, bytes as usize, self.stream.cu_stream()) }
            .result()
            .map_err(driver_err("cuMemcpyAsync"))
    }

    /// Uploads bf16 keys (`[tokens, 128]`) as device bytes.
    pub fn upload_bf16(&self, keys: &[bf16]) -> Result<DeviceBytes, KernelError> {
        let bytes: Vec<u8> = keys
            .iter()
            .flat_map(|k| k.to_bits().to_le_bytes())
            .collect();
        self.upload(&bytes)
    }
}
