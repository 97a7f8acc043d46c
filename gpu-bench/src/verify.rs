//! `gpu_bench --overlap --verify`: a load verified on the device, layer by layer, by the page
//! checksum (`kvlayout.checksum/v1`, [`kvlayout_kernels::checksum_gpu`]) or by the peer, SGLang's
//! Adler-32 GPU checksum (sglang #39500, `jit_kernel` `adler32_checksum.cuh`: one thread per
//! item reading it with 16-byte loads into a sum and a position-weighted sum, an ordered
//! combine across the block, one state per block, one block combining the states in order;
//! rewritten here from its description, [`ADLER_SOURCE`]).
//!
//! Each layer's checksum runs on a stream of its own once that layer's copy has ended (an
//! event), so the copy of the next layer goes on beside it; the window ends when the last
//! layer is verified. The kvlayout verification compares each page with the checksum recorded
//! at backup (computed here on the CPU from the host pool) on the device and counts
//! mismatches; the peer computes one Adler-32 per layer over its pages in order (SGLang's
//! `adler32_strided_checksum`), not read back (SGLang reads it with `.item()`, a sync).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use kvlayout_core::PoolGeometry;
use kvlayout_core::checksum::page_checksum;
use kvlayout_kernels::checksum_gpu::{ChecksumJob, ChecksumKernels, ChecksumLaunch};
use kvlayout_kernels::{Gpu, KernelError};

use crate::paths::Path;
use crate::report;
use crate::workload::{Call, Shape};

/// SGLang's Adler-32 GPU checksum algorithm (sglang #39500): `adler_items` gives each thread
/// one item (a page of one buffer), read with 16-byte loads (bytes before the first 16-byte
/// boundary and after the last one singly) into `A = 1 + sum(bytes)` and
/// `B = n + sum((n - i) * byte_i)` modulo 65521, then combines the block's states in thread
/// order (`A = A_l + A_r - 1`, `B = B_l + B_r + len_r * (A_l - 1)`) into one state per block
/// (SGLang's blocks of 256 threads); the grid may be smaller than the items (an SM budget),
/// then each block takes the next group of 256 items in rounds, its states still in item
/// order. `adler_reduce` (one block) combines the states in order into `(B << 16) | A`.
pub const ADLER_SOURCE: &str = r#"
typedef unsigned long long u64;
#define MOD_ADLER 65521ull
struct St { u64 a; u64 b; u64 len; };
struct alignas(16) v4 { unsigned x, y, z, w; };

__device__ __forceinline__ St identity() { St s; s.a = 1; s.b = 0; s.len = 0; return s; }

__device__ St adler_compute(const unsigned char* p, u64 n) {
    u64 sum = 0, weighted = 0, off = 0;
    while (off < n && (((u64)(p + off)) & 15) != 0) {
        const u64 v = p[off]; sum += v; weighted += (n - off) * v; ++off;
    }
    const v4* vec = (const v4*)(p + off);
    const u64 nv = (n - off) / 16;
    for (u64 i = 0; i < nv; ++i) {
        const v4 val = vec[i];
        const unsigned w[4] = {val.x, val.y, val.z, val.w};
        u64 ws[4], within = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u64 x0 = w[k] & 0xff, x1 = (w[k] >> 8) & 0xff, x2 = (w[k] >> 16) & 0xff, x3 = w[k] >> 24;
            ws[k] = x0 + x1 + x2 + x3;
            within += 3 * x0 + 2 * x1 + x2;
        }
        const u64 vs = ws[0] + ws[1] + ws[2] + ws[3];
        within += 12 * ws[0] + 8 * ws[1] + 4 * ws[2];
        sum += vs;
        weighted += (n - (off + i * 16) - 15) * vs + within;
        if ((i & 4095) == 4095) { sum %= MOD_ADLER; weighted %= MOD_ADLER; }
    }
    off += nv * 16;
    while (off < n) { const u64 v = p[off]; sum += v; weighted += (n - off) * v; ++off; }
    St s; s.a = (1 + sum) % MOD_ADLER; s.b = (n % MOD_ADLER + weighted) % MOD_ADLER; s.len = n;
    return s;
}

__device__ __forceinline__ St combine(St l, St r) {
    St s;
    s.a = (l.a + r.a + MOD_ADLER - 1) % MOD_ADLER;
    s.b = (l.b + r.b + (r.len % MOD_ADLER) * ((l.a + MOD_ADLER - 1) % MOD_ADLER)) % MOD_ADLER;
    s.len = l.len + r.len;
    return s;
}

__device__ __forceinline__ St shfl_down(St s, unsigned d) {
    St r;
    r.a = __shfl_down_sync(0xffffffffu, s.a, d);
    r.b = __shfl_down_sync(0xffffffffu, s.b, d);
    r.len = __shfl_down_sync(0xffffffffu, s.len, d);
    return r;
}

// The block's states combined in thread order, in thread 0. Threads past the items hold the
// identity (it combines to nothing on either side).
__device__ St block_reduce(St s, St* sm) {
    const unsigned lane = threadIdx.x & 31, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (unsigned d = 1; d < 32; d *= 2) {
        const St r = shfl_down(s, d);
        if (lane + d < 32) s = combine(s, r);
    }
    if (lane == 0) sm[warp] = s;
    __syncthreads();
    if (warp == 0) {
        s = lane < warps ? sm[lane] : identity();
        for (unsigned d = 1; d < 32; d *= 2) {
            const St r = shfl_down(s, d);
            if (lane + d < 32) s = combine(s, r);
        }
    }
    __syncthreads();
    return s;
}

extern "C" __global__ void adler_items(const u64* ptrs, const unsigned* lens, u64 items, St* states) {
    __shared__ St sm[32];
    const u64 per_round = (u64)gridDim.x * blockDim.x;
    const u64 rounds = (items + per_round - 1) / per_round;
    for (u64 r = 0; r < rounds; ++r) {
        const u64 slot = r * gridDim.x + blockIdx.x;
        const u64 i = slot * blockDim.x + threadIdx.x;
        St s = i < items ? adler_compute((const unsigned char*)ptrs[i], lens[i]) : identity();
        s = block_reduce(s, sm);
        if (threadIdx.x == 0) states[slot] = s;
    }
}

extern "C" __global__ void adler_reduce(const St* states, u64 n, u64* out) {
    __shared__ St sm[32];
    const u64 per = (n + blockDim.x - 1) / blockDim.x;
    St s = identity();
    for (u64 i = threadIdx.x * per; i < n && i < (threadIdx.x + 1) * per; ++i) s = combine(s, states[i]);
    s = block_reduce(s, sm);
    if (threadIdx.x == 0) out[0] = (s.b << 16) | s.a;
}
"#;

/// SGLang's block size for the Adler-32 kernels.
const ADLER_THREADS: u32 = 256;

/// Who verifies a load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verifier {
    /// The kvlayout page checksum at this launch (its blocks the SM budget), each page
    /// compared on the device with its recorded checksum.
    Kvlayout(ChecksumLaunch),
    /// SGLang's Adler-32 on this many blocks of 256 threads (`None`: its own launch, one
    /// block per 256 items).
    Adler32(Option<u32>),
}

impl Verifier {
    pub fn label(self) -> String {
        match self {
            Verifier::Kvlayout(l) => format!(
                "kvlayout checksum/v1 on {} block(s) of {}",
                l.blocks, l.threads_per_block
            ),
            Verifier::Adler32(None) => {
                "SGLang Adler-32 (its launch: a 256-thread block per 256 pages)".into()
            }
            Verifier::Adler32(Some(b)) => format!("SGLang Adler-32 on {b} block(s) of 256"),
        }
    }
}

/// The kernels of [`ADLER_SOURCE`] from its loaded module: `adler_items`, `adler_reduce`.
pub fn adler_kernels(
    module: &Arc<cudarc::driver::CudaModule>,
) -> Result<(CudaFunction, CudaFunction), KernelError> {
    let f = |n| module.load_function(n).map_err(drv("cuModuleGetFunction"));
    Ok((f("adler_items")?, f("adler_reduce")?))
}

/// The `--hold` phases of `--verify`, in order: GEMM only, memcpy, the chooser, the load
/// verified by kvlayout at several launches (blocks of fewer threads share an SM with the split
/// load's copy blocks) and by the peer, then back (a drift over the run weighs on both sides).
pub fn hold_phases() -> Vec<Option<Path>> {
    let kvl = |blocks, threads_per_block| {
        Some(Path::Verified(Verifier::Kvlayout(ChecksumLaunch {
            blocks,
            threads_per_block,
        })))
    };
    vec![
        None,
        Some(Path::Memcpy),
        Some(Path::Auto),
        kvl(2, 1024),
        kvl(2, 512),
        kvl(4, 256),
        kvl(2, 256),
        kvl(16, 256),
        Some(Path::Verified(Verifier::Adler32(None))),
        kvl(4, 256),
        kvl(2, 512),
        Some(Path::Auto),
        Some(Path::Memcpy),
        None,
    ]
}

/// One buffer's pages of one layer's load.
struct BufferPlan {
    offsets: CudaSlice<u64>,
    pages: u64,
    payload_bytes: u64,
    token_fingerprint: u64,
    layer_id: u64,
    expected: CudaSlice<u64>,
    out: CudaSlice<u64>,
}

/// What verifies one call (one layer) of a load.
struct CallPlan {
    buffers: Vec<BufferPlan>,
    adler_ptrs: CudaSlice<u64>,
    adler_lens: CudaSlice<u32>,
    items: u64,
    /// The last call of its shape: the window joins the verify stream after it.
    last: bool,
}

/// The verification of the loads of `gpu_bench --overlap --verify`.
pub struct Verify {
    stream: Arc<CudaStream>,
    kernels: ChecksumKernels,
    adler_items: CudaFunction,
    adler_reduce: CudaFunction,
    /// By the device offset of the call's first run.
    plans: HashMap<u64, CallPlan>,
    /// Adler-32 block states (3 words each) and result.
    states: CudaSlice<u64>,
    result: CudaSlice<u64>,
    mismatches: CudaSlice<u64>,
    /// Pages checksummed by kvlayout since the last [`Verify::take_counts`].
    pages: u64,
    /// The device pool's address (the plans' page offsets count from it).
    dev_address: u64,
}

fn drv(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> KernelError {
    move |e| KernelError::Driver {
        call,
        message: format!("{e:?}"),
    }
}

fn ev(gpu: &Gpu) -> Result<CudaEvent, KernelError> {
    gpu.context()
        .new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .map_err(drv("cuEventCreate"))
}

impl Verify {
    /// Plans the verification of every call of the loads in `shapes` (device pool `dev_pool`
    /// at `dev_address`, host pool bytes `host`): the pages each call writes (its runs'
    /// destinations), their seeds, and the checksum each page had on the host (the one a
    /// backup records).
    pub fn new(
        gpu: &Gpu,
        shapes: &[Shape],
        dev_pool: &PoolGeometry,
        dev_address: u64,
        host: &[u8],
        adler: (CudaFunction, CudaFunction),
    ) -> Result<Verify, KernelError> {
        let kernels = ChecksumKernels::new(gpu).map_err(|e| KernelError::Driver {
            call: "checksum kernel",
            message: e.to_string(),
        })?;
        let stream = gpu.context().new_stream().map_err(drv("cuStreamCreate"))?;
        let mut plans = HashMap::new();
        let mut most_items = 0u64;
        for shape in shapes.iter().filter(|s| s.h2d && !s.token_granular) {
            for (ci, call) in shape.calls.iter().enumerate() {
                let plan = plan_call(&stream, dev_pool, dev_address, host, call)?;
                most_items = most_items.max(plan.items);
                let key = call.runs[0].dst_offset_bytes;
                plans.insert(
                    key,
                    CallPlan {
                        last: ci + 1 == shape.calls.len(),
                        ..plan
                    },
                );
            }
        }
        let slots = most_items.div_ceil(u64::from(ADLER_THREADS)) as usize + 1;
        Ok(Verify {
            states: stream.alloc_zeros(3 * slots).map_err(drv("cuMemAlloc"))?,
            result: stream.alloc_zeros(1).map_err(drv("cuMemAlloc"))?,
            mismatches: stream.alloc_zeros(1).map_err(drv("cuMemAlloc"))?,
            stream,
            kernels,
            adler_items: adler.0,
            adler_reduce: adler.1,
            plans,
            pages: 0,
            dev_address,
        })
    }

    /// Enqueues the verification of `call` (whose copy was just enqueued on `gpu`'s stream)
    /// on the verify stream, after that copy; after the last call of its shape, `gpu`'s stream
    /// waits for the verify stream (the window ends verified).
    pub fn enqueue_after(
        &mut self,
        gpu: &Gpu,
        call: &Call,
        v: Verifier,
    ) -> Result<(), KernelError> {
        let copied = ev(gpu)?;
        copied.record(gpu.stream()).map_err(drv("cuEventRecord"))?;
        self.stream
            .wait(&copied)
            .map_err(drv("cuStreamWaitEvent"))?;
        let last = self.enqueue(call.runs[0].dst_offset_bytes, v)?;
        if last {
            let done = ev(gpu)?;
            done.record(&self.stream).map_err(drv("cuEventRecord"))?;
            gpu.stream().wait(&done).map_err(drv("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    /// Enqueues the verification of the call planned under `key` on the verify stream;
    /// whether it is the last call of its shape.
    fn enqueue(&mut self, key: u64, v: Verifier) -> Result<bool, KernelError> {
        let plan = self.plans.get_mut(&key).ok_or_else(|| {
            KernelError::Unsupported("a call the verify plan does not know".into())
        })?;
        let s = &self.stream;
        match v {
            Verifier::Kvlayout(launch) => {
                let (mismatches, _gm) = self.mismatches.device_ptr_mut(s);
                for b in &mut plan.buffers {
                    let (offsets_address, _g1) = b.offsets.device_ptr(s);
                    let (expected_address, _g2) = b.expected.device_ptr(s);
                    let (out_address, _g3) = b.out.device_ptr_mut(s);
                    let job = ChecksumJob {
                        data_address: self.dev_address,
                        offsets_address,
                        pages: b.pages,
                        payload_bytes: b.payload_bytes,
                        token_fingerprint: b.token_fingerprint,
                        layer_id: b.layer_id,
                        out_address,
                        expected_address,
                        mismatches_address: mismatches,
                    };
                    // SAFETY: the offsets are the call's device destinations inside the device
                    // pool (planned from its runs, checked by the copy); the plan's buffers
                    // hold `pages` words each; the counter is one word.
                    unsafe { self.kernels.enqueue(s, &job, launch) }.map_err(|e| {
                        KernelError::Driver {
                            call: "kvl_checksum_pages",
                            message: e.to_string(),
                        }
                    })?;
                    self.pages += b.pages;
                }
            }
            Verifier::Adler32(blocks) => {
                let own = plan.items.div_ceil(u64::from(ADLER_THREADS)).max(1) as u32;
                adler_enqueue(
                    s,
                    (&self.adler_items, &self.adler_reduce),
                    plan,
                    blocks.unwrap_or(own),
                    &mut self.states,
                    &mut self.result,
                )?;
            }
        }
        Ok(plan.last)
    }

    /// The verification alone (no copy beside it) of every call of `shape` by `v`: median
    /// milliseconds of 5 after a warm-up, CUDA events on the verify stream.
    fn alone_ms(&mut self, gpu: &Gpu, shape: &Shape, v: Verifier) -> Result<f64, KernelError> {
        let timed = |gpu: &Gpu| {
            gpu.context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(drv("cuEventCreate"))
        };
        let mut times = Vec::new();
        for i in 0..6 {
            let (a, b) = (timed(gpu)?, timed(gpu)?);
            a.record(&self.stream).map_err(drv("cuEventRecord"))?;
            for call in &shape.calls {
                self.enqueue(call.runs[0].dst_offset_bytes, v)?;
            }
            b.record(&self.stream).map_err(drv("cuEventRecord"))?;
            self.stream
                .synchronize()
                .map_err(drv("cuStreamSynchronize"))?;
            if i > 0 {
                times.push(f64::from(
                    a.elapsed_ms(&b).map_err(drv("cuEventElapsedTime"))?,
                ));
            }
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// After a load of `shape` (the device pool holds the pages): the peer's Adler-32 of its
    /// first layer against the `adler2` crate's, then each verifier timed alone over the whole
    /// load (every page of every layer, both buffers; no copy beside it), the kvlayout ones
    /// counting mismatches against the recorded checksums on the device. Prints a line each.
    pub fn report_alone(
        &mut self,
        gpu: &Gpu,
        shape: &Shape,
        host: &[u8],
    ) -> Result<(), KernelError> {
        let (got, want) = self.check_adler(shape, host)?;
        println!(
            "VERIFY {} | SGLang Adler-32 of layer 0 on the device {got:#010x}, adler2 on the host bytes {want:#010x}: {}",
            shape.name,
            if got == want { "equal" } else { "DIFFERENT" }
        );
        let launch = |blocks, threads_per_block| {
            Verifier::Kvlayout(ChecksumLaunch {
                blocks,
                threads_per_block,
            })
        };
        for ver in [
            launch(1, 1024),
            launch(2, 1024),
            launch(4, 1024),
            launch(gpu.sm_count(), 1024),
            launch(2, 512),
            launch(4, 256),
            Verifier::Adler32(None),
            Verifier::Adler32(Some(1)),
            Verifier::Adler32(Some(2)),
            Verifier::Adler32(Some(8)),
        ] {
            let ms = self.alone_ms(gpu, shape, ver)?;
            let (pages, bad) = self.take_counts()?;
            println!(
                "VERIFY ALONE {} | {} | {ms:.3} ms, {:.1} GB/s of payload | {pages} pages checked on the device, {bad} mismatched",
                shape.name,
                ver.label(),
                report::gbps(shape.bytes(), ms),
            );
        }
        Ok(())
    }

    /// The peer's Adler-32 of the first call of `shape` (its pages in order, as loaded) on
    /// the device against the `adler2` crate's on the host bytes the pages were copied from;
    /// run after a load of `shape`.
    fn check_adler(&mut self, shape: &Shape, host: &[u8]) -> Result<(u32, u32), KernelError> {
        let call = &shape.calls[0];
        self.enqueue(call.runs[0].dst_offset_bytes, Verifier::Adler32(None))?;
        let got = self
            .stream
            .clone_dtoh(&self.result)
            .map_err(drv("cuMemcpyDtoH"))?[0] as u32;
        let mut a = adler2::Adler32::new();
        // The plan's order: buffer by buffer, each in run order.
        for b in 0..2u64 {
            let len = if b == 0 {
                call.runs.iter().map(|r| r.len_bytes).max()
            } else {
                call.runs.iter().map(|r| r.len_bytes).min()
            };
            for r in call.runs.iter().filter(|r| Some(r.len_bytes) == len) {
                let s = r.src_offset_bytes as usize;
                a.write_slice(&host[s..s + r.len_bytes as usize]);
            }
        }
        Ok((got, a.checksum()))
    }

    /// Pages checksummed by kvlayout and mismatches counted since the last call (waits for
    /// the verify stream); resets both.
    pub fn take_counts(&mut self) -> Result<(u64, u64), KernelError> {
        let bad = self
            .stream
            .clone_dtoh(&self.mismatches)
            .map_err(drv("cuMemcpyDtoH"))?[0];
        self.stream
            .memset_zeros(&mut self.mismatches)
            .map_err(drv("cuMemsetD8"))?;
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        let pages = std::mem::take(&mut self.pages);
        Ok((pages, bad))
    }
}

/// The plan of one call: its runs grouped by buffer (their length), each group's buffer and
/// layer found from the device pool's layout, every page's recorded checksum computed from the
/// host bytes the run copies.
fn plan_call(
    stream: &Arc<CudaStream>,
    dev_pool: &PoolGeometry,
    dev_address: u64,
    host: &[u8],
    call: &Call,
) -> Result<CallPlan, KernelError> {
    let mut buffers = Vec::new();
    let mut ptrs = Vec::new();
    let mut lens = Vec::new();
    for b in 0..dev_pool.buffers.len() {
        let key0 = dev_pool.page_checksum_key(b, 0)?;
        let runs: Vec<_> = call
            .runs
            .iter()
            .filter(|r| r.len_bytes == key0.payload_bytes)
            .collect();
        let Some(first) = runs.first() else { continue };
        let layer = (0..dev_pool.buffers[b].layers)
            .find(|&l| {
                let start = dev_pool.page_offset_bytes(b, l, 0).unwrap_or(u64::MAX);
                let end = dev_pool
                    .page_offset_bytes(b, l, dev_pool.pages - 1)
                    .unwrap_or(0)
                    + key0.payload_bytes;
                (start..end).contains(&first.dst_offset_bytes)
            })
            .ok_or_else(|| KernelError::Unsupported("a run outside every layer".into()))?;
        let key = dev_pool.page_checksum_key(b, layer)?;
        let offsets: Vec<u64> = runs.iter().map(|r| r.dst_offset_bytes).collect();
        let expected: Vec<u64> = runs
            .iter()
            .map(|r| {
                let s = r.src_offset_bytes as usize;
                page_checksum(
                    key.token_fingerprint,
                    key.layer_id,
                    &host[s..s + r.len_bytes as usize],
                )
            })
            .collect();
        for r in &runs {
            ptrs.push(dev_address + r.dst_offset_bytes);
            lens.push(r.len_bytes as u32);
        }
        buffers.push(BufferPlan {
            pages: offsets.len() as u64,
            offsets: stream.clone_htod(&offsets).map_err(drv("cuMemcpyHtoD"))?,
            payload_bytes: key.payload_bytes,
            token_fingerprint: key.token_fingerprint,
            layer_id: key.layer_id,
            expected: stream.clone_htod(&expected).map_err(drv("cuMemcpyHtoD"))?,
            out: stream
                .alloc_zeros(offsets.len())
                .map_err(drv("cuMemAlloc"))?,
        });
    }
    Ok(CallPlan {
        buffers,
        items: ptrs.len() as u64,
        adler_ptrs: stream.clone_htod(&ptrs).map_err(drv("cuMemcpyHtoD"))?,
        adler_lens: stream.clone_htod(&lens).map_err(drv("cuMemcpyHtoD"))?,
        last: false,
    })
}

/// Enqueues SGLang's two Adler-32 launches over `plan`'s items on `s`: `blocks` blocks of 256
/// threads (SGLang's launch: one per 256 items), then one block of 256 combining the states.
fn adler_enqueue(
    s: &Arc<CudaStream>,
    (items_fn, reduce_fn): (&CudaFunction, &CudaFunction),
    plan: &CallPlan,
    blocks: u32,
    states: &mut CudaSlice<u64>,
    result: &mut CudaSlice<u64>,
) -> Result<(), KernelError> {
    let per_round = u64::from(blocks) * u64::from(ADLER_THREADS);
    let slots = plan.items.div_ceil(per_round) * u64::from(blocks);
    let cfg = |grid: u32| LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (ADLER_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let items = plan.items;
    // SAFETY: the arguments match adler_items / adler_reduce; `ptrs` are device pages of the
    // pool with `lens` bytes each; `states` holds at least `slots` states (3 words each:
    // sized for the most items at SGLang's launch, and a budget grid needs no more slots).
    unsafe {
        s.launch_builder(items_fn)
            .arg(&plan.adler_ptrs)
            .arg(&plan.adler_lens)
            .arg(&items)
            .arg(&mut *states)
            .launch(cfg(blocks))
            .map_err(drv("cuLaunchKernel(adler_items)"))?;
        s.launch_builder(reduce_fn)
            .arg(&*states)
            .arg(&slots)
            .arg(&mut *result)
            .launch(cfg(1))
            .map_err(drv("cuLaunchKernel(adler_reduce)"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_peer_compiles_for_hopper_where_nvrtc_is_present() {
        if !kvlayout_kernels::nvrtc_present() {
            println!("skipped: libnvrtc not found (gpu_bench compiles it on the device machine)");
            return;
        }
        let opts = cudarc::nvrtc::CompileOptions {
            options: vec!["--gpu-architecture=sm_90".into()],
            ..Default::default()
        };
        let ptx =
            cudarc::nvrtc::compile_ptx_with_opts(super::ADLER_SOURCE, opts).expect("NVRTC compile");
        assert!(
            ptx.to_src().contains(".entry adler_items"),
            "no adler_items entry"
        );
    }
}
