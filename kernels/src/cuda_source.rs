//! The CUDA C source of every kernel, compiled at first use with NVRTC for the device's
//! architecture (see [`crate::device`]). No header is included (NVRTC 13.0 ships without
//! `cuda_fp8.h`): bf16 is widened by a shift, e4m3 is produced by the `cvt.rn.satfinite.e4m3x2.f32`
//! PTX instruction (compute capability 8.9 and later) and decoded by hand.
//!
//! Kernels:
//! - `validate_index_lists`: the validation pass. Counts positions whose index is out of range on
//!   either list and records the first such position; writes only the two-word error record.
//! - `copy_items_v{16,8,4,2,1}_{u32,u64}`: the transfer. Every launch first reads the error
//!   record and returns without writing if any validation on the stream has failed, so a bad
//!   list moves no byte. For short lists (`self_check`) every block checks every index itself
//!   before it writes, and no validation launch is needed. Item addresses follow [`crate::CopySpec`]'s formula; the vector width
//!   and the 32/64-bit index arithmetic are chosen on the host.
//! - `copy_two_parts_v{16,8,4,2,1}`: the same for two parts driven by the same lists (index-K
//!   values and scales of a `section_major` token) in one launch, at the narrower part's width.
//! - `validate_runs`, `copy_runs`: the same for explicit `(src, dst, len)` run lists
//!   ([`crate::copy_runs`]), a warp per run, 16-byte accesses when the run allows.
//! - `quantize_index_k`, `dequantize_index_k`: the fp8 index-K quantizer and its reader
//!   ([`crate::index_k`] has the arithmetic and the CPU reference).

/// Threads per block of every kernel (the copy kernels declare it in `__launch_bounds__`).
pub const THREADS_PER_BLOCK: u32 = 256;

/// Independent vectors each copy thread loads before it stores (bytes in flight per thread =
/// `COPY_UNROLL * vector bytes`).
pub const COPY_UNROLL: u64 = 4;

/// Vectors of 16 bytes each thread of the uniform run kernel (`copy_runs_uniform`, the
/// token-granular path) loads before it stores: 128 bytes in flight per thread, 128 KiB per SM
/// at its 4 blocks of 256 threads.
pub(crate) const FLAT_UNROLL: u64 = 8;

/// Tokens each warp of the quantizer loads before it converts (a half-warp per token; bytes in
/// flight per warp = `QUANT_TOKENS_PER_WARP * 256`).
pub const QUANT_TOKENS_PER_WARP: u64 = 8;

/// Two-part copy kernels (one launch for both parts of a `section_major` token), by vector
/// width (bytes).
pub const COPY_TWO_PARTS_KERNELS: [(u64, &str); 5] = [
    (16, "copy_two_parts_v16"),
    (8, "copy_two_parts_v8"),
    (4, "copy_two_parts_v4"),
    (2, "copy_two_parts_v2"),
    (1, "copy_two_parts_v1"),
];

/// Kernel names, by vector width (bytes) and index width.
pub const COPY_KERNELS: [(u64, &str, &str); 5] = [
    (16, "copy_items_v16_u32", "copy_items_v16_u64"),
    (8, "copy_items_v8_u32", "copy_items_v8_u64"),
    (4, "copy_items_v4_u32", "copy_items_v4_u64"),
    (2, "copy_items_v2_u32", "copy_items_v2_u64"),
    (1, "copy_items_v1_u32", "copy_items_v1_u64"),
];

/// The source. `INV448_BITS` and `AMAX_FLOOR_BITS` are the f32 bit patterns also used by the CPU
/// reference ([`crate::index_k::INV_E4M3_MAX`], [`crate::index_k::AMAX_FLOOR`]).
pub const SOURCE: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;

#define COPY_UNROLL 4
#define FLAT_UNROLL 8
#define QUANT_TPW 8
#define INV448_BITS 0x3b124925u
#define AMAX_FLOOR_BITS 0x38d1b717u

struct SideParams {
    u64 base;
    u64 layer_stride;
    u64 page_stride;
    u64 item_stride;
    u64 index_limit;
};

struct CopyParams {
    SideParams src;
    SideParams dst;
    u64 item_bytes;
    u64 items_per_page;
    u64 layer_begin;
    u64 layer_count;
    u64 n_items;
    u64 total_vectors;
    u64 group_items;
    u64 self_check;
};

struct IndexKParams {
    u64 base;
    u64 page_stride;
    u64 page_size_tokens;
    u64 slot_limit;
    u64 ue8m0;
};

extern "C" __global__ void validate_index_lists(
    const u64* __restrict__ a, const u64* __restrict__ b, u64 n,
    u64 a_limit, u64 b_limit, unsigned long long* err)
{
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (a[i] >= a_limit || b[i] >= b_limit) {
            atomicAdd(&err[0], 1ull);
            atomicMax(&err[1], ~(unsigned long long)i);
        }
    }
}

template <typename V, typename I>
__device__ __forceinline__ void copy_items_body(
    const CopyParams& p, const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
    const u64* __restrict__ src_idx, const u64* __restrict__ dst_idx, unsigned long long* err)
{
    if (*((volatile const u64*)err) != 0) return;
    if (p.self_check) {
        // Short lists: every block checks every index itself before writing anything, so no
        // separate validation launch is needed; block 0 records the error.
        int bad = 0;
        for (u64 i = threadIdx.x; i < p.n_items; i += blockDim.x) {
            bad |= (src_idx[i] >= p.src.index_limit) | (dst_idx[i] >= p.dst.index_limit);
        }
        if (__syncthreads_or(bad)) {
            if (blockIdx.x == 0) {
                for (u64 i = threadIdx.x; i < p.n_items; i += blockDim.x) {
                    if (src_idx[i] >= p.src.index_limit || dst_idx[i] >= p.dst.index_limit) {
                        atomicAdd(&err[0], 1ull);
                        atomicMax(&err[1], ~(unsigned long long)i);
                    }
                }
            }
            return;
        }
    }
    const I vpi = (I)(p.item_bytes / sizeof(V));
    const I ipp = (I)p.items_per_page;
    const I total = (I)p.total_vectors;
    const I group = (I)p.group_items;
    const I layers = (I)p.layer_count;
    const I stride = (I)gridDim.x * (I)blockDim.x;
    for (I first = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; first < total;
         first += stride * (I)COPY_UNROLL) {
        V buf[COPY_UNROLL];
        u64 doff[COPY_UNROLL];
#pragma unroll
        for (int k = 0; k < COPY_UNROLL; ++k) {
            const I g = first + (I)k * stride;
            if (g < total) {
                const I v = g % vpi;
                const I rest = g / vpi;
                // Work order: chunks of `group` list positions; inside a chunk, layer by
                // layer. group == n_items: layer-outer; group == 1: layer-inner.
                const I chunk = rest / (layers * group);
                const I in_chunk = rest % (layers * group);
                const I item = chunk * group + in_chunk % group;
                const u64 layer = p.layer_begin + (u64)(in_chunk / group);
                const I si = (I)src_idx[item];
                const I di = (I)dst_idx[item];
                const u64 so = p.src.base + layer * p.src.layer_stride
                    + (u64)(si / ipp) * p.src.page_stride + (u64)(si % ipp) * p.src.item_stride
                    + (u64)v * sizeof(V);
                doff[k] = p.dst.base + layer * p.dst.layer_stride
                    + (u64)(di / ipp) * p.dst.page_stride + (u64)(di % ipp) * p.dst.item_stride
                    + (u64)v * sizeof(V);
                buf[k] = *reinterpret_cast<const V*>(src + so);
            }
        }
#pragma unroll
        for (int k = 0; k < COPY_UNROLL; ++k) {
            if (first + (I)k * stride < total) {
                *reinterpret_cast<V*>(dst + doff[k]) = buf[k];
            }
        }
    }
}

#define COPY_KERNEL(NAME, V, I)                                                              \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                  \
        const CopyParams p, const unsigned char* src, unsigned char* dst,                    \
        const u64* src_idx, const u64* dst_idx, unsigned long long* err)                     \
    {                                                                                        \
        copy_items_body<V, I>(p, src, dst, src_idx, dst_idx, err);                           \
    }

COPY_KERNEL(copy_items_v16_u32, uint4, u32)
COPY_KERNEL(copy_items_v16_u64, uint4, u64)
COPY_KERNEL(copy_items_v8_u32, uint2, u32)
COPY_KERNEL(copy_items_v8_u64, uint2, u64)
COPY_KERNEL(copy_items_v4_u32, unsigned int, u32)
COPY_KERNEL(copy_items_v4_u64, unsigned int, u64)
COPY_KERNEL(copy_items_v2_u32, unsigned short, u32)
COPY_KERNEL(copy_items_v2_u64, unsigned short, u64)
COPY_KERNEL(copy_items_v1_u32, unsigned char, u32)
COPY_KERNEL(copy_items_v1_u64, unsigned char, u64)

// Where vector `g` of part `p` goes: the same work order and address formula as copy_items_body.
template <typename V>
__device__ __forceinline__ void locate(
    const CopyParams& p, u64 g, const u64* __restrict__ src_idx, const u64* __restrict__ dst_idx,
    u64& so, u64& doff)
{
    const u64 vpi = p.item_bytes / sizeof(V);
    const u64 v = g % vpi;
    const u64 rest = g / vpi;
    const u64 chunk = rest / (p.layer_count * p.group_items);
    const u64 in_chunk = rest % (p.layer_count * p.group_items);
    const u64 item = chunk * p.group_items + in_chunk % p.group_items;
    const u64 layer = p.layer_begin + in_chunk / p.group_items;
    const u64 si = src_idx[item];
    const u64 di = dst_idx[item];
    so = p.src.base + layer * p.src.layer_stride + (si / p.items_per_page) * p.src.page_stride
        + (si % p.items_per_page) * p.src.item_stride + v * sizeof(V);
    doff = p.dst.base + layer * p.dst.layer_stride + (di / p.items_per_page) * p.dst.page_stride
        + (di % p.items_per_page) * p.dst.item_stride + v * sizeof(V);
}

// Two parts driven by the same index lists (index-K values and scales of a section_major
// token) in one launch: vectors 0 .. a.total_vectors are part a's, the rest part b's. The
// lists are checked once (part a's limits; the host checked that both parts share them).
template <typename V>
__device__ __forceinline__ void copy_two_parts_body(
    const CopyParams& a, const CopyParams& b, const unsigned char* __restrict__ src,
    unsigned char* __restrict__ dst, const u64* __restrict__ src_idx,
    const u64* __restrict__ dst_idx, unsigned long long* err)
{
    if (*((volatile const u64*)err) != 0) return;
    if (a.self_check) {
        int bad = 0;
        for (u64 i = threadIdx.x; i < a.n_items; i += blockDim.x) {
            bad |= (src_idx[i] >= a.src.index_limit) | (dst_idx[i] >= a.dst.index_limit);
        }
        if (__syncthreads_or(bad)) {
            if (blockIdx.x == 0) {
                for (u64 i = threadIdx.x; i < a.n_items; i += blockDim.x) {
                    if (src_idx[i] >= a.src.index_limit || dst_idx[i] >= a.dst.index_limit) {
                        atomicAdd(&err[0], 1ull);
                        atomicMax(&err[1], ~(unsigned long long)i);
                    }
                }
            }
            return;
        }
    }
    const u64 total = a.total_vectors + b.total_vectors;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x; first < total;
         first += stride * COPY_UNROLL) {
        V buf[COPY_UNROLL];
        u64 doff[COPY_UNROLL];
#pragma unroll
        for (int k = 0; k < COPY_UNROLL; ++k) {
            const u64 g = first + (u64)k * stride;
            if (g < total) {
                u64 so;
                if (g < a.total_vectors) {
                    locate<V>(a, g, src_idx, dst_idx, so, doff[k]);
                } else {
                    locate<V>(b, g - a.total_vectors, src_idx, dst_idx, so, doff[k]);
                }
                buf[k] = *reinterpret_cast<const V*>(src + so);
            }
        }
#pragma unroll
        for (int k = 0; k < COPY_UNROLL; ++k) {
            if (first + (u64)k * stride < total) {
                *reinterpret_cast<V*>(dst + doff[k]) = buf[k];
            }
        }
    }
}

#define COPY_TWO_PARTS_KERNEL(NAME, V)                                                       \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                  \
        const CopyParams a, const CopyParams b, const unsigned char* src, unsigned char* dst, \
        const u64* src_idx, const u64* dst_idx, unsigned long long* err)                     \
    {                                                                                        \
        copy_two_parts_body<V>(a, b, src, dst, src_idx, dst_idx, err);                       \
    }

COPY_TWO_PARTS_KERNEL(copy_two_parts_v16, uint4)
COPY_TWO_PARTS_KERNEL(copy_two_parts_v8, uint2)
COPY_TWO_PARTS_KERNEL(copy_two_parts_v4, unsigned int)
COPY_TWO_PARTS_KERNEL(copy_two_parts_v2, unsigned short)
COPY_TWO_PARTS_KERNEL(copy_two_parts_v1, unsigned char)

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

// Runs of one length, `vpr` 16-byte vectors each (every offset and both bases 16-byte
// aligned; checked on the host), flattened: thread t of the grid copies vectors t, t + G,
// t + 2G, ... of the list's n * vpr vectors (G threads in the grid), FLAT_UNROLL loads in
// flight before its stores, so a warp reads 512 contiguous bytes of one run (or of two
// neighbouring runs) and every lane is busy whatever the run length. The token-granular path
// (a token of one layer per run: 2,048 B for Llama-3.1-8B's K or V in bf16, 1,152 B for an MLA
// latent). The lists are checked before the launch (on the host, or by validate_runs on the
// stream); this kernel only reads the error record.
extern "C" __global__ void __launch_bounds__(256, 4) copy_runs_uniform(
    const Run* __restrict__ runs, u64 n, u64 vpr, const unsigned char* src, unsigned char* dst,
    unsigned long long* err)
{
    if (*((volatile const u64*)err) != 0) return;
    const u32 v_per_run = (u32)vpr;
    const u32 total = (u32)(n * vpr);
    const u32 stride = gridDim.x * blockDim.x;
    for (u32 first = blockIdx.x * blockDim.x + threadIdx.x; first < total;
         first += stride * FLAT_UNROLL) {
        uint4 buf[FLAT_UNROLL];
        uint4* to[FLAT_UNROLL];
#pragma unroll
        for (int k = 0; k < FLAT_UNROLL; ++k) {
            const u32 g = first + (u32)k * stride;
            if (g < total) {
                const u32 r = g / v_per_run;
                const u32 v = g - r * v_per_run;
                const u64 so = runs[r].src;
                const u64 dof = runs[r].dst;
                buf[k] = reinterpret_cast<const uint4*>(src + so)[v];
                to[k] = reinterpret_cast<uint4*>(dst + dof) + v;
            }
        }
#pragma unroll
        for (int k = 0; k < FLAT_UNROLL; ++k) {
            if (first + (u32)k * stride < total) *to[k] = buf[k];
        }
    }
}

// Two f32 -> two e4m3 (round to nearest even, saturating to +-448); `lo` lands in the low byte.
__device__ __forceinline__ u32 e4m3x2(float hi, float lo)
{
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return (u32)r;
}

// DeepSeek-V3.2 `fast_round_scale`: 2^ceil(log2(x)) by exponent arithmetic.
__device__ __forceinline__ float round_scale_ue8m0(float x)
{
    const u32 bits = __float_as_uint(x);
    const int e = (int)((bits >> 23) & 0xFFu) - 127 + ((bits & 0x7FFFFFu) != 0 ? 1 : 0);
    return __uint_as_float((u32)(e + 127) << 23);
}

// clamp(x / s, -448, 448) with x / s correctly rounded: q = RN(x r), rem = x - s q (exact by
// FMA), q' = RN(q + rem r), with r = RN(1 / s). By Markstein's theorem q' = RN(x / s) (r within
// half an ulp of 1/s, q within one ulp of x/s; no overflow or underflow for these operands).
__device__ __forceinline__ float quant_one(float x, float s, float r)
{
    const float q = __fmul_rn(x, r);
    const float rem = __fmaf_rn(-q, s, x);
    const float y = __fmaf_rn(rem, r, q);
    return fminf(fmaxf(y, -448.0f), 448.0f);
}

extern "C" __global__ void __launch_bounds__(256) quantize_index_k(
    const IndexKParams p, const unsigned short* __restrict__ keys, u64 tokens,
    const u64* __restrict__ slots, unsigned char* __restrict__ cache, const u64* err)
{
    // A half-warp per token: lane `hl` of the half holds elements 8 hl .. 8 hl + 8 (one 16-byte
    // load) and stores their 8 e4m3 bytes; each warp loads QUANT_TPW tokens before converting.
    if (*((volatile const u64*)err) != 0) return;
    const u32 lane = threadIdx.x & 31u;
    const u32 half = lane >> 4;
    const u32 hl = lane & 15u;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    const float inv448 = __uint_as_float(INV448_BITS);
    const float floor_amax = __uint_as_float(AMAX_FLOOR_BITS);
    for (u64 t0 = warp * QUANT_TPW; t0 < tokens; t0 += warps * QUANT_TPW) {
        uint4 raw[QUANT_TPW / 2];
        u64 slot[QUANT_TPW / 2];
#pragma unroll
        for (int k = 0; k < QUANT_TPW / 2; ++k) {
            const u64 t = t0 + 2 * k + half;
            if (t < tokens) {
                raw[k] = reinterpret_cast<const uint4*>(keys + t * 128)[hl];
                slot[k] = slots[t];
            } else {
                raw[k] = make_uint4(0u, 0u, 0u, 0u);
                slot[k] = 0;
            }
        }
#pragma unroll
        for (int k = 0; k < QUANT_TPW / 2; ++k) {
            const u64 t = t0 + 2 * k + half;
            const u32 w[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
            float x[8];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                x[2 * j] = __uint_as_float(w[j] << 16);
                x[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
            }
            float a = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; ++j) a = fmaxf(a, fabsf(x[j]));
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) {
                a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, off));
            }
            a = fmaxf(a, floor_amax);
            float s = __fmul_rn(a, inv448);
            if (p.ue8m0) s = round_scale_ue8m0(s);
            const float r = __frcp_rn(s);
            if (t < tokens) {
                u32 q[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    q[j] = e4m3x2(quant_one(x[2 * j + 1], s, r), quant_one(x[2 * j], s, r));
                }
                const u32 lo = q[0] | (q[1] << 16);
                const u32 hi = q[2] | (q[3] << 16);
                const u64 page = slot[k] / p.page_size_tokens;
                const u64 tok = slot[k] % p.page_size_tokens;
                unsigned char* pg = cache + p.base + page * p.page_stride;
                unsigned char* v = pg + tok * 128 + hl * 8;
                if ((reinterpret_cast<u64>(v) & 7u) == 0) {
                    *reinterpret_cast<uint2*>(v) = make_uint2(lo, hi);
                } else {
                    reinterpret_cast<u32*>(v)[0] = lo;
                    reinterpret_cast<u32*>(v)[1] = hi;
                }
                if (hl == 0) {
                    *reinterpret_cast<float*>(pg + p.page_size_tokens * 128 + tok * 4) = s;
                }
            }
        }
    }
}

__device__ __forceinline__ float e4m3_to_f32(u32 b)
{
    const u32 e = (b >> 3) & 0xFu;
    const u32 m = b & 7u;
    float v;
    if (e == 0xFu && m == 7u) {
        v = __uint_as_float(0x7FC00000u);
    } else if (e == 0u) {
        v = (float)m * 0.001953125f; // m * 2^-9
    } else {
        v = __uint_as_float(((e + 120u) << 23) | (m << 20));
    }
    return (b & 0x80u) ? -v : v;
}

extern "C" __global__ void __launch_bounds__(256) dequantize_index_k(
    const IndexKParams p, const unsigned char* __restrict__ cache, u64 tokens,
    const u64* __restrict__ slots, float* __restrict__ out, const u64* err)
{
    if (*((volatile const u64*)err) != 0) return;
    const u32 lane = threadIdx.x & 31u;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 t = warp; t < tokens; t += warps) {
        const u64 s_ = slots[t];
        const u64 page = s_ / p.page_size_tokens;
        const u64 tok = s_ % p.page_size_tokens;
        const unsigned char* pg = cache + p.base + page * p.page_stride;
        const u32 q = reinterpret_cast<const u32*>(pg + tok * 128)[lane];
        const float s = *reinterpret_cast<const float*>(pg + p.page_size_tokens * 128 + tok * 4);
        float4 r;
        r.x = __fmul_rn(e4m3_to_f32(q & 0xFFu), s);
        r.y = __fmul_rn(e4m3_to_f32((q >> 8) & 0xFFu), s);
        r.z = __fmul_rn(e4m3_to_f32((q >> 16) & 0xFFu), s);
        r.w = __fmul_rn(e4m3_to_f32(q >> 24), s);
        reinterpret_cast<float4*>(out + t * 128)[lane] = r;
    }
}
"#;
