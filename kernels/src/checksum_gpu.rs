//! The page checksum (`kvlayout.checksum/v1`, [`kvlayout_core::checksum`]) on the GPU: an NVRTC
//! kernel that gives the CPU reference's values bit for bit.
//!
//! Two launches on the [`Gpu`]'s stream:
//! - `kvl_checksum_chunks`: one warp per 4-KiB chunk of a page (grid-stride over every chunk
//!   of every page). Lane `t` of the warp reads words `t, t + 32, ...` of the chunk; word `j`
//!   belongs to checksum lane `j mod 8 = t mod 8`, so a thread adds its products to lane
//!   `t mod 8` and its words to lane `(t mod 8) xor 1`; warp shuffles sum the four threads of a
//!   lane (addition modulo 2^64 in any order gives the CPU's sums), then threads 0..7 each mix
//!   one lane (`fmix(a_l ^ (l + 1) * LANE_STEP)`) and a shuffle sum gives the chunk value `c`.
//! - `kvl_checksum_fold`: one thread per page chains its chunks in order from the seed:
//!   `h = fmix(h ^ c)`.
//!
//! Pages are given as byte offsets into one device buffer (a layer's region and its page list),
//! each `payload_bytes` long (padding excluded). The SM budget (`blocks`) bounds the grid so the
//! verification can run on the model's carve-out.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use kvlayout_core::checksum::{CHUNK_BYTES, DOMAIN, KEY_STEP, LANE_STEP};

use crate::device::Gpu;

/// Threads per block of the chunk kernel (32 warps: one block fills an SM's warp slots half).
pub const CHECKSUM_THREADS_PER_BLOCK: u32 = 1024;

/// Why a GPU checksum could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum ChecksumGpuError {
    /// NVRTC refused the source (the log).
    #[error("NVRTC compile for {arch}: {log}")]
    Compile {
        /// Target architecture.
        arch: String,
        /// The compiler's log.
        log: String,
    },
    /// A driver call failed.
    #[error("{call}: {reason}")]
    Driver {
        /// The call.
        call: &'static str,
        /// The driver's error.
        reason: String,
    },
    /// A page reaches past the buffer.
    #[error("page {index}: bytes [{start_bytes}, {end_bytes}) past the {len_bytes}-byte buffer")]
    PageRange {
        /// Index in the page list.
        index: usize,
        /// First byte.
        start_bytes: u64,
        /// One past the last byte.
        end_bytes: u64,
        /// Buffer length.
        len_bytes: u64,
    },
}

fn driver(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> ChecksumGpuError {
    move |e| ChecksumGpuError::Driver {
        call,
        reason: format!("{e:?}"),
    }
}

/// The CUDA source (constants from [`kvlayout_core::checksum`]).
pub fn cuda_source() -> String {
    format!(
        r#"
typedef unsigned long long u64;
#define CHUNK_BYTES {CHUNK_BYTES}ull
#define KEY_STEP {KEY_STEP}ull
#define LANE_STEP {LANE_STEP}ull
#define DOMAIN {DOMAIN}ull

__device__ __forceinline__ u64 fmix(u64 x) {{
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}}

__device__ __forceinline__ u64 load_word(const unsigned char* p, u64 avail) {{
    if (avail >= 8 && (((u64)p) & 7) == 0) return *(const u64*)p;
    u64 w = 0;
    for (u64 i = 0; i < 8 && i < avail; i++) w |= ((u64)p[i]) << (8 * i);
    return w;
}}

extern "C" __global__ void kvl_checksum_chunks(const unsigned char* data, const u64* page_offsets,
        u64 pages, u64 payload_bytes, u64 chunks_per_page, u64* chunk_values) {{
    const unsigned lane = threadIdx.x & 31;
    const u64 warps_total = (u64)gridDim.x * (blockDim.x / 32);
    const u64 total = pages * chunks_per_page;
    for (u64 w = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; w < total; w += warps_total) {{
        const u64 page = w / chunks_per_page, chunk = w % chunks_per_page;
        const u64 start = chunk * CHUNK_BYTES;
        const u64 len = (payload_bytes - start < CHUNK_BYTES) ? payload_bytes - start : CHUNK_BYTES;
        const u64 words = (len + 7) / 8;
        const unsigned char* base = data + page_offsets[page] + start;
        u64 prod = 0, sum = 0;
        for (u64 j = lane; j < words; j += 32) {{
            const u64 wd = load_word(base + 8 * j, len - 8 * j);
            const u64 x = wd ^ ((j + 1) * KEY_STEP);
            prod += (x & 0xffffffffull) * (x >> 32);
            sum += wd;
        }}
        // Threads t, t^8, t^16, t^24 share lane t mod 8.
        prod += __shfl_xor_sync(0xffffffffu, prod, 8);
        sum += __shfl_xor_sync(0xffffffffu, sum, 8);
        prod += __shfl_xor_sync(0xffffffffu, prod, 16);
        sum += __shfl_xor_sync(0xffffffffu, sum, 16);
        // Lane l (thread l < 8): its products plus the words of lane l xor 1.
        const u64 other = __shfl_xor_sync(0xffffffffu, sum, 1);
        u64 mixed = 0;
        if (lane < 8) mixed = fmix((prod + other) ^ ((u64)(lane + 1) * LANE_STEP));
        mixed += __shfl_xor_sync(0xffffffffu, mixed, 1);
        mixed += __shfl_xor_sync(0xffffffffu, mixed, 2);
        mixed += __shfl_xor_sync(0xffffffffu, mixed, 4);
        if (lane == 0) chunk_values[w] = mixed;
    }}
}}

extern "C" __global__ void kvl_checksum_fold(const u64* chunk_values, u64 pages,
        u64 chunks_per_page, u64 token_fingerprint, u64 layer_id, u64 payload_bytes, u64* out) {{
    const u64 page = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (page >= pages) return;
    u64 h = fmix(fmix(fmix(token_fingerprint ^ DOMAIN) ^ layer_id) ^ payload_bytes);
    for (u64 c = 0; c < chunks_per_page; c++) h = fmix(h ^ chunk_values[page * chunks_per_page + c]);
    out[page] = h;
}}
"#
    )
}

/// The compiled checksum kernels of one [`Gpu`].
pub struct ChecksumKernels {
    chunks: CudaFunction,
    fold: CudaFunction,
    _module: Arc<CudaModule>,
}

impl ChecksumKernels {
    /// Compiles the kernels with NVRTC for `gpu`'s architecture.
    ///
    /// # Errors
    /// [`ChecksumGpuError::Compile`] or a driver error loading the module.
    pub fn new(gpu: &Gpu) -> Result<ChecksumKernels, ChecksumGpuError> {
        let arch = gpu.arch();
        let opts = CompileOptions {
            options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
            name: Some("kvlayout_checksum.cu".into()),
            ..Default::default()
        };
        let ptx =
            compile_ptx_with_opts(cuda_source(), opts).map_err(|e| ChecksumGpuError::Compile {
                arch,
                log: format!("{e:?}"),
            })?;
        let module = gpu
            .context()
            .load_module(ptx)
            .map_err(driver("cuModuleLoadData"))?;
        let f = |n| {
            module
                .load_function(n)
                .map_err(driver("cuModuleGetFunction"))
        };
        Ok(ChecksumKernels {
            chunks: f("kvl_checksum_chunks")?,
            fold: f("kvl_checksum_fold")?,
            _module: module,
        })
    }

    /// The checksums of the pages at `page_offsets` (bytes into `data`, each `payload_bytes`
    /// long), seeded with `token_fingerprint` and `layer_id`: equal to
    /// [`kvlayout_core::checksum::page_checksum`] of each page. `blocks`: the grid of the
    /// chunk kernel (the SM budget: 1 or 2 blocks keep to 1 or 2 SMs); `None` for one block
    /// per 8 chunks. Enqueued on `gpu`'s stream; waits for the result.
    ///
    /// # Errors
    /// [`ChecksumGpuError::PageRange`] for a page past `data` (checked on the host before any
    /// launch); a driver error.
    #[allow(clippy::too_many_arguments)]
    pub fn page_checksums(
        &self,
        gpu: &Gpu,
        data: &CudaSlice<u8>,
        page_offsets: &[u64],
        payload_bytes: u64,
        token_fingerprint: u64,
        layer_id: u64,
        blocks: Option<u32>,
    ) -> Result<Vec<u64>, ChecksumGpuError> {
        let len = data.len() as u64;
        for (index, &start) in page_offsets.iter().enumerate() {
            let end = start.saturating_add(payload_bytes);
            if end > len {
                return Err(ChecksumGpuError::PageRange {
                    index,
                    start_bytes: start,
                    end_bytes: end,
                    len_bytes: len,
                });
            }
        }
        let pages = page_offsets.len() as u64;
        if pages == 0 {
            return Ok(Vec::new());
        }
        let stream = gpu.stream();
        let chunks_per_page = payload_bytes.div_ceil(CHUNK_BYTES as u64);
        let offsets = stream
            .clone_htod(page_offsets)
            .map_err(driver("cuMemcpyHtoD(page offsets)"))?;
        let total = (pages * chunks_per_page).max(1);
        let mut values = stream
            .alloc_zeros::<u64>(total as usize)
            .map_err(driver("cuMemAlloc(chunk values)"))?;
        let mut out = stream
            .alloc_zeros::<u64>(pages as usize)
            .map_err(driver("cuMemAlloc(checksums)"))?;
        let warps_per_block = u64::from(CHECKSUM_THREADS_PER_BLOCK / 32);
        let grid = blocks.unwrap_or_else(|| total.div_ceil(warps_per_block).min(1 << 20) as u32);
        let cfg = LaunchConfig {
            grid_dim: (grid.max(1), 1, 1),
            block_dim: (CHECKSUM_THREADS_PER_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&self.chunks);
        b.arg(data)
            .arg(&offsets)
            .arg(&pages)
            .arg(&payload_bytes)
            .arg(&chunks_per_page)
            .arg(&mut values);
        // SAFETY: the arguments match kvl_checksum_chunks; every page lies inside `data`
        // (checked above); `values` holds pages x chunks_per_page words.
        unsafe { b.launch(cfg) }.map_err(driver("cuLaunchKernel(kvl_checksum_chunks)"))?;
        let fold_cfg = LaunchConfig {
            grid_dim: (pages.div_ceil(128) as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut f = stream.launch_builder(&self.fold);
        f.arg(&values)
            .arg(&pages)
            .arg(&chunks_per_page)
            .arg(&token_fingerprint)
            .arg(&layer_id)
            .arg(&payload_bytes)
            .arg(&mut out);
        // SAFETY: the arguments match kvl_checksum_fold; `out` holds `pages` words.
        unsafe { f.launch(fold_cfg) }.map_err(driver("cuLaunchKernel(kvl_checksum_fold)"))?;
        stream
            .clone_dtoh(&out)
            .map_err(driver("cuMemcpyDtoH(checksums)"))
    }
}
