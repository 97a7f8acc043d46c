//! The CUDA C source of every kernel, compiled at first use with NVRTC for the device's
//! architecture (see [`crate::device`]). No header is included.
//!
//! Kernels, for explicit `(src, dst, len)` run lists ([`crate::copy_runs`]):
//! - `validate_runs`: the validation pass. Counts runs that leave either buffer and records
//!   the first such position; writes only the two-word error record.
//! - `copy_runs`: a warp per run, 16-byte accesses when the run allows. Every launch first reads
//!   the error record and returns without writing if any validation on the stream has failed,
//!   so a bad list moves no byte; short lists (`self_check`) are checked by every block itself.
//! - `copy_runs_uniform`: runs of one length (the token-granular path,
//!   `device::token_runs`), the list's 16-byte vectors spread over the whole grid.

/// Threads per block of every kernel (the copy kernels declare it in `__launch_bounds__`).
pub(crate) const THREADS_PER_BLOCK: u32 = 256;

/// Loads of 16 bytes each lane of the token kernel (`copy_runs_uniform`) issues before its
/// stores: 128 bytes in flight per thread, 128 KiB per SM at its 4 blocks of 256 threads.
pub(crate) const LOADS_PER_LANE: u64 = 8;

/// The source.
pub(crate) const SOURCE: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;

#define COPY_UNROLL 4

struct Run {
    u64 src;
    u64 dst;
    u64 len;
};

__device__ __forceinline__ bool run_fits(const Run& r, u64 src_len, u64 dst_len)
{
    return r.src <= src_len && r.len <= src_len - r.src && r.dst <= dst_len && r.len <= dst_len - r.dst;
}

extern "C" __global__ void validate_runs(
    const Run* __restrict__ runs, u64 n, u64 src_len, u64 dst_len, unsigned long long* err)
{
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (!run_fits(runs[i], src_len, dst_len)) {
            atomicAdd(&err[0], 1ull);
            atomicMax(&err[1], ~(unsigned long long)i);
        }
    }
}

// One warp copies `len` bytes with V-sized accesses, COPY_UNROLL loads in flight per lane.
template <typename V>
__device__ __forceinline__ void warp_copy(const unsigned char* s, unsigned char* d, u64 len, u32 lane)
{
    const V* sv = reinterpret_cast<const V*>(s);
    V* dv = reinterpret_cast<V*>(d);
    const u64 nv = len / sizeof(V);
    for (u64 first = lane; first < nv; first += 32 * COPY_UNROLL) {
        V buf[COPY_UNROLL];
#pragma unroll
        for (int k = 0; k < COPY_UNROLL; ++k) {
            const u64 v = first + 32 * k;
            if (v < nv) buf[k] = sv[v];
        }
#pragma unroll
        for (int k = 0; k < COPY_UNROLL; ++k) {
            const u64 v = first + 32 * k;
            if (v < nv) dv[v] = buf[k];
        }
    }
}

// A warp per run. Short lists (self_check) are checked by every block before it writes.
extern "C" __global__ void __launch_bounds__(256) copy_runs(
    const Run* __restrict__ runs, u64 n, const unsigned char* src, unsigned char* dst,
    u64 src_len, u64 dst_len, u64 self_check, unsigned long long* err)
{
    if (*((volatile const u64*)err) != 0) return;
    if (self_check) {
        int bad = 0;
        for (u64 i = threadIdx.x; i < n; i += blockDim.x) bad |= !run_fits(runs[i], src_len, dst_len);
        if (__syncthreads_or(bad)) {
            if (blockIdx.x == 0) {
                for (u64 i = threadIdx.x; i < n; i += blockDim.x) {
                    if (!run_fits(runs[i], src_len, dst_len)) {
                        atomicAdd(&err[0], 1ull);
                        atomicMax(&err[1], ~(unsigned long long)i);
                    }
                }
            }
            return;
        }
    }
    const u32 lane = threadIdx.x & 31u;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 i = warp; i < n; i += warps) {
        const Run r = runs[i];
        const unsigned char* s = src + r.src;
        unsigned char* d = dst + r.dst;
        const u64 align = reinterpret_cast<u64>(s) | reinterpret_cast<u64>(d) | r.len;
        if ((align & 15u) == 0) {
            warp_copy<uint4>(s, d, r.len, lane);
        } else if ((align & 7u) == 0) {
            warp_copy<uint2>(s, d, r.len, lane);
        } else if ((align & 3u) == 0) {
            warp_copy<unsigned int>(s, d, r.len, lane);
        } else {
            warp_copy<unsigned char>(s, d, r.len, lane);
        }
    }
}

// Runs of one length, `vpr` 16-byte vectors each (at most 256: runs of at most 4 KiB; every
// offset and both bases 16-byte aligned; checked on the host): the token-granular path (a token
// of one layer per run: 2,048 B for Llama-3.1-8B's K or V in bf16, 1,152 B for an MLA latent).
// A warp copies 8 >> lane_shift runs at a time; lane l loads vector l + 32 i of each
// (i < 1 << lane_shift, the power of two at or above vpr / 32): 8 independent 16-byte loads
// per lane issued before any store, one descriptor per run read by the whole warp. The lists
// are checked before the launch (on the host, or by validate_runs on the stream); this kernel
// only reads the error record.
extern "C" __global__ void __launch_bounds__(256, 4) copy_runs_uniform(
    const Run* __restrict__ runs, u64 n, u64 vpr, u64 lane_shift, const unsigned char* src,
    unsigned char* dst, unsigned long long* err)
{
    if (*((volatile const u64*)err) != 0) return;
    const u32 lane = threadIdx.x & 31u;
    const u32 shift = (u32)lane_shift;
    const u32 mask = (1u << shift) - 1u;
    const u64 per_warp = 8u >> shift;
    const u32 vectors = (u32)vpr;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 first = warp * per_warp; first < n; first += warps * per_warp) {
        uint4 buf[8];
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const u64 r = first + (j >> shift);
            const u32 v = lane + 32u * (j & mask);
            if (r < n && v < vectors) {
                buf[j] = reinterpret_cast<const uint4*>(src + runs[r].src)[v];
            }
        }
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const u64 r = first + (j >> shift);
            const u32 v = lane + 32u * (j & mask);
            if (r < n && v < vectors) {
                reinterpret_cast<uint4*>(dst + runs[r].dst)[v] = buf[j];
            }
        }
    }
}
"#;
