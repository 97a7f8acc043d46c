//! `gpu_bench --overlap`: every transfer path alone and next to a bf16 GEMM loop.
//!
//! A cuBLAS bf16 GEMM (8192^3, random inputs) loops on its own stream; the transfer runs on the
//! `Gpu`'s stream once the loop is going (it waits on an event after the 8th GEMM). Per row:
//! GB/s alone, GB/s next to the GEMM (bytes over the transfer's own events, or over the host
//! time of its enqueue calls when that is longer: the host had a head start), and the GEMM's
//! slowdown: the GEMMs overlapping the transfer window against the GEMMs at the same positions
//! of a control loop with no transfer, run right before (even windows) or after (odd windows)
//! it. The H200 runs this GEMM at its power cap (700 W; SM clocks about 1.5 GHz instead of
//! 1.98), and the loop's speed drifts over its length; the earlier measure, against the median
//! GEMM of the same loop outside the window, read -4.3% to +1.2% (median -0.6%) for memcpy in
//! session 5 and down to -3.7% for the SGLang-style peer, and is still printed on a line of its
//! own after each row. With 5 windows the control runs before the window three times and after
//! it twice. Each figure is the median of 5 windows after one
//! warm-up, with the range shown. Small transfers (1 and 8 pages of 1 layer) are timed as bursts of
//! back-to-back repetitions, memcpy the same way. `--hold SECONDS` replaces the windows by long
//! phases with both streams fed without a pause ([`hold_phases`]).

use std::sync::Arc;

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, compile_ptx_with_opts};
use half::bf16;
use kvlayout_core::MemoryLayout;
use kvlayout_kernels::test_data::SplitMix64;
use kvlayout_kernels::{
    BACKUP_LINK_SHARE_PERMILLE, CopyEngineHint, CopyEngineOptions, DeviceBytes, Gpu, GpuBytes,
    KernelError, LaunchShape, RunOrder,
};

use crate::paths::{self, Mode, Path};
use crate::report::{self, Row, Stat, print_row, stat};
use crate::verify::{self, Verifier, Verify};
use crate::workload::{Call, Shape, dsa_pool, page_shape, page1_pool, page1_shape, token_shape};

const GEMM_N: usize = 8192;
const WINDOWS: usize = 5;
/// GEMMs of the loop before the transfer starts.
const LEAD_GEMMS: usize = 8;

/// The SGLang HiCache transfer kernel's algorithm (sgl-kernel `csrc/kvcacheio/transfer.cu`,
/// `transfer_item_warp`): one warp per item, 8-byte `ld.global.nc` loads and `st.global.cg`
/// stores, lane-strided, a grid of `block_quota` blocks of `num_warps_per_block` warps.
const PEER_SOURCE: &str = r#"
typedef unsigned long long u64;
struct Run { u64 src; u64 dst; u64 len; };
extern "C" __global__ void sglang_warp_copy(const Run* runs, u64 n, const unsigned char* src,
                                            unsigned char* dst)
{
    const unsigned lane = threadIdx.x & 31u;
    const u64 warp = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 i = warp; i < n; i += warps) {
        const Run r = runs[i];
        const u64* s = reinterpret_cast<const u64*>(src + r.src);
        u64* d = reinterpret_cast<u64*>(dst + r.dst);
        const u64 words = r.len >> 3;
        for (u64 w = lane; w < words; w += 32) {
            u64 v;
            asm volatile("ld.global.nc.b64 %0, [%1];" : "=l"(v) : "l"(s + w) : "memory");
            asm volatile("st.global.cg.b64 [%0], %1;" :: "l"(d + w), "l"(v) : "memory");
        }
    }
}
"#;
/// SGLang's Python default on NVIDIA is `block_quota=2` (`Path::Peer(2)`) with
/// `num_warps_per_block=32`.
const PEER_WARPS_PER_BLOCK: u32 = 32;

struct Ctx<'a> {
    gpu: &'a Gpu,
    /// Host milliseconds of the last alone window's enqueue calls.
    host_ms: f64,
    host: Box<dyn GpuBytes>,
    dev: DeviceBytes,
    peer: CudaFunction,
    gemm: GemmLoop,
    /// `--verify`: the loads' verification ([`crate::verify`]).
    verify: Option<Verify>,
}

struct GemmLoop {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    a: CudaSlice<bf16>,
    b: CudaSlice<bf16>,
    c: CudaSlice<bf16>,
}

impl GemmLoop {
    fn enqueue(&mut self) -> Result<(), KernelError> {
        let n = GEMM_N as i32;
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_N,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: n,
            n,
            k: n,
            alpha: bf16::ONE,
            lda: n,
            ldb: n,
            beta: bf16::ZERO,
            ldc: n,
        };
        // SAFETY: three live 8192 x 8192 bf16 matrices on the GEMM's stream.
        unsafe { self.blas.gemm(cfg, &self.a, &self.b, &mut self.c) }.map_err(|e| {
            KernelError::Driver {
                call: "cublasGemmEx",
                message: format!("{e:?}"),
            }
        })
    }
}

fn drv(call: &'static str) -> impl Fn(cudarc::driver::DriverError) -> KernelError {
    move |e| KernelError::Driver {
        call,
        message: format!("{e:?}"),
    }
}

fn event(gpu: &Gpu) -> Result<CudaEvent, KernelError> {
    gpu.context()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(drv("cuEventCreate"))
}

/// The GEMM alone: median of 20 after 5 warm-ups.
fn gemm_alone(gpu: &Gpu, gemm: &mut GemmLoop) -> Result<Stat, KernelError> {
    let ev: Vec<CudaEvent> = (0..26).map(|_| event(gpu)).collect::<Result<_, _>>()?;
    ev[0].record(&gemm.stream).map_err(drv("cuEventRecord"))?;
    for e in &ev[1..] {
        gemm.enqueue()?;
        e.record(&gemm.stream).map_err(drv("cuEventRecord"))?;
    }
    gemm.stream
        .synchronize()
        .map_err(drv("cuStreamSynchronize"))?;
    Ok(stat(
        (6..26)
            .map(|i| ev[i - 1].elapsed_ms(&ev[i]).map(f64::from))
            .collect::<Result<_, _>>()
            .map_err(drv("cuEventElapsedTime"))?,
    ))
}

/// A bench-local CUDA source compiled for the device and loaded.
pub(crate) fn load_module(
    gpu: &Gpu,
    source: &str,
) -> Result<Arc<cudarc::driver::CudaModule>, KernelError> {
    let arch = gpu.arch();
    let ptx = compile_ptx_with_opts(
        source,
        CompileOptions {
            options: vec![format!("--gpu-architecture={arch}")],
            ..Default::default()
        },
    )
    .map_err(|e| KernelError::Compile {
        arch: arch.clone(),
        log: format!("{e:?}"),
    })?;
    gpu.context()
        .load_module(ptx)
        .map_err(drv("cuModuleLoadData"))
}

/// Enqueues one window of `shape` by `path` on the transfer stream.
fn enqueue(cx: &mut Ctx<'_>, shape: &Shape, path: Path) -> Result<(), KernelError> {
    for _ in 0..shape.burst {
        for call in &shape.calls {
            enqueue_call(cx, shape.h2d, call, path)?;
        }
    }
    Ok(())
}

fn enqueue_call(cx: &mut Ctx<'_>, h2d: bool, call: &Call, path: Path) -> Result<(), KernelError> {
    if let Path::Verified(v) = path {
        enqueue_call(cx, h2d, call, Path::Auto)?;
        let Some(verify) = cx.verify.as_mut() else {
            return Err(KernelError::Unsupported(
                "a verified path without --verify".into(),
            ));
        };
        return verify.enqueue_after(cx.gpu, call, v);
    }
    let gpu = cx.gpu;
    let (h, d) = (cx.host.device_address(), cx.dev.device_address());
    let (src_base, dst_base) = if h2d { (h, d) } else { (d, h) };
    let order = if h2d {
        RunOrder::SrcAscending
    } else {
        RunOrder::DstAscending
    };
    let Ctx { host, dev, .. } = cx;
    let (src, dst): (&dyn GpuBytes, &mut dyn GpuBytes) = if h2d {
        (&**host, dev)
    } else {
        (&*dev, &mut **host)
    };
    // SAFETY: (every arm) both pools live until the window's finish(); every run and item lies
    // inside them (planned from the pool geometries, checked by each path).
    unsafe {
        match path {
            Path::Memcpy => gpu.enqueue_memcpy(dst_base, src_base, call.bytes),
            Path::MemcpyPerRun => {
                for r in &call.runs {
                    gpu.enqueue_memcpy(
                        dst_base + r.dst_offset_bytes,
                        src_base + r.src_offset_bytes,
                        r.len_bytes,
                    )?;
                }
                Ok(())
            }
            Path::Peer(blocks) => {
                let n = call.peer_item_count;
                let grid = n
                    .div_ceil(u64::from(PEER_WARPS_PER_BLOCK))
                    .min(u64::from(blocks))
                    .max(1) as u32;
                let cfg = LaunchConfig {
                    grid_dim: (grid, 1, 1),
                    block_dim: (PEER_WARPS_PER_BLOCK * 32, 1, 1),
                    shared_mem_bytes: 0,
                };
                let items = call.peer_items.device_address();
                gpu.stream()
                    .launch_builder(&cx.peer)
                    .arg(&items)
                    .arg(&n)
                    .arg(&src_base)
                    .arg(&dst_base)
                    .launch(cfg)
                    .map(|_| ())
                    .map_err(drv("cuLaunchKernel(sglang_warp_copy)"))
            }
            Path::Batch(sorted, hint, lanes, runs_per_call, pitched) => {
                let opts = CopyEngineOptions {
                    order: if sorted { order } else { RunOrder::AsGiven },
                    hint: if hint {
                        CopyEngineHint::PreferOverlapWithCompute
                    } else {
                        CopyEngineHint::Default
                    },
                    lanes,
                    runs_per_call,
                    pitched,
                };
                gpu.enqueue_copy_runs_dma(src, dst, &call.runs, opts)
                    .map(|_| ())
            }
            Path::RunKernel(sms) => {
                let shape = sms.map_or(LaunchShape::default(), LaunchShape::sm_budget);
                // The token kernel keeps 4 blocks per SM resident (its launch bounds).
                let shape = LaunchShape {
                    blocks_per_sm: 4,
                    ..shape
                };
                gpu.enqueue_copy_runs(src, dst, &call.dev_runs, shape)
            }
            Path::RunKernelBlocks(blocks, sorted) => {
                let shape = LaunchShape {
                    blocks_per_sm: 1,
                    ..LaunchShape::sm_budget(blocks)
                };
                let list = if sorted {
                    &call.dev_runs
                } else {
                    &call.peer_items
                };
                gpu.enqueue_copy_runs(src, dst, list, shape)
            }
            Path::PacedBlocks(sms, blocks_per_sm) => {
                let link = u128::from(gpu.host_link_bytes_per_us()?);
                let rate = link * u128::from(BACKUP_LINK_SHARE_PERMILLE) / 1000;
                let shape = LaunchShape {
                    blocks_per_sm,
                    rate_limit_bytes_per_us: Some(u64::try_from(rate).unwrap_or(u64::MAX)),
                    ..LaunchShape::sm_budget(sms)
                };
                gpu.enqueue_copy_runs(src, dst, &call.peer_items, shape)
            }
            Path::SmContiguous(sms) => {
                let shape = LaunchShape {
                    blocks_per_sm: 4,
                    ..sms.map_or(LaunchShape::default(), LaunchShape::sm_budget)
                };
                match &call.contiguous_runs {
                    Some(runs) => gpu.enqueue_copy_runs(src, dst, runs, shape),
                    None => Err(KernelError::Unsupported(
                        "contiguous runs are laid at page size 1 only".to_string(),
                    )),
                }
            }
            Path::Staged => gpu.enqueue_staged_runs(src, dst, &call.runs).map(|_| ()),
            Path::Auto => gpu
                .enqueue_transfer_runs(src, dst, &call.runs, order)
                .map(|_| ()),
            Path::AutoShare(permille) => {
                gpu.set_backup_link_share_permille(permille)?;
                let queued = gpu.enqueue_transfer_runs(src, dst, &call.runs, order);
                gpu.set_backup_link_share_permille(BACKUP_LINK_SHARE_PERMILLE)?;
                queued.map(|_| ())
            }
            Path::Verified(_) => unreachable!("handled above"),
        }
    }
}

/// One window alone: milliseconds on the transfer stream, or the host time of the enqueue
/// calls when that is longer (the staged path does its host half inside them).
fn alone_ms(cx: &mut Ctx<'_>, shape: &Shape, path: Path) -> Result<f64, KernelError> {
    let (e0, e1) = (event(cx.gpu)?, event(cx.gpu)?);
    e0.record(cx.gpu.stream()).map_err(drv("cuEventRecord"))?;
    let t = std::time::Instant::now();
    enqueue(cx, shape, path)?;
    cx.host_ms = t.elapsed().as_secs_f64() * 1e3;
    cx.gpu.join_staged()?;
    e1.record(cx.gpu.stream()).map_err(drv("cuEventRecord"))?;
    cx.gpu.finish()?;
    let gpu_ms = f64::from(e0.elapsed_ms(&e1).map_err(drv("cuEventElapsedTime"))?);
    Ok(gpu_ms.max(cx.host_ms))
}

/// GEMMs of a loop whose window is `alone` ms long.
fn loop_gemms(alone: f64, gemm_ms: f64) -> usize {
    LEAD_GEMMS + ((2.0 * alone + 10.0) / gemm_ms).ceil() as usize + 8
}

/// Enqueues `gemms` GEMMs on the loop's stream with an event before each and after the last.
fn enqueue_gemm_loop(cx: &mut Ctx<'_>, gemms: usize) -> Result<Vec<CudaEvent>, KernelError> {
    let events: Vec<CudaEvent> = (0..=gemms)
        .map(|_| event(cx.gpu))
        .collect::<Result<_, _>>()?;
    events[0]
        .record(&cx.gemm.stream)
        .map_err(drv("cuEventRecord"))?;
    for e in &events[1..] {
        cx.gemm.enqueue()?;
        e.record(&cx.gemm.stream).map_err(drv("cuEventRecord"))?;
    }
    Ok(events)
}

/// Milliseconds from the first event to each event.
fn marks_ms(events: &[CudaEvent]) -> Result<Vec<f64>, KernelError> {
    events
        .iter()
        .map(|e| {
            events[0]
                .elapsed_ms(e)
                .map(f64::from)
                .map_err(drv("cuEventElapsedTime"))
        })
        .collect()
}

/// The same GEMM loop with no transfer (the control of a window): each GEMM's milliseconds.
fn control_gemm_ms(cx: &mut Ctx<'_>, gemms: usize) -> Result<Vec<f64>, KernelError> {
    let events = enqueue_gemm_loop(cx, gemms)?;
    cx.gemm
        .stream
        .synchronize()
        .map_err(drv("cuStreamSynchronize"))?;
    let marks = marks_ms(&events)?;
    Ok(marks.windows(2).map(|w| w[1] - w[0]).collect())
}

/// One window next to the GEMM loop.
struct Window {
    /// The transfer's milliseconds.
    ms: f64,
    /// The GEMM slowdown against the loop's GEMMs outside the window (the earlier measure).
    slowdown_outside: f64,
    /// The loop outlasted the transfer.
    outlasted: bool,
    /// Each GEMM's milliseconds, and whether it overlapped the window.
    gemm_ms: Vec<(f64, bool)>,
}

/// One window next to the GEMM loop ([`Window`]).
fn overlap_ms(
    cx: &mut Ctx<'_>,
    shape: &Shape,
    path: Path,
    gemms: usize,
    gemm_ms: f64,
) -> Result<Window, KernelError> {
    let events = enqueue_gemm_loop(cx, gemms)?;
    let (t0, t1) = (event(cx.gpu)?, event(cx.gpu)?);
    // The host waits for the lead GEMMs too: a path with a host half (staged) starts it with
    // the loop running, not ahead of it.
    events[LEAD_GEMMS]
        .synchronize()
        .map_err(drv("cuEventSynchronize"))?;
    cx.gpu
        .stream()
        .wait(&events[LEAD_GEMMS])
        .map_err(drv("cuStreamWaitEvent"))?;
    t0.record(cx.gpu.stream()).map_err(drv("cuEventRecord"))?;
    let host = std::time::Instant::now();
    enqueue(cx, shape, path)?;
    let host_ms = host.elapsed().as_secs_f64() * 1e3;
    cx.gpu.join_staged()?;
    t1.record(cx.gpu.stream()).map_err(drv("cuEventRecord"))?;
    cx.gpu.finish()?;
    cx.gemm
        .stream
        .synchronize()
        .map_err(drv("cuStreamSynchronize"))?;
    let at = |e: &CudaEvent| {
        events[0]
            .elapsed_ms(e)
            .map(f64::from)
            .map_err(drv("cuEventElapsedTime"))
    };
    let marks = marks_ms(&events)?;
    let (s, e) = (at(&t0)?, at(&t1)?);
    let mut outside: Vec<f64> = Vec::new();
    let (mut inside_sum, mut inside_n) = (0.0, 0usize);
    let mut each = vec![(marks[1] - marks[0], false)];
    for i in 1..gemms {
        let (a, b) = (marks[i], marks[i + 1]);
        let inside = overlaps((a, b), (s, e));
        each.push((b - a, inside));
        if inside {
            inside_sum += b - a;
            inside_n += 1;
        } else {
            outside.push(b - a);
        }
    }
    outside.sort_by(f64::total_cmp);
    let base = outside.get(outside.len() / 2).copied().unwrap_or(gemm_ms);
    let slowdown = if inside_n == 0 {
        0.0
    } else {
        inside_sum / (inside_n as f64 * base) - 1.0
    };
    // A transfer is never counted faster than the host could enqueue it (and, on the staged
    // path, do its host half).
    Ok(Window {
        ms: (e - s).max(host_ms),
        slowdown_outside: slowdown,
        outlasted: marks[gemms] > e,
        gemm_ms: each,
    })
}

/// Whether a GEMM running over `gemm` (start, end ms) overlapped the transfer window
/// `window` (start, end ms): any shared time, touching ends excluded.
fn overlaps(gemm: (f64, f64), window: (f64, f64)) -> bool {
    gemm.1 > window.0 && gemm.0 < window.1
}

/// The paired GEMM slowdown of a window: its GEMMs that overlapped the transfer against the
/// GEMMs at the same positions of a control loop with no transfer (the power and clock state
/// of the loop drifts over its length; the same positions see the same drift).
fn paired_slowdown(window: &[(f64, bool)], control: &[f64]) -> f64 {
    let (mut with, mut without) = (0.0, 0.0);
    for ((ms, inside), ctrl) in window.iter().zip(control) {
        if *inside {
            with += ms;
            without += ctrl;
        }
    }
    if without > 0.0 {
        with / without - 1.0
    } else {
        0.0
    }
}

/// One row's figures over [`WINDOWS`] windows.
struct Measured {
    alone: Stat,
    next: Stat,
    /// The paired GEMM slowdown ([`paired_slowdown`]).
    slowdown: Stat,
    /// The GEMM slowdown against the loop's GEMMs outside the window (the earlier measure).
    slowdown_outside: Stat,
    /// The loop outlasted the transfer in every window.
    outlasted: bool,
}

/// Measures one row. With [`WINDOWS`] = 5 the control loop runs before the window three times
/// and after it twice: a drift from one loop to the next weighs slightly more one way.
fn measure(
    cx: &mut Ctx<'_>,
    shape: &Shape,
    path: Path,
    gemm_ms: f64,
) -> Result<Measured, KernelError> {
    alone_ms(cx, shape, path)?; // warm-up
    let alone: Vec<f64> = (0..WINDOWS)
        .map(|_| alone_ms(cx, shape, path))
        .collect::<Result<_, _>>()?;
    let med = stat(alone.clone()).median;
    let gemms = loop_gemms(med, gemm_ms);
    let mut next = Vec::new();
    let mut slow = Vec::new();
    let mut slow_outside = Vec::new();
    let mut outlasted = true;
    for w in 0..WINDOWS {
        // The control loop before the window in even windows, after it in odd ones.
        let before = if w % 2 == 0 {
            Some(control_gemm_ms(cx, gemms)?)
        } else {
            None
        };
        let window = overlap_ms(cx, shape, path, gemms, gemm_ms)?;
        let control = match before {
            Some(c) => c,
            None => control_gemm_ms(cx, gemms)?,
        };
        next.push(window.ms);
        slow.push(paired_slowdown(&window.gemm_ms, &control));
        slow_outside.push(window.slowdown_outside);
        outlasted &= window.outlasted;
    }
    Ok(Measured {
        alone: stat(alone),
        next: stat(next),
        slowdown: stat(slow),
        slowdown_outside: stat(slow_outside),
        outlasted,
    })
}

/// `--loads-only` / `--backups-only`: whether transfers in this direction (`h2d`: loads) are
/// measured.
fn direction_wanted(h2d: bool) -> bool {
    let arg = |f: &str| std::env::args().any(|a| a == f);
    if h2d {
        !arg("--backups-only")
    } else {
        !arg("--loads-only")
    }
}

/// `--sm-carveout K`: the GEMM's cuBLAS handle leaves K SMs (`cublasSetSmCountTarget`) and the
/// chooser is told (`Gpu::set_model_carveout_sms`).
fn sm_carveout() -> Option<u32> {
    let args: Vec<String> = std::env::args().collect();
    let at = args.iter().position(|a| a == "--sm-carveout")?;
    args.get(at + 1)?.parse().ok()
}

/// `--verify-sms V`: SMs the GEMM leaves beyond the carve-out, for the verification alone.
fn verify_sms() -> u32 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--verify-sms")
        .and_then(|at| args.get(at + 1)?.parse().ok())
        .unwrap_or(0)
}

/// `--hold SECONDS`: the seconds of each phase of [`hold_phases`].
fn hold_seconds() -> Result<Option<f64>, KernelError> {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|a| a == "--hold") else {
        return Ok(None);
    };
    let value = args.get(at + 1).map(String::as_str).unwrap_or("");
    match value.parse::<f64>() {
        Ok(seconds) if seconds > 0.0 && seconds.is_finite() => Ok(Some(seconds)),
        _ => Err(KernelError::Unsupported(format!(
            "--hold takes the seconds of each phase, a positive number: got {value:?}"
        ))),
    }
}

/// Wall-clock time of day (UTC) as `HH:MM:SS.mmm`, to slice an `nvidia-smi` log by phase.
fn time_of_day() -> String {
    clock_of_day(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis()),
    )
}

/// `HH:MM:SS.mmm` (UTC) of `ms` milliseconds since the Unix epoch.
fn clock_of_day(ms: u128) -> String {
    let ms = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// `--hold SECONDS`: for each shape, phases of `seconds` each in the order GEMM only, memcpy,
/// chooser, chooser, memcpy, GEMM only (a drift over the run weighs on both sides alike): the
/// GEMM loops without a pause and the transfer repeats back to back beside it ([`hold`]). Per
/// phase: its wall-clock interval (to read the clocks and power an `nvidia-smi` log sampled
/// meanwhile), the transfer's GB/s over its windows, each window's milliseconds and the host
/// time of its enqueue, and the GEMM's mean milliseconds. Long phases average out what a window
/// of a few GEMMs cannot (the power cap's drift); the host's part of each transfer overlaps the
/// window before it, where the windowed rows count it.
fn hold_phases(
    cx: &mut Ctx<'_>,
    shapes: &[Shape],
    seconds: f64,
    gemm_ms: f64,
) -> Result<(), KernelError> {
    let order = [
        None,
        Some(Path::Memcpy),
        Some(Path::Auto),
        Some(Path::Auto),
        Some(Path::Memcpy),
        None,
    ];
    // Page size 1: the SGLang-style peer at its default launch and at block_quota 8 too.
    let page1 = [
        None,
        Some(Path::Memcpy),
        Some(Path::Auto),
        Some(Path::Peer(2)),
        Some(Path::Peer(8)),
        Some(Path::Auto),
        Some(Path::Memcpy),
        None,
    ];
    // `--token-variants` (page size 1, loads): the token kernel with an uploaded list on 2 and
    // 4 SMs, and over contiguous runs on 4 and all SMs, between the peer and the second chooser
    // phase.
    let variants = [
        None,
        Some(Path::Memcpy),
        Some(Path::Auto),
        Some(Path::Peer(2)),
        Some(Path::Peer(8)),
        Some(Path::RunKernel(Some(2))),
        Some(Path::RunKernel(Some(4))),
        Some(Path::SmContiguous(Some(4))),
        Some(Path::SmContiguous(None)),
        Some(Path::Auto),
        Some(Path::Memcpy),
        None,
    ];
    // `--backup-variants` (page size 1, backups): the run-list kernel on few blocks in all
    // (`paths::BACKUP_BLOCKS`) between the peer and the second chooser phase.
    let mut backup_variants = vec![
        None,
        Some(Path::Memcpy),
        Some(Path::Auto),
        Some(Path::Peer(2)),
    ];
    backup_variants.extend(crate::paths::BACKUP_BLOCKS.map(Some));
    backup_variants.extend([Some(Path::Auto), Some(Path::Memcpy), None]);
    // `--backup-shares` (page size 1, backups): the chooser's backups paced to other shares of
    // the host link (`paths::BACKUP_SHARES`) between the peer and the second chooser phase.
    let mut backup_shares = vec![
        None,
        Some(Path::Memcpy),
        Some(Path::Auto),
        Some(Path::Peer(2)),
    ];
    backup_shares.extend(crate::paths::BACKUP_SHARES.map(|p| Some(Path::AutoShare(p))));
    backup_shares.extend([Some(Path::Auto), Some(Path::Memcpy), None]);
    // `--paced-blocks` (page size 1, backups, on a carve-out): the paced token kernel on other
    // SMs x blocks (`paths::PACED_BLOCKS`) between the peer and the second chooser phase.
    let carveout_sms = sm_carveout().unwrap_or(2);
    let mut paced_blocks = vec![
        None,
        Some(Path::Memcpy),
        Some(Path::Auto),
        Some(Path::Peer(2)),
    ];
    paced_blocks.extend(crate::paths::PACED_BLOCKS.map(|(sms, per_sm)| {
        Some(Path::PacedBlocks(
            if sms == 0 { carveout_sms } else { sms },
            per_sm,
        ))
    }));
    paced_blocks.extend([Some(Path::Auto), Some(Path::Memcpy), None]);
    let paced = std::env::args().any(|a| a == "--paced-blocks");
    let token_variants = std::env::args().any(|a| a == "--token-variants");
    let backup_blocks = std::env::args().any(|a| a == "--backup-variants");
    let shares = std::env::args().any(|a| a == "--backup-shares");
    let verified = verify::hold_phases();
    for shape in shapes {
        let phases: &[Option<Path>] = if cx.verify.is_some() {
            &verified
        } else if shape.name.starts_with("page size 1") {
            if token_variants && shape.h2d {
                &variants
            } else if backup_blocks && !shape.h2d {
                &backup_variants
            } else if shares && !shape.h2d {
                &backup_shares
            } else if paced && !shape.h2d {
                &paced_blocks
            } else {
                &page1
            }
        } else {
            &order
        };
        for &path in phases {
            hold(cx, shape, path, seconds, gemm_ms)?;
            if let (Some(Path::Verified(Verifier::Kvlayout(_))), Some(v)) =
                (path, cx.verify.as_mut())
            {
                let (pages, bad) = v.take_counts()?;
                println!("    verified on the device: {pages} pages, {bad} mismatched");
            }
        }
    }
    Ok(())
}

/// The share of `span_ms` a stream spent in its rounds of `round_ms` each (rounds do not
/// overlap on one stream); 0 for an empty span.
fn busy_share(round_ms: &[f64], span_ms: f64) -> f64 {
    if span_ms > 0.0 {
        round_ms.iter().sum::<f64>() / span_ms
    } else {
        0.0
    }
}

/// Transfer windows the host keeps queued in a [`hold`] phase.
const HOLD_QUEUED_TRANSFERS: usize = 2;
/// Rounds of GEMMs the host keeps queued in a [`hold`] phase (12 x 16 GEMMs, about 310 ms:
/// longer than the host's enqueue of a 4,096-page load, 210-240 ms on the H200's host).
const HOLD_QUEUED_GEMM_ROUNDS: usize = 12;
/// GEMMs per round of the GEMM stream in a [`hold`] phase.
const HOLD_GEMMS_PER_ROUND: usize = 16;

/// One round on a stream of a [`hold`] phase: its start and end events.
struct HoldRound {
    start: CudaEvent,
    end: CudaEvent,
}

impl HoldRound {
    fn ms(&self) -> Result<f64, KernelError> {
        self.start
            .elapsed_ms(&self.end)
            .map(f64::from)
            .map_err(drv("cuEventElapsedTime"))
    }
}

/// One phase of [`hold_phases`]. The host feeds both streams on its own: it keeps
/// [`HOLD_QUEUED_TRANSFERS`] transfer windows and [`HOLD_QUEUED_GEMM_ROUNDS`] rounds of
/// [`HOLD_GEMMS_PER_ROUND`] GEMMs queued, enqueuing the next on a stream as soon as one of its rounds has ended, so
/// neither stream waits for the other and the host's part of a transfer (planning, checks)
/// overlaps the window before it, as in an engine that enqueues its next copy ahead (a split
/// load's run-list ring lets the host get only 8 launches
/// ahead of the GPU, so its enqueue time follows the GPU's). A window's time runs from the end
/// of the one before it (or its own enqueue, on an idle stream) to its end; the GEMM's
/// milliseconds are its counted rounds' time over their GEMMs. Only rounds that ended before
/// the phase's end count.
fn hold(
    cx: &mut Ctx<'_>,
    shape: &Shape,
    path: Option<Path>,
    seconds: f64,
    gemm_ms: f64,
) -> Result<(), KernelError> {
    if let Some(p) = path {
        alone_ms(cx, shape, p)?; // warm-up
    }
    kvlayout_kernels::host_timing::take_ns();
    let from = time_of_day();
    let clock = std::time::Instant::now();
    let (mut transfers, mut gemm_rounds): (Vec<HoldRound>, Vec<HoldRound>) = (vec![], vec![]);
    let (mut queued_transfers, mut queued_gemms): (Vec<HoldRound>, Vec<HoldRound>) =
        (vec![], vec![]);
    let mut host_ms = Vec::new();
    while clock.elapsed().as_secs_f64() < seconds {
        let mut idle = true;
        // Rounds that ended leave the queues first, so that the refills below see them gone.
        for (queued, done) in [
            (&mut queued_transfers, &mut transfers),
            (&mut queued_gemms, &mut gemm_rounds),
        ] {
            while queued.first().is_some_and(|r| r.end.is_complete()) {
                done.push(queued.remove(0));
                idle = false;
            }
        }
        // The GEMM queue refilled in full before a transfer is enqueued (from the phase's
        // start on): a transfer's host part may take several rounds' time.
        while queued_gemms.len() < HOLD_QUEUED_GEMM_ROUNDS {
            let (start, end) = (event(cx.gpu)?, event(cx.gpu)?);
            start
                .record(&cx.gemm.stream)
                .map_err(drv("cuEventRecord"))?;
            for _ in 0..HOLD_GEMMS_PER_ROUND {
                cx.gemm.enqueue()?;
            }
            end.record(&cx.gemm.stream).map_err(drv("cuEventRecord"))?;
            queued_gemms.push(HoldRound { start, end });
            idle = false;
        }
        if let Some(p) = path.filter(|_| queued_transfers.len() < HOLD_QUEUED_TRANSFERS) {
            let (start, end) = (event(cx.gpu)?, event(cx.gpu)?);
            start
                .record(cx.gpu.stream())
                .map_err(drv("cuEventRecord"))?;
            let host = std::time::Instant::now();
            enqueue(cx, shape, p)?;
            cx.gpu.join_staged()?;
            host_ms.push(host.elapsed().as_secs_f64() * 1e3);
            end.record(cx.gpu.stream()).map_err(drv("cuEventRecord"))?;
            queued_transfers.push(HoldRound { start, end });
            idle = false;
        }
        if idle {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }
    // The phase ends here for the `nvidia-smi` slice: the rounds still queued run on while
    // the streams drain, and are not counted.
    let to = time_of_day();
    cx.gpu.finish()?;
    cx.gemm
        .stream
        .synchronize()
        .map_err(drv("cuStreamSynchronize"))?;
    // Only rounds that ended inside the phase count (the ones queued at its end ran partly
    // after the other stream's last round).
    let round_ms: Vec<f64> = transfers
        .iter()
        .map(HoldRound::ms)
        .collect::<Result<_, _>>()?;
    let gemm_round_ms: Vec<f64> = gemm_rounds
        .iter()
        .map(HoldRound::ms)
        .collect::<Result<_, _>>()?;
    let gemms = gemm_rounds.len() * HOLD_GEMMS_PER_ROUND;
    let each_ms = gemm_round_ms.iter().sum::<f64>() / gemms.max(1) as f64;
    // The GEMM stream's busy share of its counted rounds' span: below 1 where the host left it
    // idle (then the transfer ran partly without the GEMM beside it, and the GEMM figure does
    // not hold).
    let gemm_busy = match (gemm_rounds.first(), gemm_rounds.last()) {
        (Some(first), Some(last)) => {
            let span = f64::from(
                first
                    .start
                    .elapsed_ms(&last.end)
                    .map_err(drv("cuEventElapsedTime"))?,
            );
            busy_share(&gemm_round_ms, span)
        }
        _ => 0.0,
    };
    let label = path.map_or("GEMM only".to_string(), |p| p.label());
    let spread = |v: &[f64]| {
        if v.is_empty() {
            return "-".to_string();
        }
        let st = stat(v.to_vec());
        format!("{:.2} ({:.2}-{:.2})", st.median, st.lo, st.hi)
    };
    let rate = match path {
        Some(_) if transfers.is_empty() => "no window ended inside the phase".to_string(),
        Some(_) => {
            let window_bytes = shape.bytes() * shape.burst as u64;
            let all_ms: f64 = round_ms.iter().sum();
            format!(
                "{} x {:.1} MB in {all_ms:.1} ms: {:.2} GB/s; window ms {}, host enqueue ms {}",
                transfers.len(),
                window_bytes as f64 / 1e6,
                report::gbps(window_bytes * transfers.len() as u64, all_ms),
                spread(&round_ms),
                spread(&host_ms),
            )
        }
        None => "no transfer".to_string(),
    };
    println!(
        "HOLD {} | {label} | {from}-{to} UTC | {rate} | {gemms} GEMMs, {each_ms:.4} ms each ({:+.2}% against the GEMM alone, {gemm_ms:.4} ms), GEMM stream busy {:.3} of its rounds' span",
        shape.name,
        100.0 * (each_ms / gemm_ms - 1.0),
        gemm_busy,
    );
    let steps_ns = kvlayout_kernels::host_timing::take_ns();
    if steps_ns[0] > 0 && !host_ms.is_empty() {
        let per_window = |ns: u64| ns as f64 / 1e6 / host_ms.len() as f64;
        println!(
            "    chooser host ms per window (feature host-timing): call {:.2}, scan {:.2}, ring wait {:.2}, list write {:.2}, driver {:.2}, host order {:.2}",
            per_window(steps_ns[0]),
            per_window(steps_ns[1]),
            per_window(steps_ns[2]),
            per_window(steps_ns[3]),
            per_window(steps_ns[4]),
            per_window(steps_ns[5]),
        );
    }
    Ok(())
}

/// `sweep`: only the copy-engine variants (order, hint, streams, runs per call) on the large
/// page transfers.
/// `small`: only the 1- and 8-page transfers, memcpy, the driver's batch and the chooser.
pub fn run(mode: Mode) -> Result<(), KernelError> {
    let (sweep, small) = (mode == Mode::Sweep, mode == Mode::Small);
    let gpu = Gpu::new(0)?;
    gpu.compile()?;
    let name = gpu.context().name().unwrap_or_default();
    println!("device: {name}, {} SMs, {}", gpu.sm_count(), gpu.arch());
    println!(
        "host link, device to host (copy engines, 8 MiB, best of 4): {} MB/s",
        gpu.host_link_bytes_per_us()?
    );
    for k in gpu.kernel_report()? {
        println!(
            "kernel {}: {} registers, {} blocks of 256 threads per SM",
            k.name, k.registers, k.blocks_per_sm
        );
    }
    let host_pool = dsa_pool(MemoryLayout::PageFirst);
    let dev_pool = dsa_pool(MemoryLayout::LayerFirst);
    // `--page-size-1`: only the page-size-1 workloads (Llama-3.1-8B and DeepSeek-V3 MLA),
    // in buffers large enough for the larger of their pools.
    let page1 = std::env::args().any(|a| a == "--page-size-1");
    let page1_pools = [true, false].map(|llama| {
        (
            page1_pool(llama, MemoryLayout::PageFirst),
            page1_pool(llama, MemoryLayout::LayerFirst),
        )
    });
    let total = if page1 {
        let mut most = 0;
        for (h, d) in &page1_pools {
            most = most.max(h.total_bytes()?).max(d.total_bytes()?);
        }
        most as usize
    } else {
        host_pool.total_bytes()? as usize
    };
    let fill = |bytes: &mut [u8]| {
        std::thread::scope(|s| {
            for (c, chunk) in bytes.chunks_mut(1 << 30).enumerate() {
                s.spawn(move || {
                    for (i, w) in chunk.chunks_exact_mut(8).enumerate() {
                        let x = ((c as u64) << 32 | i as u64)
                            .wrapping_add(1)
                            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
                        w.copy_from_slice(&x.to_le_bytes());
                    }
                });
            }
        })
    };
    let host: Box<dyn GpuBytes> = {
        let mut p = gpu.alloc_pinned(total)?;
        fill(p.as_mut_slice());
        Box::new(p)
    };
    let dev = gpu.alloc_device(total)?;
    println!(
        "pools: {} pages x 61 layers x (656 + 132) B/token x 64 tokens = {:.2} GB each side",
        host_pool.pages,
        total as f64 / 1e9
    );

    let peer = load_module(&gpu, PEER_SOURCE)?
        .load_function("sglang_warp_copy")
        .map_err(drv("cuModuleGetFunction"))?;

    let stream = gpu.context().new_stream().map_err(drv("cuStreamCreate"))?;
    let blas = CudaBlas::new(stream.clone()).map_err(|e| KernelError::Driver {
        call: "cublasCreate",
        message: format!("{e:?}"),
    })?;
    let mut rng = SplitMix64::new(11);
    let mut matrix = || -> Result<CudaSlice<bf16>, KernelError> {
        let v: Vec<bf16> = (0..GEMM_N * GEMM_N)
            .map(|_| {
                bf16::from_f32((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
            })
            .collect();
        stream.clone_htod(&v).map_err(drv("cuMemcpyHtoD"))
    };
    let (a, b, c) = (matrix()?, matrix()?, matrix()?);
    let gemm = GemmLoop {
        stream: stream.clone(),
        blas,
        a,
        b,
        c,
    };
    let mut cx = Ctx {
        gpu: &gpu,
        host_ms: 0.0,
        host,
        dev,
        peer,
        gemm,
        verify: None,
    };

    let mut gemm_ms = gemm_alone(&gpu, &mut cx.gemm)?;
    if let Some(k) = sm_carveout() {
        // `--sm-carveout K`: the model's cuBLAS handle targets all SMs but K
        // (`cublasSetSmCountTarget`), leaving K to a copy kernel; the chooser is told.
        gpu.set_model_carveout_sms(k)?;
        let full = gemm_ms.median;
        // `--verify-sms V`: the GEMM leaves V more SMs, for the verification alone (the
        // chooser is told K only).
        let target = gpu.sm_count().saturating_sub(k + verify_sms()) as i32;
        // SAFETY: a live cuBLAS handle; the call only sets a field of it.
        let st =
            unsafe { cudarc::cublas::sys::cublasSetSmCountTarget(*cx.gemm.blas.handle(), target) };
        if st != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(KernelError::Driver {
                call: "cublasSetSmCountTarget",
                message: format!("{st:?}"),
            });
        }
        gemm_ms = gemm_alone(&gpu, &mut cx.gemm)?;
        println!(
            "GEMM with an SM target of {target} (carve-out {k}, verify SMs {}): {:.3} ms, {:+.1}% against all SMs ({full:.3} ms); GEMM slowed below is against this",
            verify_sms(),
            gemm_ms.median,
            (gemm_ms.median / full - 1.0) * 100.0
        );
    }
    let flop = 2.0 * (GEMM_N as f64).powi(3);
    println!(
        "GEMM bf16 {GEMM_N}^3 alone: {:.3} ms ({:.0} TFLOP/s), range {:.3}-{:.3} ms",
        gemm_ms.median,
        flop / gemm_ms.median / 1e9,
        gemm_ms.lo,
        gemm_ms.hi
    );

    let mut shapes = Vec::new();
    if page1 {
        for (h, d) in &page1_pools {
            println!(
                "page-size-1 pools: {} ({:.2} GB) and {} ({:.2} GB)",
                h.name,
                h.total_bytes()? as f64 / 1e9,
                d.name,
                d.total_bytes()? as f64 / 1e9
            );
            for h2d in [true, false] {
                if direction_wanted(h2d) {
                    shapes.push(page1_shape(&gpu, &mut rng, h, d, h2d)?);
                }
            }
        }
    }
    let all_shapes = [
        (1024u64, 61u64, true, true, 1usize, false),
        (1024, 61, false, false, 1, false),
        (4096, 61, true, true, 1, false),
        (4096, 61, false, false, 1, false),
        (1024, 61, true, true, 1, true),
        (8, 1, true, true, 500, false),
        (8, 1, false, true, 500, false),
        (1, 1, true, true, 2000, false),
        (1, 1, false, true, 2000, false),
        (1024, 61, false, false, 1, true),
    ];
    let picked = all_shapes
        .into_iter()
        .enumerate()
        .filter(|&(i, (_, _, h2d, ..))| {
            let shown = if sweep {
                i < 3
            } else if small {
                (5..9).contains(&i)
            } else {
                !page1
            };
            let verify_only = !std::env::args().any(|a| a == "--verify") || i == 0;
            shown && direction_wanted(h2d) && verify_only
        });
    for (_, (pages, layers, h2d, lbl, burst, consecutive)) in picked {
        shapes.push(page_shape(
            &gpu,
            &mut rng,
            &host_pool,
            &dev_pool,
            pages,
            layers,
            h2d,
            lbl,
            burst,
            consecutive,
        )?);
    }
    let verifying = std::env::args().any(|a| a == "--verify");
    if !sweep && !small && !page1 && !verifying && direction_wanted(true) {
        shapes.push(token_shape(&gpu, &mut rng, &host_pool, &dev_pool, 256)?);
    }

    if verifying {
        // The verification planned, the load done once (the device pool then holds the loaded
        // pages), each verifier timed alone over it.
        let adler = verify::adler_kernels(&load_module(&gpu, verify::ADLER_SOURCE)?)?;
        let host = || {
            cx.host.host_bytes().ok_or_else(|| {
                KernelError::Unsupported("--verify needs host-visible pinned memory".into())
            })
        };
        let mut v = Verify::new(
            &gpu,
            &shapes,
            &dev_pool,
            cx.dev.device_address(),
            host()?,
            adler,
        )?;
        for shape in shapes.iter().filter(|s| s.h2d) {
            alone_ms(&mut cx, shape, Path::Auto)?;
            let host = cx.host.host_bytes().unwrap_or(&[]);
            v.report_alone(&gpu, shape, host)?;
        }
        cx.verify = Some(v);
    }
    if let Some(seconds) = hold_seconds()? {
        return hold_phases(&mut cx, &shapes, seconds, gemm_ms.median);
    }

    let mut rows = Vec::new();
    for shape in &shapes {
        let paths = paths::for_shape(shape, mode);
        let bytes = shape.bytes() * shape.burst as u64;
        let mut ceiling = (0.0, 0.0);
        for path in paths {
            let m = measure(&mut cx, shape, path, gemm_ms.median)?;
            if matches!(path, Path::Memcpy) {
                ceiling = (m.alone.median, m.next.median);
            }
            let row = Row {
                shape: shape.name.clone(),
                path: path.label(),
                bytes,
                alone: m.alone,
                next: m.next,
                slowdown: m.slowdown,
                ceiling_alone_ms: ceiling.0,
                ceiling_next_ms: ceiling.1,
                loop_outlasted: m.outlasted,
            };
            print_row(&row, shape.burst);
            let outside = m.slowdown_outside;
            println!(
                "    GEMM slowed against its GEMMs outside the window (the earlier measure): {:+.1}% ({:+.1} to {:+.1})",
                100.0 * outside.median,
                100.0 * outside.lo,
                100.0 * outside.hi
            );
            if sweep {
                println!(
                    "    host enqueue time of the last alone window: {:.2} ms",
                    cx.host_ms
                );
            }
            rows.push(row);
        }
    }
    report::print_table(&name, gpu.sm_count(), gemm_ms.median, &rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{busy_share, clock_of_day, overlaps, paired_slowdown};

    #[test]
    fn clock_of_day_reads_utc_hours_minutes_seconds_millis() {
        // 2026-12-01 21:32:39.744 UTC: 20,788 days since 1970-01-01 (56 years, 14 of them
        // leap, to 2026-01-01 = 20,454 days, plus 334 days to December 1st).
        let day_ms: u128 = 20_788 * 86_400_000;
        let at_ms = day_ms + ((21 * 60 + 32) * 60 + 39) * 1000 + 744;
        assert_eq!(clock_of_day(at_ms), "21:32:39.744");
        assert_eq!(clock_of_day(day_ms), "00:00:00.000");
        assert_eq!(clock_of_day(day_ms - 1), "23:59:59.999");
    }

    #[test]
    fn busy_share_is_the_rounds_over_the_span() {
        // Three rounds of 20 ms in a 75 ms span: 60 / 75 = 0.8.
        assert!((busy_share(&[20.0, 20.0, 20.0], 75.0) - 0.8).abs() < 1e-12);
        assert_eq!(busy_share(&[1.0], 0.0), 0.0);
    }

    #[test]
    fn a_gemm_overlaps_the_window_by_any_shared_time_only() {
        let window = (10.0, 20.0);
        // Ends touching the window's start or end share no time.
        assert!(!overlaps((8.0, 10.0), window));
        assert!(!overlaps((20.0, 22.0), window));
        // Starting before and ending inside, inside, spanning, starting inside and ending after.
        assert!(overlaps((9.0, 10.5), window));
        assert!(overlaps((12.0, 14.0), window));
        assert!(overlaps((5.0, 25.0), window));
        assert!(overlaps((19.5, 21.0), window));
        // Wholly before or after.
        assert!(!overlaps((1.0, 2.0), window));
        assert!(!overlaps((21.0, 22.0), window));
    }

    #[test]
    fn paired_slowdown_compares_only_the_window_positions() {
        // GEMMs 1 and 2 overlapped the transfer: (1.1 + 1.2) / (1.0 + 1.0) - 1 = 0.15; GEMMs 0
        // and 3 (outside) do not count, however slow.
        let window = [(9.0, false), (1.1, true), (1.2, true), (9.0, false)];
        let control = [1.0, 1.0, 1.0, 1.0];
        assert!((paired_slowdown(&window, &control) - 0.15).abs() < 1e-12);
    }

    #[test]
    fn paired_slowdown_cancels_a_drift_both_loops_share() {
        // The loop slows from 1.0 to 1.3 ms over its length with or without the transfer: no
        // slowdown, where the median of the outside GEMMs (1.3 ms) would read
        // (1.1 + 1.2) / (2 x 1.3) - 1 = -0.115.
        let window = [
            (1.0, false),
            (1.1, true),
            (1.2, true),
            (1.3, false),
            (1.3, false),
        ];
        let control = [1.0, 1.1, 1.2, 1.3, 1.3];
        assert!(paired_slowdown(&window, &control).abs() < 1e-12);
    }

    #[test]
    fn paired_slowdown_of_no_overlap_is_zero() {
        assert_eq!(paired_slowdown(&[(1.0, false)], &[2.0]), 0.0);
    }
}
