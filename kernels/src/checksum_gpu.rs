//! The page checksum (`kvlayout.checksum/v1`, [`kvlayout_core::checksum`]) on the GPU: an NVRTC
//! kernel that gives the CPU reference's values bit for bit.
//!
//! One launch, `kvl_checksum_pages`: one warp per page (grid-stride over the pages), the page's
//! 4-KiB chunks in order. Thread `t` of the warp owns the 16-byte vectors `t, t + 32, ...` of a
//! chunk, that is words `2v` and `2v + 1`, whose checksum lanes are `2(t mod 4)` and
//! `2(t mod 4) + 1` for every vector it owns (32 vectors are 64 words, a multiple of 8): each
//! thread sums two lanes (products into one, the words of the other into it), warp shuffles
//! sum the eight threads of each lane pair (addition modulo 2^64 in any order gives the CPU's
//! sums), each thread mixes its pair (`fmix(a_l ^ (l + 1) * LANE_STEP)`), two more shuffles
//! give every thread the chunk value `c`, and the chain `h = fmix(h ^ c)` runs in registers
//! from the seed. A full chunk at a 16-byte-aligned address is read as [`VECS_PER_THREAD`]
//! 16-byte streaming loads per thread, all issued before the first is used (4 KiB in flight per
//! warp, 128 KiB per 1,024-thread block); a shorter or unaligned chunk is read word by word
//! with the same ownership.
//!
//! Pages are given as byte offsets into one device region (a layer's region and its page list),
//! each `payload_bytes` long (padding excluded). The SM budget ([`ChecksumLaunch`]) bounds the
//! grid so the verification can run on the model's carve-out. With `expected` checksums (the
//! ones recorded at backup) the kernel also counts mismatches on the device, so a load is
//! verified without a copy back per page.

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use kvlayout_core::checksum::{CHUNK_BYTES, DOMAIN, KEY_STEP, LANE_STEP};

use crate::device::Gpu;

/// 16-byte loads per thread per full chunk: 32 threads x 8 x 16 B = one 4,096-byte chunk.
pub const VECS_PER_THREAD: usize = CHUNK_BYTES / (32 * 16);
/// Threads per block by default: 32 warps, 32 pages in flight per block.
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
#define VECS_PER_THREAD {VECS_PER_THREAD}

__device__ __forceinline__ u64 fmix(u64 x) {{
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}}

// Word at p with `avail` bytes left (zero-padded past them).
__device__ __forceinline__ u64 load_word(const unsigned char* p, u64 avail) {{
    if (avail >= 8 && (((u64)p) & 7) == 0) return *(const u64*)p;
    u64 w = 0;
    for (u64 i = 0; i < 8 && i < avail; i++) w |= ((u64)p[i]) << (8 * i);
    return w;
}}

// 16 bytes by one streaming load (evict first: the pages are read once).
struct v4 {{ unsigned x, y, z, w; }};
__device__ __forceinline__ v4 load_v4(const unsigned char* p) {{
    v4 r;
    asm("ld.global.cs.v4.u32 {{%0, %1, %2, %3}}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
}}

// (x mod 2^32) * (x >> 32): one 32 x 32 -> 64-bit multiply.
__device__ __forceinline__ u64 lane_product(u64 x) {{
    return (u64)(unsigned)x * (u64)(unsigned)(x >> 32);
}}

// Adds words j0 = 2v (lane 2q) and j0 + 1 (lane 2q + 1) of a chunk, q = v mod 4, to the
// thread's two lanes: lane 2q takes the product of word j0 and word j0 + 1 itself (lane
// (2q + 1) xor 1), lane 2q + 1 the other way round.
__device__ __forceinline__ void add_pair(u64& even, u64& odd, u64 w0, u64 w1, u64 k0) {{
    even += lane_product(w0 ^ k0) + w1;
    odd += lane_product(w1 ^ (k0 + KEY_STEP)) + w0;
}}

// One warp per page (grid-stride over pages), its chunks in order. Thread t of the warp owns
// the 16-byte vectors v = t, t + 32, ... of a chunk: words 2v and 2v + 1, whose lanes are
// 2(t mod 4) and 2(t mod 4) + 1 for every v (64 words per 32 vectors keep j mod 8), so each
// thread sums two lanes; shuffles over t xor 4, 8, 16 sum the eight threads of a lane pair
// (addition modulo 2^64 in any order gives the CPU's sums), each thread mixes its pair, and
// shuffles over t xor 1, 2 give every thread the chunk value c; every thread chains
// h = fmix(h ^ c). A full chunk at a 16-byte-aligned address is read as VECS_PER_THREAD
// 16-byte loads per thread, all issued before the first is used (4 KiB in flight per warp);
// a shorter or unaligned chunk word by word with the same ownership.
// `expected` (0: none): the page's recorded checksum; a mismatch adds 1 to `*mismatches`.
extern "C" __global__ void __launch_bounds__(1024) kvl_checksum_pages(u64 data, const u64* page_offsets,
        u64 pages, u64 payload_bytes, u64 token_fingerprint, u64 layer_id, u64* out,
        const u64* expected, unsigned long long* mismatches) {{
    const unsigned t = threadIdx.x & 31;
    const unsigned q = t & 3;
    const u64 warps_total = (u64)gridDim.x * (blockDim.x / 32);
    const u64 seed = fmix(fmix(fmix(token_fingerprint ^ DOMAIN) ^ layer_id) ^ payload_bytes);
    const u64 even_key = (u64)(2 * q + 1) * LANE_STEP, odd_key = (u64)(2 * q + 2) * LANE_STEP;
    // K_j of word 2t: (2t + 1) * KEY_STEP; vector t + 32 i adds 64 i words.
    const u64 k_base = (u64)(2 * t + 1) * KEY_STEP;
    for (u64 page = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; page < pages;
         page += warps_total) {{
        const unsigned char* base = (const unsigned char*)(data + page_offsets[page]);
        u64 h = seed;
        for (u64 start = 0; start < payload_bytes; start += CHUNK_BYTES) {{
            const unsigned char* chunk = base + start;
            const u64 len = (payload_bytes - start < CHUNK_BYTES) ? payload_bytes - start : CHUNK_BYTES;
            u64 even = 0, odd = 0;
            if (len == CHUNK_BYTES && (((u64)chunk) & 15) == 0) {{
                v4 r[VECS_PER_THREAD];
#pragma unroll
                for (int i = 0; i < VECS_PER_THREAD; i++) r[i] = load_v4(chunk + 16 * (t + 32 * i));
#pragma unroll
                for (int i = 0; i < VECS_PER_THREAD; i++) {{
                    const u64 w0 = ((u64)r[i].y << 32) | r[i].x, w1 = ((u64)r[i].w << 32) | r[i].z;
                    add_pair(even, odd, w0, w1, k_base + (u64)(64 * i) * KEY_STEP);
                }}
            }} else {{
                const u64 words = (len + 7) / 8;
                for (u64 v = t; 2 * v < words; v += 32) {{
                    const u64 j0 = 2 * v;
                    const u64 w0 = load_word(chunk + 8 * j0, len - 8 * j0);
                    const u64 k0 = (j0 + 1) * KEY_STEP;
                    even += lane_product(w0 ^ k0);
                    odd += w0;
                    if (j0 + 1 < words) {{
                        const u64 w1 = load_word(chunk + 8 * j0 + 8, len - 8 * j0 - 8);
                        odd += lane_product(w1 ^ (k0 + KEY_STEP));
                        even += w1;
                    }}
                }}
            }}
#pragma unroll
            for (int m = 4; m <= 16; m *= 2) {{
                even += __shfl_xor_sync(0xffffffffu, even, m);
                odd += __shfl_xor_sync(0xffffffffu, odd, m);
            }}
            u64 c = fmix(even ^ even_key) + fmix(odd ^ odd_key);
            c += __shfl_xor_sync(0xffffffffu, c, 1);
            c += __shfl_xor_sync(0xffffffffu, c, 2);
            h = fmix(h ^ c);
        }}
        if (t == 0) {{
            out[page] = h;
            if (expected != 0 && expected[page] != h) atomicAdd(mismatches, 1ull);
        }}
    }}
}}
"#
    )
}

/// The grid of a checksum launch: `blocks` blocks of `threads_per_block` threads (a multiple of
/// 32, at most 1,024), one warp per page at a time. One block per SM keeps the work to that
/// many SMs when the others are busy (CUDA places blocks itself: on an idle GPU they may
/// spread wider).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChecksumLaunch {
    /// Blocks of the grid.
    pub blocks: u32,
    /// Threads per block.
    pub threads_per_block: u32,
}

impl ChecksumLaunch {
    /// `sms` blocks of [`CHECKSUM_THREADS_PER_BLOCK`] threads: an SM budget.
    pub const fn sms(sms: u32) -> ChecksumLaunch {
        ChecksumLaunch {
            blocks: sms,
            threads_per_block: CHECKSUM_THREADS_PER_BLOCK,
        }
    }

    /// One warp per page: enough blocks of [`CHECKSUM_THREADS_PER_BLOCK`] threads for `pages`.
    pub fn for_pages(pages: u64) -> ChecksumLaunch {
        let warps = u64::from(CHECKSUM_THREADS_PER_BLOCK / 32);
        ChecksumLaunch::sms(pages.div_ceil(warps).clamp(1, 1 << 16) as u32)
    }
}

/// One checksum launch in device addresses (see [`ChecksumKernels::enqueue`]).
#[derive(Clone, Copy, Debug)]
pub struct ChecksumJob {
    /// Device address the page offsets count from.
    pub data_address: u64,
    /// Device address of `pages` `u64` byte offsets, one per page.
    pub offsets_address: u64,
    /// Pages.
    pub pages: u64,
    /// Bytes per page payload (padding excluded).
    pub payload_bytes: u64,
    /// The buffer's token fingerprint (the checksum's seed).
    pub token_fingerprint: u64,
    /// The model layer id (the checksum's seed).
    pub layer_id: u64,
    /// Device address of `pages` `u64` results.
    pub out_address: u64,
    /// Device address of `pages` expected checksums, or 0 for none.
    pub expected_address: u64,
    /// Device address of one `u64` counter the mismatches are added to (read only with
    /// `expected_address` set).
    pub mismatches_address: u64,
}

/// The kernel compiled by NVRTC for `arch` (`sm_90` for an H200); needs libnvrtc, not a GPU.
///
/// # Errors
/// [`ChecksumGpuError::Compile`] with NVRTC's log.
pub fn compile(arch: &str) -> Result<cudarc::nvrtc::Ptx, ChecksumGpuError> {
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some("kvlayout_checksum.cu".into()),
        ..Default::default()
    };
    compile_ptx_with_opts(cuda_source(), opts).map_err(|e| ChecksumGpuError::Compile {
        arch: arch.to_string(),
        log: format!("{e:?}"),
    })
}

/// The compiled checksum kernel of one CUDA context.
pub struct ChecksumKernels {
    pages: CudaFunction,
    _module: Arc<CudaModule>,
}

impl ChecksumKernels {
    /// Compiles the kernel with NVRTC for `gpu`'s architecture.
    ///
    /// # Errors
    /// [`ChecksumGpuError::Compile`] or a driver error loading the module.
    pub fn new(gpu: &Gpu) -> Result<ChecksumKernels, ChecksumGpuError> {
        ChecksumKernels::for_context(gpu.context())
    }

    /// Compiles the kernel with NVRTC for the architecture of `ctx`'s device (a primary context
    /// shared with another library, such as PyTorch's).
    ///
    /// # Errors
    /// [`ChecksumGpuError::Compile`] or a driver error reading the device or loading the module.
    pub fn for_context(ctx: &Arc<CudaContext>) -> Result<ChecksumKernels, ChecksumGpuError> {
        let (major, minor) = ctx
            .compute_capability()
            .map_err(driver("cuDeviceGetAttribute"))?;
        let ptx = compile(&format!("sm_{major}{minor}"))?;
        let module = ctx.load_module(ptx).map_err(driver("cuModuleLoadData"))?;
        let pages = module
            .load_function("kvl_checksum_pages")
            .map_err(driver("cuModuleGetFunction"))?;
        Ok(ChecksumKernels {
            pages,
            _module: module,
        })
    }

    /// Enqueues the checksums of `job`'s pages on `stream` (no wait).
    ///
    /// # Safety
    /// Every address of `job` is live device memory of `stream`'s context for as long as the
    /// launch runs: `pages` offsets, each page's `payload_bytes` from `data_address + offset`,
    /// `pages` results (and expected values, and the counter, when `expected_address` is set).
    ///
    /// # Errors
    /// A driver error on the launch.
    pub unsafe fn enqueue(
        &self,
        stream: &CudaStream,
        job: &ChecksumJob,
        launch: ChecksumLaunch,
    ) -> Result<(), ChecksumGpuError> {
        if job.pages == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (launch.blocks.max(1), 1, 1),
            block_dim: (launch.threads_per_block.clamp(32, 1024) / 32 * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = stream.launch_builder(&self.pages);
        b.arg(&job.data_address)
            .arg(&job.offsets_address)
            .arg(&job.pages)
            .arg(&job.payload_bytes)
            .arg(&job.token_fingerprint)
            .arg(&job.layer_id)
            .arg(&job.out_address)
            .arg(&job.expected_address)
            .arg(&job.mismatches_address);
        // SAFETY: the arguments match kvl_checksum_pages; the caller vouches for the addresses.
        unsafe { b.launch(cfg) }.map_err(driver("cuLaunchKernel(kvl_checksum_pages)"))?;
        Ok(())
    }

    /// The checksums of the pages at `page_offsets` (bytes into `data`, each `payload_bytes`
    /// long), seeded with `token_fingerprint` and `layer_id`: equal to
    /// [`kvlayout_core::checksum::page_checksum`] of each page. `blocks`: the grid (the SM
    /// budget: 1 or 2 blocks keep to 1 or 2 SMs); `None` for one warp per page. Enqueued on
    /// `gpu`'s stream; waits for the result.
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
        let stream = gpu.stream();
        let (address, _guard) = cudarc::driver::DevicePtr::device_ptr(data, stream);
        let launch = blocks.map(ChecksumLaunch::sms);
        // SAFETY: `data` is a live allocation of `gpu`'s context of `data.len()` bytes, held
        // for the whole call (it waits for the result).
        unsafe {
            self.page_checksums_at(
                stream,
                address,
                data.len() as u64,
                page_offsets,
                payload_bytes,
                (token_fingerprint, layer_id),
                launch,
            )
        }
    }

    /// As [`ChecksumKernels::page_checksums`], over `len_bytes` bytes of device memory at
    /// `address` (a tensor of another library), on `stream` (that library's current stream,
    /// so the checksums see its earlier work); `seed`: (token fingerprint, model layer id);
    /// `launch`: `None` for one warp per page. Waits for the result.
    ///
    /// # Safety
    /// `address .. address + len_bytes` is live device memory of `stream`'s context until the
    /// call returns.
    ///
    /// # Errors
    /// [`ChecksumGpuError::PageRange`] for a page past `len_bytes` (checked on the host before
    /// any launch); a driver error.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn page_checksums_at(
        &self,
        stream: &Arc<CudaStream>,
        address: u64,
        len_bytes: u64,
        page_offsets: &[u64],
        payload_bytes: u64,
        seed: (u64, u64),
        launch: Option<ChecksumLaunch>,
    ) -> Result<Vec<u64>, ChecksumGpuError> {
        for (index, &start) in page_offsets.iter().enumerate() {
            let end = start.checked_add(payload_bytes);
            if end.is_none_or(|e| e > len_bytes) {
                return Err(ChecksumGpuError::PageRange {
                    index,
                    start_bytes: start,
                    end_bytes: end.unwrap_or(u64::MAX),
                    len_bytes,
                });
            }
        }
        let pages = page_offsets.len() as u64;
        if pages == 0 {
            return Ok(Vec::new());
        }
        let offsets = stream
            .clone_htod(page_offsets)
            .map_err(driver("cuMemcpyHtoD(page offsets)"))?;
        let mut out = stream
            .alloc_zeros::<u64>(pages as usize)
            .map_err(driver("cuMemAlloc(checksums)"))?;
        {
            use cudarc::driver::{DevicePtr, DevicePtrMut};
            let (offsets_address, _g1) = offsets.device_ptr(stream);
            let (out_address, _g2) = out.device_ptr_mut(stream);
            let job = ChecksumJob {
                data_address: address,
                offsets_address,
                pages,
                payload_bytes,
                token_fingerprint: seed.0,
                layer_id: seed.1,
                out_address,
                expected_address: 0,
                mismatches_address: 0,
            };
            // SAFETY: every page lies inside `address .. address + len_bytes` (checked above,
            // live by the caller's word); `offsets` and `out` hold `pages` words each.
            unsafe {
                self.enqueue(
                    stream,
                    &job,
                    launch.unwrap_or(ChecksumLaunch::for_pages(pages)),
                )
            }?;
        }
        stream
            .clone_dtoh(&out)
            .map_err(driver("cuMemcpyDtoH(checksums)"))
    }
}
