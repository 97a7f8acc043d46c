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
//!   `device::token_runs`), a warp copying `256 / vectors per run` runs at a time, 8 loads of
//!   16 bytes in flight per lane; optionally paced (a rate limit: token backups next to a model,
//!   [`crate::LaunchShape::rate_limit_bytes_per_us`]).

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

// Runs of one length, `vpr` 16-byte vectors each (8 to 256: runs of 128 B to 4 KiB; every
// offset and both bases 16-byte aligned; checked on the host): the token-granular path (a token
// of one layer per run: 2,048 B for Llama-3.1-8B's K or V in bf16, 1,152 B for an MLA latent).
// A warp copies `group` = 256 / vpr runs at a time: its 256 load slots (8 per lane) hold the
// group's vectors one after the other, slot lane + 32 j holding vector (lane + 32 j) % vpr of
// run (lane + 32 j) / vpr of the group (slots past group * vpr idle: 40 of 256 for 1,152-byte
// runs, none for 2,048), so every lane issues up to 8 independent 16-byte loads before any
// store. Each slot's run is walked from the lane's first (`uniform_next`), with no division
// and no array per slot (64 registers, no spills at 4 blocks of 256 threads per SM). The lists
// are checked before the launch (on the host, or by validate_runs on the stream); this kernel
// only reads the error record.

// From slot lane + 32 j (run g, vector v) to slot lane + 32 (j + 1): 32 vectors on (vpr >= 8:
// at most 4 runs on).
__device__ __forceinline__ void uniform_next(u32& g, u32& v, u32 vpr)
{
    v += 32u;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        if (v >= vpr) { v -= vpr; ++g; }
    }
}

// Loads the slots of the group of runs at `first` whose run is below `lim` into `buf`.
__device__ __forceinline__ void uniform_load(
    uint4* buf, u32 g0, u32 v0, u32 vpr, u32 lim, const Run* runs, u64 first,
    const unsigned char* src)
{
    u32 g = g0, v = v0;
#pragma unroll
    for (u32 j = 0; j < 8; ++j) {
        if (g < lim) {
            buf[j] = reinterpret_cast<const uint4*>(src + runs[first + g].src)[v];
        }
        uniform_next(g, v, vpr);
    }
}

// Stores `buf` to the group (as `uniform_load`).
__device__ __forceinline__ void uniform_store(
    const uint4* buf, u32 g0, u32 v0, u32 vpr, u32 lim, const Run* runs, u64 first,
    unsigned char* dst)
{
    u32 g = g0, v = v0;
#pragma unroll
    for (u32 j = 0; j < 8; ++j) {
        if (g < lim) {
            reinterpret_cast<uint4*>(dst + runs[first + g].dst)[v] = buf[j];
        }
        uniform_next(g, v, vpr);
    }
}

// The runs of the group at `first` that exist (at most `per_group`).
__device__ __forceinline__ u32 uniform_lim(u64 first, u64 n, u32 per_group)
{
    return first >= n ? 0u : (u32)((n - first) < (u64)per_group ? (n - first) : (u64)per_group);
}

__device__ __forceinline__ u64 global_ns()
{
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The token kernel's body. PACED: each warp starts its k-th group no earlier than k x pace_ns
// after its first (a rate limit: the launch's warps x group bytes per pace_ns at most); the
// unpaced body has no timer and no pacing registers.
template <bool PACED>
__device__ __forceinline__ void uniform_copy(
    const Run* __restrict__ runs, u64 n, u64 vpr, u64 group, const unsigned char* src,
    unsigned char* dst, unsigned long long* err, u64 pace_ns)
{
    if (*((volatile const u64*)err) != 0) return;
    u64 due_ns = PACED ? global_ns() : 0;
    const u32 lane = threadIdx.x & 31u;
    const u32 per_group = (u32)group;
    const u32 vectors = (u32)vpr;
    const u32 g0 = lane / vectors, v0 = lane % vectors;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 first = warp * per_group; first < n; first += warps * per_group) {
        if (PACED) {
            while (global_ns() < due_ns) {
#if __CUDA_ARCH__ >= 700
                __nanosleep(256);  // sm_70 and later; older GPUs spin
#endif
            }
            due_ns += pace_ns;
        }
        const u32 lim = uniform_lim(first, n, per_group);
        uint4 buf[8];
        uniform_load(buf, g0, v0, vectors, lim, runs, first, src);
        uniform_store(buf, g0, v0, vectors, lim, runs, first, dst);
    }
}

extern "C" __global__ void __launch_bounds__(256, 4) copy_runs_uniform(
    const Run* __restrict__ runs, u64 n, u64 vpr, u64 group, const unsigned char* src,
    unsigned char* dst, unsigned long long* err)
{
    uniform_copy<false>(runs, n, vpr, group, src, dst, err, 0);
}

// Token backups next to a model: paced (`pace_ns` > 0).
extern "C" __global__ void __launch_bounds__(256, 4) copy_runs_uniform_paced(
    const Run* __restrict__ runs, u64 n, u64 vpr, u64 group, const unsigned char* src,
    unsigned char* dst, unsigned long long* err, u64 pace_ns)
{
    uniform_copy<true>(runs, n, vpr, group, src, dst, err, pace_ns);
}
"#;

#[cfg(test)]
mod tests {
    /// NVRTC compiles the source only on a GPU machine; the CPU build checks at least that
    /// every brace closes one opened before it and all are closed (an extra `}` cost a device
    /// run once: "expected a declaration").
    #[test]
    fn the_cuda_source_has_balanced_braces() {
        let mut depth = 0i64;
        for (line_no, line) in super::SOURCE.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for c in code.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                assert!(depth >= 0, "line {}: a brace closes nothing", line_no + 1);
            }
        }
        assert_eq!(depth, 0, "unclosed braces");
    }
}
