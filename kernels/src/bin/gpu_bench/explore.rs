//! `gpu_bench --explore`: candidate designs for sharing the GPU with the model (issue 11),
//! measured side by side before one is built into the library.
//!
//! Candidates: long runs (>= 16 KiB, MLA pages) and short runs (index-K pages) on two copy
//! engines; short runs by a small SM kernel on a high-priority stream while the copy engines
//! take the long ones; the batch split over host threads; the whole transfer by the small
//! kernel on a high-priority stream; and a resident spinning kernel next to the GEMM loop (what
//! a persistent copy kernel would cost the model).

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use kvlayout_kernels::device::copy_engine;
use kvlayout_kernels::{ByteRun, Gpu, KernelError, RunOrder};

use crate::workload::Call;

/// The device staging of the gather candidates: the library's gathered backup's.
const STAGING_SLOTS: usize = kvlayout_kernels::GATHER_SLOTS;
const STAGING_SLOT_BYTES: u64 = kvlayout_kernels::GATHER_SLOT_BYTES;

/// `--sm-carveout K`: the GEMM's cuBLAS handle leaves K SMs (`cublasSetSmCountTarget`).
pub fn sm_carveout() -> Option<u32> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == "--sm-carveout")?;
    args.get(at + 1)?.parse().ok()
}

/// Runs at least this long go to the copy engines in the split candidates.
pub const LONG_RUN_BYTES: u64 = 16 * 1024;

/// The small copy kernel and a spinner (bench-local).
pub const SOURCE: &str = r#"
typedef unsigned long long u64;
struct Run { u64 src; u64 dst; u64 len; };
#define UNROLL 8
extern "C" __global__ void __launch_bounds__(1024) fast_copy(const Run* runs, u64 n,
    const unsigned char* src, unsigned char* dst, u64 min_len, u64 max_len)
{
    const unsigned lane = threadIdx.x & 31u;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 i = warp; i < n; i += warps) {
        const Run r = runs[i];
        if (r.len < min_len || r.len >= max_len) continue;
        const uint4* s = reinterpret_cast<const uint4*>(src + r.src);
        uint4* d = reinterpret_cast<uint4*>(dst + r.dst);
        const u64 nv = r.len >> 4;
        for (u64 first = lane; first < nv; first += 32 * UNROLL) {
            uint4 buf[UNROLL];
#pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                const u64 v = first + 32 * k;
                if (v < nv) buf[k] = s[v];
            }
#pragma unroll
            for (int k = 0; k < UNROLL; ++k) {
                const u64 v = first + 32 * k;
                if (v < nv) d[v] = buf[k];
            }
        }
    }
}
extern "C" __global__ void spin(const volatile unsigned* stop)
{
    while (*stop == 0u) { __nanosleep(2000); }
}
"#;

/// A candidate path.
#[derive(Clone, Copy, Debug)]
pub enum Candidate {
    /// Long runs batched on the `Gpu`'s stream, short runs batched on a second stream.
    SplitTwoStreams,
    /// Long runs batched on the `Gpu`'s stream, short runs by the small kernel on this many
    /// blocks of 1024 threads on a high-priority stream.
    SplitKernel(u32),
    /// The batch split over this many host threads (rayon), each on its own stream.
    Threads(usize),
    /// Every run by the small kernel, this many blocks of 1024 threads, high-priority stream.
    PrioKernel(u32),
    /// Two host threads on two streams: one batches the long runs, the other the short ones.
    ThreadsSplit,
    /// Backups: the copy engines gather the runs into a device staging slot (device to
    /// device, one 2D copy per pitched group), then copy each host-contiguous stretch of the
    /// slot to the host in one copy; two streams, a ring of slots.
    DeviceStaged,
    /// The batch (one stream, 2,048 runs per call, overlap hint) in this order.
    Order(RunOrder),
    /// Every run by the small kernel on the high-priority stream, in launches of at most
    /// `runs_per_launch` runs (short launches, so a launch's blocks are placed again each time
    /// and a GEMM never waits long for an SM), `blocks` blocks of 1024 threads each, launched as
    /// one thread-block cluster when `cluster` (its blocks then share a GPC).
    Chunked {
        blocks: u32,
        runs_per_launch: u32,
        cluster: bool,
    },
    /// Loads: the small kernel (`blocks` blocks of 1024 threads, high-priority stream) takes
    /// the short runs and, in host order, long runs until it holds `sm_permille` thousandths
    /// of the bytes; the copy engines batch the other long runs on the `Gpu`'s stream, both at
    /// once.
    SplitShare { blocks: u32, sm_permille: u32 },
    /// Backups: the small kernel (this many blocks of 1024 threads, high-priority stream)
    /// gathers the runs, in host order, into device staging slots; the copy engines copy each
    /// host-contiguous stretch of a slot out with one `cuMemcpyAsync`. The second field
    /// times a part alone: 0 both, 1 the gather only, 2 the copies out only. The third: the
    /// copies out round-robin over this many streams (1 to 4), or 0: one `cuMemcpyBatchAsync`
    /// per slot.
    GatherThenCopy(u32, u8, u8),
    /// The call's bytes as contiguous pieces of this many bytes, one `cuMemcpyAsync` each on
    /// the `Gpu`'s stream: host addresses in order, or (true) pieces in a shuffled order.
    Pieces(u64, bool),
}

impl Candidate {
    pub fn label(self) -> String {
        match self {
            Candidate::SplitTwoStreams => {
                "explore: long runs CE stream 1, short runs CE stream 2".into()
            }
            Candidate::SplitKernel(k) => {
                format!("explore: long runs CE, short runs kernel {k} x 1024 thr, prio")
            }
            Candidate::SplitShare {
                blocks,
                sm_permille,
            } => format!(
                "explore: kernel {blocks} x 1024 thr short runs + long to {:.1}% of bytes, CE the rest",
                f64::from(sm_permille) / 10.0
            ),
            Candidate::Threads(t) => format!("explore: batch from {t} host threads"),
            Candidate::PrioKernel(k) => format!("explore: all runs kernel {k} x 1024 thr, prio"),
            Candidate::ThreadsSplit => "explore: long / short runs from 2 host threads".into(),
            Candidate::Order(o) => format!("explore: batch, 1 stream, 2048 runs/call, {o:?}"),
            Candidate::Chunked {
                blocks,
                runs_per_launch,
                cluster,
            } => format!(
                "explore: kernel {blocks} x 1024 thr{}, prio, {runs_per_launch} runs/launch",
                if cluster { " as 1 cluster" } else { "" }
            ),
            Candidate::GatherThenCopy(k, part, outs) => format!(
                "explore: kernel {k} x 1024 gathers to slots, stretches out {}{}",
                if outs == 0 {
                    "batched".to_string()
                } else {
                    format!("on {outs} streams")
                },
                ["", " (gather only)", " (copies out only)"][usize::from(part.min(2))]
            ),
            Candidate::Pieces(b, shuffled) => format!(
                "explore: contiguous bytes as {} KiB copies{}",
                b >> 10,
                if shuffled { ", shuffled" } else { ", in order" }
            ),
            Candidate::DeviceStaged => format!(
                "explore: device staging, D2D gather then 1 copy per host stretch, {STAGING_SLOTS} x {} MiB",
                STAGING_SLOT_BYTES >> 20
            ),
        }
    }
}

/// Streams and kernels of the candidates.
pub struct Extra {
    pub staging: kvlayout_kernels::DeviceBytes,
    pub prio: Arc<CudaStream>,
    pub side: Vec<Arc<CudaStream>>,
    pub fast: CudaFunction,
    pub spin: CudaFunction,
}

impl Extra {
    pub fn new(gpu: &Gpu, module: &Arc<cudarc::driver::CudaModule>) -> Result<Extra, KernelError> {
        let (_least, greatest) = cudarc::driver::result::stream::get_priority_range()
            .map_err(drv("cuCtxGetStreamPriorityRange"))?;
        println!("stream priorities: greatest {greatest}");
        let prio = gpu
            .context()
            .new_stream_with_priority(greatest)
            .map_err(drv("cuStreamCreateWithPriority"))?;
        let side = (0..8)
            .map(|_| gpu.context().new_stream().map_err(drv("cuStreamCreate")))
            .collect::<Result<_, _>>()?;
        let f = |n: &str| module.load_function(n).map_err(drv("cuModuleGetFunction"));
        Ok(Extra {
            staging: gpu.alloc_device(STAGING_SLOTS * STAGING_SLOT_BYTES as usize)?,
            prio,
            side,
            fast: f("fast_copy")?,
            spin: f("spin")?,
        })
    }
}

fn drv(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> KernelError {
    move |e| KernelError::Driver {
        call,
        message: format!("{e:?}"),
    }
}

/// `to` waits for everything enqueued on `from` so far.
fn follow(from: &CudaStream, to: &CudaStream) -> Result<(), KernelError> {
    to.join(from).map_err(drv("cuStreamWaitEvent"))
}

/// `cuMemcpyBatchAsync` of `runs` (already ordered) on `stream`, 2,048 per call, overlap hint
/// (the library's call on a stream of ours).
fn batch(stream: &CudaStream, bases: (u64, u64), runs: &[ByteRun]) -> Result<(), KernelError> {
    // SAFETY: the runs lie inside the bench's pools, alive until the window's finish.
    unsafe {
        copy_engine::batch_on(
            stream,
            bases,
            runs,
            kvlayout_kernels::CopyEngineHint::PreferOverlapWithCompute,
            2048,
        )
    }
}

fn launch_fast(
    x: &Extra,
    call: &Call,
    bases: (u64, u64),
    blocks: u32,
    (min_len, max_len): (u64, u64),
) -> Result<(), KernelError> {
    let list = (call.dev_runs.device_address(), call.dev_runs.len() as u64);
    launch_list(x, list, bases, blocks, false, (min_len, max_len))
}

/// The small kernel over `n` runs at device address `runs` (16-byte aligned runs), `blocks`
/// blocks of 1024 threads on the high-priority stream; one cluster of `blocks` when `cluster`
/// (`cuLaunchKernelEx` with a cluster dimension).
fn launch_list(
    x: &Extra,
    (runs, n): (u64, u64),
    bases: (u64, u64),
    blocks: u32,
    cluster: bool,
    (min_len, max_len): (u64, u64),
) -> Result<(), KernelError> {
    if !cluster {
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the run list holds n runs of 3 words, 16-byte aligned inside both buffers.
        return unsafe {
            x.prio
                .launch_builder(&x.fast)
                .arg(&runs)
                .arg(&n)
                .arg(&bases.0)
                .arg(&bases.1)
                .arg(&min_len)
                .arg(&max_len)
                .launch(cfg)
        }
        .map(|_| ())
        .map_err(drv("cuLaunchKernel(fast_copy)"));
    }
    let mut args = [runs, n, bases.0, bases.1, min_len, max_len];
    let mut params: Vec<*mut std::ffi::c_void> = args
        .iter_mut()
        .map(|a| (a as *mut u64).cast::<std::ffi::c_void>())
        .collect();
    // SAFETY: a zeroed union is a valid attribute value; only clusterDim is set and read.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = blocks;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    let cfg = sys::CUlaunchConfig {
        gridDimX: blocks,
        gridDimY: 1,
        gridDimZ: 1,
        blockDimX: 1024,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: 0,
        hStream: x.prio.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: the parameters match fast_copy's six 64-bit arguments and outlive the call
    // (the driver copies them at launch); the list and buffers as above.
    unsafe {
        sys::cuLaunchKernelEx(
            &cfg,
            x.fast.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(drv("cuLaunchKernelEx(fast_copy, cluster)"))
}

/// Enqueues one call of a candidate; everything joins back into the `Gpu`'s stream.
pub fn enqueue(
    gpu: &Gpu,
    x: &Extra,
    call: &Call,
    bases: (u64, u64),
    h2d: bool,
    c: Candidate,
) -> Result<(), KernelError> {
    let main = gpu.stream();
    let order = if h2d {
        RunOrder::SrcAscending
    } else {
        RunOrder::DstAscending
    };
    match c {
        Candidate::SplitTwoStreams => {
            let runs = order.sorted_and_merged(&call.runs);
            let (long, short): (Vec<ByteRun>, Vec<ByteRun>) =
                runs.iter().partition(|r| r.len_bytes >= LONG_RUN_BYTES);
            follow(main, &x.side[0])?;
            batch(&x.side[0], bases, &short)?;
            batch(main, bases, &long)?;
            follow(&x.side[0], main)
        }
        Candidate::SplitKernel(k) => {
            let runs = order.sorted_and_merged(&call.runs);
            let long: Vec<ByteRun> = runs
                .into_iter()
                .filter(|r| r.len_bytes >= LONG_RUN_BYTES)
                .collect();
            follow(main, &x.prio)?;
            launch_fast(x, call, bases, k, (0, LONG_RUN_BYTES))?;
            batch(main, bases, &long)?;
            follow(&x.prio, main)
        }
        Candidate::SplitShare {
            blocks,
            sm_permille,
        } => {
            // The device list is the call's runs sorted by host offset (stable, unmerged):
            // the same order here.
            let mut sorted = call.runs.clone();
            sorted.sort_by_key(|r| r.src_offset_bytes);
            let total: u64 = sorted.iter().map(|r| r.len_bytes).sum();
            let target = total / 1000 * u64::from(sm_permille);
            let mut sm_bytes: u64 = sorted
                .iter()
                .filter(|r| r.len_bytes < LONG_RUN_BYTES)
                .map(|r| r.len_bytes)
                .sum();
            let mut cut = 0;
            while cut < sorted.len() && sm_bytes < target {
                if sorted[cut].len_bytes >= LONG_RUN_BYTES {
                    sm_bytes += sorted[cut].len_bytes;
                }
                cut += 1;
            }
            let ce: Vec<ByteRun> = sorted
                .iter()
                .enumerate()
                .filter(|&(i, r)| i >= cut && r.len_bytes >= LONG_RUN_BYTES)
                .map(|(_, r)| *r)
                .collect();
            follow(main, &x.prio)?;
            let list = call.dev_runs.device_address();
            launch_list(
                x,
                (list, sorted.len() as u64),
                bases,
                blocks,
                false,
                (0, LONG_RUN_BYTES),
            )?;
            if cut > 0 {
                launch_list(
                    x,
                    (list, cut as u64),
                    bases,
                    blocks,
                    false,
                    (LONG_RUN_BYTES, u64::MAX),
                )?;
            }
            batch(main, bases, &ce)?;
            follow(&x.prio, main)
        }
        Candidate::Threads(_) | Candidate::ThreadsSplit => {
            let runs = order.sorted_and_merged(&call.runs);
            let parts: Vec<Vec<ByteRun>> = match c {
                Candidate::Threads(t) => {
                    let t = t.clamp(1, x.side.len());
                    runs.chunks(runs.len().div_ceil(t).max(1))
                        .map(<[ByteRun]>::to_vec)
                        .collect()
                }
                _ => {
                    let (long, short): (Vec<ByteRun>, Vec<ByteRun>) =
                        runs.iter().partition(|r| r.len_bytes >= LONG_RUN_BYTES);
                    vec![long, short]
                }
            };
            let t = parts.len();
            for s in &x.side[..t] {
                follow(main, s)?;
            }
            let ctx = gpu.context();
            let results: Vec<Result<(), KernelError>> = std::thread::scope(|scope| {
                let handles: Vec<_> = parts
                    .iter()
                    .zip(&x.side)
                    .map(|(p, s)| {
                        scope.spawn(move || {
                            ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
                            batch(s, bases, p)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("batch thread"))
                    .collect()
            });
            for r in results {
                r?;
            }
            for s in &x.side[..t] {
                follow(s, main)?;
            }
            Ok(())
        }
        Candidate::DeviceStaged => device_staged(gpu, x, call, bases, order),
        Candidate::Order(o) => batch(main, bases, &o.sorted_and_merged(&call.runs)),
        Candidate::PrioKernel(k) => {
            follow(main, &x.prio)?;
            launch_fast(x, call, bases, k, (0, u64::MAX))?;
            follow(&x.prio, main)
        }
        Candidate::Chunked {
            blocks,
            runs_per_launch,
            cluster,
        } => {
            follow(main, &x.prio)?;
            let (addr, n) = (call.dev_runs.device_address(), call.dev_runs.len() as u64);
            let per = u64::from(runs_per_launch.max(1));
            let mut first = 0u64;
            while first < n {
                let count = per.min(n - first);
                let list = (addr + first * RUN_BYTES, count);
                launch_list(x, list, bases, blocks, cluster, (0, u64::MAX))?;
                first += count;
            }
            follow(&x.prio, main)
        }
        Candidate::Pieces(piece_bytes, shuffled) => {
            let n = call.bytes / piece_bytes;
            let mut order: Vec<u64> = (0..n).collect();
            if shuffled {
                // A fixed permutation: multiply by an odd number coprime to n, modulo n.
                let step = (0..)
                    .map(|k| 7919 + 2 * k)
                    .find(|s| gcd(*s, n) == 1)
                    .unwrap_or(1);
                order = (0..n).map(|i| i * step % n).collect();
            }
            for i in order {
                let at = i * piece_bytes;
                memcpy(main, bases.1 + at, bases.0 + at, piece_bytes)?;
            }
            Ok(())
        }
        Candidate::GatherThenCopy(k, part, outs) => {
            gather_then_copy(gpu, x, call, bases, k, (part, outs))
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Bytes of one run in a device run list (three `u64`).
const RUN_BYTES: u64 = 24;

/// A backup's gather, planned once per call by the library's plan
/// ([`kvlayout_kernels::plan_gathered_backup`], slots of the bench's staging), its chunks'
/// gather lists one after the other on the device, and where each chunk's list starts.
struct GatherPlan {
    chunks: Vec<kvlayout_kernels::GatherChunk>,
    first_runs: Vec<usize>,
    list: kvlayout_kernels::DeviceRuns,
}

thread_local! {
    static PLANS: std::cell::RefCell<std::collections::HashMap<usize, std::rc::Rc<GatherPlan>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

fn plan_gather(gpu: &Gpu, call: &Call) -> Result<GatherPlan, KernelError> {
    let runs = RunOrder::DstAscending.sorted_and_merged(&call.runs);
    // The library's plan as the chooser makes it (first chunk 8 MiB, doubling to a slot).
    kvlayout_kernels::host_stretches(&runs)
        .ok_or_else(|| KernelError::spec("runs", "overlapping host ranges: not gathered"))?;
    let chunks: Vec<kvlayout_kernels::GatherChunk> = kvlayout_kernels::gather_chunks(
        &runs,
        STAGING_SLOT_BYTES,
        STAGING_SLOTS,
        kvlayout_kernels::GATHER_FIRST_CHUNK_BYTES,
    )
    .collect();
    let mut first_runs = Vec::with_capacity(chunks.len());
    let mut list = Vec::new();
    for c in &chunks {
        first_runs.push(list.len());
        list.extend_from_slice(&c.gather);
    }
    let stretches: usize = chunks.iter().map(|c| c.stretches.len()).sum();
    println!(
        "    gather plan: {} runs after merging, {} slots, {stretches} host stretches",
        runs.len(),
        chunks.len()
    );
    Ok(GatherPlan {
        list: gpu.upload_runs(&list, RunOrder::AsGiven)?,
        chunks,
        first_runs,
    })
}

/// [`Candidate::GatherThenCopy`]: the gather list (device offset -> slot offset) uploaded once
/// per call, a kernel launch per slot on the high-priority stream, the copies out on a side
/// stream, a ring of slots joined by events.
fn gather_then_copy(
    gpu: &Gpu,
    x: &Extra,
    call: &Call,
    bases: (u64, u64),
    blocks: u32,
    (part, outs): (u8, u8),
) -> Result<(), KernelError> {
    let main = gpu.stream();
    let out_streams = &x.side[1..1 + usize::from(outs.clamp(1, 4))];
    let staging = kvlayout_kernels::GpuBytes::device_address(&x.staging);
    // The plan (host order, slots, the gather list on the device) is made once per call and
    // kept, like the other rows' pre-uploaded run lists: the windows after the first time the
    // GPU pipeline alone (the first window, which also plans, falls out of the median).
    let key = std::ptr::from_ref(call) as usize;
    let plan = match PLANS.with(|p| p.borrow().get(&key).cloned()) {
        Some(plan) => plan,
        None => {
            let plan = std::rc::Rc::new(plan_gather(gpu, call)?);
            PLANS.with(|p| p.borrow_mut().insert(key, plan.clone()));
            plan
        }
    };
    follow(main, &x.prio)?;
    for out in out_streams {
        follow(main, out)?;
    }
    let mut slot_free: Vec<Option<cudarc::driver::CudaEvent>> =
        (0..STAGING_SLOTS).map(|_| None).collect();
    for (c, chunk) in plan.chunks.iter().enumerate() {
        let slot = chunk.slot;
        if let Some(e) = slot_free[slot].take() {
            x.prio.wait(&e).map_err(drv("cuStreamWaitEvent"))?;
        }
        let first = plan.first_runs[c] as u64;
        let sub = (
            plan.list.device_address() + first * RUN_BYTES,
            chunk.gather.len() as u64,
        );
        if part != 2 {
            launch_list(x, sub, (bases.0, staging), blocks, false, (0, u64::MAX))?;
        }
        let out = &out_streams[c % out_streams.len()];
        follow(&x.prio, out)?;
        let stretches = &chunk.stretches;
        if part != 1 && outs == 0 {
            batch(out, (staging, bases.1), stretches)?;
        } else if part != 1 {
            for r in stretches {
                memcpy(
                    out,
                    bases.1 + r.dst_offset_bytes,
                    staging + r.src_offset_bytes,
                    r.len_bytes,
                )?;
            }
        }
        slot_free[slot] = Some(
            out.record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(drv("cuEventRecord"))?,
        );
    }
    follow(&x.prio, main)?;
    for out in out_streams {
        follow(out, main)?;
    }
    Ok(())
}

/// The GEMM loop's median with a spinner of `blocks` x `threads` resident on a high-priority
/// stream, against without: what a persistent copy kernel costs the model.
pub fn spin_cost(
    gpu: &Gpu,
    x: &Extra,
    gemm: &mut dyn FnMut() -> Result<(), KernelError>,
    gemm_stream: &CudaStream,
    configs: &[(u32, u32)],
) -> Result<(), KernelError> {
    let mut flag = gpu.alloc_pinned(64)?;
    let median_of = |gemm: &mut dyn FnMut() -> Result<(), KernelError>| {
        let ev: Vec<_> = (0..31)
            .map(|_| {
                gpu.context()
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(drv("cuEventCreate"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        ev[0].record(gemm_stream).map_err(drv("cuEventRecord"))?;
        for e in &ev[1..] {
            gemm()?;
            e.record(gemm_stream).map_err(drv("cuEventRecord"))?;
        }
        gemm_stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))?;
        let mut ms: Vec<f64> = (6..31)
            .map(|i| ev[i - 1].elapsed_ms(&ev[i]).map(f64::from))
            .collect::<Result<_, _>>()
            .map_err(drv("cuEventElapsedTime"))?;
        ms.sort_by(f64::total_cmp);
        Ok::<f64, KernelError>(ms[ms.len() / 2])
    };
    let base = median_of(gemm)?;
    println!("spin: GEMM alone {base:.3} ms");
    for &(blocks, threads) in configs {
        flag.as_mut_slice().fill(0);
        let addr = kvlayout_kernels::GpuBytes::device_address(&flag);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the flag is a live pinned word the kernel polls until the host sets it.
        unsafe { x.prio.launch_builder(&x.spin).arg(&addr).launch(cfg) }
            .map_err(drv("cuLaunchKernel(spin)"))?;
        std::thread::sleep(std::time::Duration::from_millis(20));
        let with = median_of(gemm)?;
        let p = flag.as_mut_slice().as_mut_ptr() as *mut u32;
        // SAFETY: p points into the live pinned allocation; a volatile store the GPU polls.
        unsafe { std::ptr::write_volatile(p, 1) };
        x.prio.synchronize().map_err(drv("cuStreamSynchronize"))?;
        println!(
            "spin {blocks} x {threads} threads resident: GEMM {with:.3} ms ({:+.1}%)",
            (with / base - 1.0) * 100.0
        );
    }
    let _ = gpu;
    Ok(())
}

/// A host pool on transparent huge pages (2 MiB, `madvise(MADV_HUGEPAGE)`), pinned and mapped
/// for the GPU with `cuMemHostRegister`: does the copy engines' per-run cost depend on the
/// host pages' size (`--huge`)?
pub struct HugeHost {
    ptr: *mut u8,
    len: usize,
    device_ptr: u64,
}

const HUGE_PAGE_BYTES: usize = 2 << 20;

unsafe extern "C" {
    fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
}

impl HugeHost {
    pub fn new(gpu: &Gpu, len: usize) -> Result<HugeHost, KernelError> {
        let len = len.div_ceil(HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES;
        let layout = std::alloc::Layout::from_size_align(len, HUGE_PAGE_BYTES)
            .map_err(|e| KernelError::spec("len", e.to_string()))?;
        // SAFETY: a non-zero size with a valid alignment; freed in Drop with the same layout.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(KernelError::spec("len", "host allocation failed"));
        }
        // SAFETY: ptr..ptr+len is our allocation; MADV_HUGEPAGE (14) only advises the kernel.
        let rc = unsafe { madvise(ptr.cast(), len, 14) };
        println!("huge host pool: madvise(MADV_HUGEPAGE) = {rc}");
        gpu.context()
            .bind_to_thread()
            .map_err(drv("cuCtxSetCurrent"))?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: a live host allocation of len bytes, unregistered in Drop.
        unsafe { sys::cuMemHostRegister_v2(ptr.cast(), len, flags) }
            .result()
            .map_err(drv("cuMemHostRegister"))?;
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: ptr was registered with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, ptr.cast(), 0) }
            .result()
            .map_err(drv("cuMemHostGetDevicePointer"))?;
        Ok(HugeHost {
            ptr,
            len,
            device_ptr,
        })
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: a live allocation of len bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl kvlayout_kernels::GpuBytes for HugeHost {
    fn device_address(&self) -> u64 {
        self.device_ptr
    }
    fn len_bytes(&self) -> u64 {
        self.len as u64
    }
}

impl Drop for HugeHost {
    fn drop(&mut self) {
        // SAFETY: registered in new; the bench has finished every transfer by now.
        let _ = unsafe { sys::cuMemHostUnregister(self.ptr.cast()) };
        let layout = std::alloc::Layout::from_size_align(self.len, HUGE_PAGE_BYTES)
            .expect("the layout of new");
        // SAFETY: allocated in new with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// What the kernel reports about huge pages for this process.
pub fn print_huge_page_status() {
    let thp =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let anon = std::fs::read_to_string("/proc/self/smaps_rollup")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("AnonHugePages") || l.starts_with("Rss"))
        .collect::<Vec<_>>()
        .join("; ");
    println!("transparent_hugepage: {}; {anon}", thp.trim());
}

fn memcpy(stream: &CudaStream, dst: u64, src: u64, len: u64) -> Result<(), KernelError> {
    // SAFETY: both ranges lie inside live allocations (the bench's pools and staging).
    unsafe { sys::cuMemcpyAsync(dst, src, len as usize, stream.cu_stream()) }
        .result()
        .map_err(drv("cuMemcpyAsync"))
}

/// The device-staged backup: gather on one stream (device to device), copy out on another.
fn device_staged(
    gpu: &Gpu,
    x: &Extra,
    call: &Call,
    bases: (u64, u64),
    order: RunOrder,
) -> Result<(), KernelError> {
    let main = gpu.stream();
    let (gather, out) = (&x.side[0], &x.side[1]);
    follow(main, gather)?;
    follow(main, out)?;
    let staging = kvlayout_kernels::GpuBytes::device_address(&x.staging);
    let runs = order.sorted_and_merged(&call.runs);
    let mut slot_free: Vec<Option<cudarc::driver::CudaEvent>> =
        (0..STAGING_SLOTS).map(|_| None).collect();
    let mut chunk: Vec<ByteRun> = Vec::new();
    let mut used_bytes = 0u64;
    let mut slot = 0usize;
    let mut flush = |chunk: &mut Vec<ByteRun>,
                     used_bytes: &mut u64,
                     slot: &mut usize|
     -> Result<(), KernelError> {
        if chunk.is_empty() {
            return Ok(());
        }
        if let Some(e) = slot_free[*slot].take() {
            gather.wait(&e).map_err(drv("cuStreamWaitEvent"))?;
        }
        let base = staging + *slot as u64 * STAGING_SLOT_BYTES;
        // Gather: run i goes to the slot at the sum of the lengths before it.
        let mut packed = Vec::with_capacity(chunk.len());
        let mut at_bytes = 0u64;
        for r in chunk.iter() {
            packed.push(ByteRun::new(r.src_offset_bytes, at_bytes, r.len_bytes));
            at_bytes += r.len_bytes;
        }
        for g in kvlayout_kernels::group_pitched(&packed, gpu.max_pitch_bytes()) {
            if g.lines() >= 2 {
                // SAFETY: every line lies inside the device pool and the staging slot.
                unsafe { copy_engine::pitched_on(gather, (bases.0, base), &g)? };
            } else {
                memcpy(
                    gather,
                    base + g.dst_offset_bytes(),
                    bases.0 + g.src_offset_bytes(),
                    g.len_bytes(),
                )?;
            }
        }
        follow(gather, out)?;
        // Out: host-contiguous stretches of the chunk, one copy each.
        let mut i = 0;
        let mut at_bytes = 0u64;
        while i < chunk.len() {
            let (start_host, start_at_bytes) = (chunk[i].dst_offset_bytes, at_bytes);
            let mut len_bytes = 0u64;
            while i < chunk.len() && chunk[i].dst_offset_bytes == start_host + len_bytes {
                len_bytes += chunk[i].len_bytes;
                i += 1;
            }
            memcpy(out, bases.1 + start_host, base + start_at_bytes, len_bytes)?;
            at_bytes += len_bytes;
        }
        slot_free[*slot] = Some(
            out.record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(drv("cuEventRecord"))?,
        );
        *slot = (*slot + 1) % STAGING_SLOTS;
        chunk.clear();
        *used_bytes = 0;
        Ok(())
    };
    for r in runs {
        if used_bytes + r.len_bytes > STAGING_SLOT_BYTES {
            flush(&mut chunk, &mut used_bytes, &mut slot)?;
        }
        if r.len_bytes > STAGING_SLOT_BYTES {
            return Err(KernelError::spec(
                "len_bytes",
                "a run longer than a staging slot",
            ));
        }
        used_bytes += r.len_bytes;
        chunk.push(r);
    }
    flush(&mut chunk, &mut used_bytes, &mut slot)?;
    follow(gather, main)?;
    follow(out, main)
}
