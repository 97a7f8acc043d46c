//! GPU benchmark of the kernels crate, all figures from one run on one device:
//! (a) pinned `cuMemcpyAsync` of the same bytes (the ceiling); (b) the checked transfer
//! (validation kernel + copy kernel), token- and page-granular, host->device and
//! device->host, DeepSeek-V3.2 geometry (61 layers, 64-token pages, MLA 656 B + index-K fp8
//! 132 B per token) and index-K bf16 (256 B), for 1, 64 and 4096 pages; (c) one
//! `cuMemcpyAsync` per item (a naive host pool); the fp8 index-K quantizer against the
//! device-to-device copy rate. Times are CUDA-event medians after warm-up.
//!
//! `gpu_bench [--dump DIR]`: with `--dump`, also writes quantizer inputs and outputs to DIR for
//! `kernels/scripts/torch_check.py` (PyTorch's float8_e4m3fn conversion of the same input).
//!
//! `gpu_bench --overlap`: every transfer path alone and next to a bf16 GEMM loop (see
//! `overlap.rs`), DeepSeek-V3.2 DSA pools, 1,024 and 4,096 pages x 61 layers, 8 pages and 1 page
//! of 1 layer, and a token-granular load. `--overlap-small`: only the 1- and 8-page rows of the
//! driver's batch and the chooser. `--dma-sweep`: copy-engine variants on the large transfers.
//! `--explore`: the candidate designs of `explore.rs` (pitched 2D copies, lanes; with
//! `--candidates` also two copy-engine streams, host threads and a high-priority kernel; with
//! `--subsets` the MLA and index-K runs alone; with `--spin` a resident kernel's cost to the
//! GEMM). `--sm-carveout K` (any mode): the GEMM leaves K SMs (`cublasSetSmCountTarget`) and
//! the chooser is told (`Gpu::set_model_carveout_sms`); with `--explore`, SM-kernel shapes on
//! the carve-out, or with `--gather` the device-gather candidates and plain copies of
//! contiguous pieces on random and consecutive backups. `--auto-only`: the ceiling and the
//! chooser rows only. `--split-share` (with `--explore --sm-carveout K`): loads split between
//! the kernel on the carve-out and the copy engines at several shares. `--loads-only` (with
//! `--explore --sm-carveout K`): the two large loads only; `--backups-only`: the two large
//! backups only. `--pair-major`: page transfers' runs laid page pair by page pair, as the
//! pool shim lays them (else buffer by buffer, layer by layer). `--hold SECONDS` (with
//! `--overlap` or `--explore`, on the shapes those flags pick): instead of windows, long phases
//! of the GEMM loop alone, beside memcpy and beside the chooser, each stream fed without a
//! pause, with wall-clock intervals to read an `nvidia-smi` log by (`overlap.rs`).

mod explore;
mod overlap;
mod paths;
mod quantizer;
mod report;
mod workload;

use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};
use kvlayout_kernels::test_data::SplitMix64;
use kvlayout_kernels::{
    ByteRun, CopyOrder, CopySpec, DeviceBytes, DeviceIndices, Gpu, GpuBytes, Granularity,
    KernelError, LaunchShape, PinnedBytes, RunOrder, Side,
};

const LAYERS: u64 = 61;
const PAGE_TOKENS: u64 = 64;
const POOL_PAGES: u64 = 4096;

fn pool(memory_layout: MemoryLayout) -> PoolGeometry {
    PoolGeometry {
        name: format!("DeepSeek-V3.2 {memory_layout}"),
        page_size_tokens: PAGE_TOKENS,
        pages: POOL_PAGES,
        memory_layout,
        buffers: vec![
            BufferGeometry::new("kv", LAYERS, formats::DSA_MLA_FP8),
            BufferGeometry::new("index_k", LAYERS, formats::INDEX_K_FP8),
            BufferGeometry::new("index_k_bf16", LAYERS, formats::INDEX_K_BF16),
        ],
    }
}

/// Times `reps` runs of `f` with CUDA events (one pair per run) after `warmup` runs; returns
/// the median in seconds.
fn time_median(
    gpu: &Gpu,
    warmup: usize,
    reps: usize,
    mut f: impl FnMut() -> Result<(), KernelError>,
) -> Result<f64, KernelError> {
    for _ in 0..warmup {
        f()?;
    }
    gpu.finish()?;
    let ctx = gpu.context();
    let drv = |e| KernelError::Driver {
        call: "event",
        message: format!("{e:?}"),
    };
    let events: Vec<_> = (0..=reps)
        .map(|_| ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)))
        .collect::<Result<_, _>>()
        .map_err(drv)?;
    for e in events.iter().take(reps) {
        e.record(gpu.stream()).map_err(drv)?;
        f()?;
    }
    events[reps].record(gpu.stream()).map_err(drv)?;
    gpu.finish()?;
    let mut ms: Vec<f64> = events
        .windows(2)
        .map(|w| w[0].elapsed_ms(&w[1]).map(f64::from))
        .collect::<Result<_, _>>()
        .map_err(drv)?;
    ms.sort_by(|a, b| a.total_cmp(b));
    let median = ms[ms.len() / 2];
    let (lo, hi) = (ms[0], ms[ms.len() - 1]);
    if hi > 1.1 * lo && median > 1.0 {
        // Spread over 10% on a long transfer: print it, so a noisy row can be recognised.
        eprintln!(
            "  (spread: min {lo:.3} ms, median {median:.3} ms, max {hi:.3} ms over {reps} runs)"
        );
    }
    Ok(median / 1e3)
}

fn reps_for(bytes: u64) -> (usize, usize) {
    match bytes {
        0..=10_000_000 => (20, 101),
        10_000_001..=1_000_000_000 => (3, 21),
        _ => (1, 9),
    }
}

struct Row {
    what: String,
    bytes: u64,
    secs: f64,
    ceiling_secs: f64,
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn main() -> Result<(), KernelError> {
    for (flag, mode) in [
        ("--overlap", paths::Mode::Full),
        ("--overlap-small", paths::Mode::Small),
        ("--dma-sweep", paths::Mode::Sweep),
        ("--explore", paths::Mode::Explore),
    ] {
        if std::env::args().any(|a| a == flag) {
            return overlap::run(mode);
        }
    }
    let dump = std::env::args().skip_while(|a| a != "--dump").nth(1);
    let t0 = Instant::now();
    let gpu = Gpu::new(0)?;
    gpu.compile()?;
    let name = gpu.context().name().unwrap_or_default();
    println!(
        "device: {name}, {} SMs, {}; kernels compiled in {:.0} ms",
        gpu.sm_count(),
        gpu.arch(),
        t0.elapsed().as_secs_f64() * 1e3
    );

    for r in gpu.kernel_report()? {
        println!(
            "kernel {:<22} {:>3} registers, {:>2} blocks of 256 per SM",
            r.name, r.registers, r.blocks_per_sm
        );
    }
    let device_pool = pool(MemoryLayout::LayerFirst);
    let host_pool = pool(MemoryLayout::PageFirst);
    let total = device_pool.total_bytes()? as usize;
    println!(
        "pools: {POOL_PAGES} pages x {LAYERS} layers x (656 + 132 + 256) B/token x {PAGE_TOKENS} tokens = {:.2} GB each side",
        total as f64 / 1e9
    );
    let t = Instant::now();
    let mut host = gpu.alloc_pinned(total)?;
    // Non-zero pattern (a multiplicative hash of the word index), fast to write.
    for (i, w) in host.as_mut_slice().chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&((i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes());
    }
    let mut dev = gpu.alloc_device(total)?;
    // SAFETY: both buffers are live and `total` bytes long; finish() waits.
    unsafe { gpu.enqueue_memcpy(dev.device_address(), host.device_address(), total as u64)? };
    gpu.finish()?;
    println!("allocated and filled in {:.1} s", t.elapsed().as_secs_f64());

    let mut rng = SplitMix64::new(42);
    let mut rows: Vec<Row> = Vec::new();
    let mut naive_rows: Vec<(String, u64, f64, f64)> = Vec::new();
    let shape = LaunchShape::default();

    for (buffer, label) in [
        (0usize, "MLA fp8 656 B"),
        (1, "index-K fp8 132 B"),
        (2, "index-K bf16 256 B"),
    ] {
        for granularity in [Granularity::Token, Granularity::Page] {
            for pages in [1u64, 64, 4096] {
                for h2d in [true, false] {
                    let (sp, dp) = if h2d {
                        (&host_pool, &device_pool)
                    } else {
                        (&device_pool, &host_pool)
                    };
                    let specs = CopySpec::for_pool_buffer(sp, dp, buffer, granularity, 0..LAYERS)?;
                    // Random distinct pages on each side; token lists cover every token of them.
                    let src_pages = rng.distinct_below(POOL_PAGES, pages as usize);
                    let dst_pages = rng.distinct_below(POOL_PAGES, pages as usize);
                    let expand = |ps: &[u64]| -> Vec<u64> {
                        match granularity {
                            Granularity::Page => ps.to_vec(),
                            Granularity::Token => ps
                                .iter()
                                .flat_map(|p| (0..PAGE_TOKENS).map(move |t| p * PAGE_TOKENS + t))
                                .collect(),
                        }
                    };
                    let (si, di) = (expand(&src_pages), expand(&dst_pages));
                    let gsi = gpu.upload_indices(&si)?;
                    let gdi = gpu.upload_indices(&di)?;
                    let bytes: u64 = specs
                        .iter()
                        .map(|s| s.bytes_moved(si.len() as u64))
                        .sum::<Result<u64, _>>()?;
                    let (warm, reps) = reps_for(bytes);
                    let dir = if h2d { "H2D" } else { "D2H" };
                    let secs = if h2d {
                        time_median(&gpu, warm, reps, || {
                            run_specs(&gpu, &specs, &host, &mut dev, &gsi, &gdi, shape)
                        })?
                    } else {
                        time_median(&gpu, warm, reps, || {
                            run_specs(&gpu, &specs, &dev, &mut host, &gsi, &gdi, shape)
                        })?
                    };
                    let ceiling_secs = memcpy_secs(&gpu, &host, &dev, bytes, h2d)?;
                    let what = format!("{label} {granularity:?} {dir} {pages} pages");
                    println!(
                        "{what:<44} {:>10.3} MB {:>8.2} GB/s  memcpy {:>6.2} GB/s  ratio {:.3}",
                        bytes as f64 / 1e6,
                        gbps(bytes, secs),
                        gbps(bytes, ceiling_secs),
                        ceiling_secs / secs
                    );
                    rows.push(Row {
                        what,
                        bytes,
                        secs,
                        ceiling_secs,
                    });

                    // (c) one cuMemcpyAsync per item, for 1 and 64 pages.
                    if pages <= 64 {
                        let naive = naive_secs(&gpu, &specs, &host, &dev, &si, &di, h2d)?;
                        naive_rows.push((
                            format!("{label} {granularity:?} {dir} {pages} pages"),
                            bytes,
                            naive,
                            secs,
                        ));
                    }
                }
            }
        }
    }

    // Run lists as the pool shim plans them: one (src, dst, len) run per page of one layer of
    // one buffer, offsets from PoolGeometry::page_offset_bytes; MLA and index-K fp8 together.
    for pages in [1u64, 64, 4096] {
        for h2d in [true, false] {
            let (sp, dp) = if h2d {
                (&host_pool, &device_pool)
            } else {
                (&device_pool, &host_pool)
            };
            let src_pages = rng.distinct_below(POOL_PAGES, pages as usize);
            let dst_pages = rng.distinct_below(POOL_PAGES, pages as usize);
            let mut runs = Vec::new();
            for b in [0usize, 1] {
                let len = sp.stored_page_bytes(b)?;
                for layer in 0..LAYERS {
                    for (&s, &d) in src_pages.iter().zip(&dst_pages) {
                        runs.push(ByteRun::new(
                            sp.page_offset_bytes(b, layer, s)?,
                            dp.page_offset_bytes(b, layer, d)?,
                            len,
                        ));
                    }
                }
            }
            let bytes: u64 = runs.iter().map(|r| r.len_bytes).sum();
            let (warm, reps) = reps_for(bytes);
            for order in [
                RunOrder::AsGiven,
                if h2d {
                    RunOrder::SrcAscending
                } else {
                    RunOrder::DstAscending
                },
            ] {
                let gruns = gpu.upload_runs(&runs, order)?;
                let secs = if h2d {
                    time_median(&gpu, warm, reps, || unsafe {
                        // SAFETY: buffers live until finish() inside time_median.
                        gpu.enqueue_copy_runs(&host, &mut dev, &gruns, shape)
                    })?
                } else {
                    time_median(&gpu, warm, reps, || unsafe {
                        // SAFETY: as above.
                        gpu.enqueue_copy_runs(&dev, &mut host, &gruns, shape)
                    })?
                };
                let ceiling_secs = memcpy_secs(&gpu, &host, &dev, bytes, h2d)?;
                let what = format!(
                    "run list (MLA + index-K fp8 pages) {} {pages} pages, {} runs, {order:?}",
                    if h2d { "H2D" } else { "D2H" },
                    runs.len()
                );
                println!(
                    "{what:<70} {:>8.2} GB/s ratio {:.3}",
                    gbps(bytes, secs),
                    ceiling_secs / secs
                );
                rows.push(Row {
                    what,
                    bytes,
                    secs,
                    ceiling_secs,
                });
            }
        }
    }

    // One page of one layer (41984 B of MLA, 8448 B of index-K fp8): the smallest transfer a
    // HiCache layer-by-layer load makes, against which a per-transfer check is weighed.
    for (buffer, label) in [(0usize, "MLA fp8 656 B"), (1, "index-K fp8 132 B")] {
        for granularity in [Granularity::Page, Granularity::Token] {
            for h2d in [true, false] {
                let (sp, dp) = if h2d {
                    (&host_pool, &device_pool)
                } else {
                    (&device_pool, &host_pool)
                };
                let specs = CopySpec::for_pool_buffer(sp, dp, buffer, granularity, 5..6)?;
                let (sp_page, dp_page) = (rng.below(POOL_PAGES), rng.below(POOL_PAGES));
                let (si, di): (Vec<u64>, Vec<u64>) = match granularity {
                    Granularity::Page => (vec![sp_page], vec![dp_page]),
                    Granularity::Token => (
                        (0..PAGE_TOKENS)
                            .map(|t| sp_page * PAGE_TOKENS + t)
                            .collect(),
                        (0..PAGE_TOKENS)
                            .map(|t| dp_page * PAGE_TOKENS + t)
                            .collect(),
                    ),
                };
                let (gsi, gdi) = (gpu.upload_indices(&si)?, gpu.upload_indices(&di)?);
                let bytes: u64 = specs
                    .iter()
                    .map(|s| s.bytes_moved(si.len() as u64))
                    .sum::<Result<u64, _>>()?;
                let secs = if h2d {
                    time_median(&gpu, 20, 201, || {
                        run_specs(&gpu, &specs, &host, &mut dev, &gsi, &gdi, shape)
                    })?
                } else {
                    time_median(&gpu, 20, 201, || {
                        run_specs(&gpu, &specs, &dev, &mut host, &gsi, &gdi, shape)
                    })?
                };
                let ceiling_secs = memcpy_secs(&gpu, &host, &dev, bytes, h2d)?;
                let what = format!(
                    "{label} {granularity:?} {} 1 page of 1 layer ({:.1} us)",
                    if h2d { "H2D" } else { "D2H" },
                    secs * 1e6
                );
                println!(
                    "{what:<70} {:>8.2} GB/s ratio {:.3}",
                    gbps(bytes, secs),
                    ceiling_secs / secs
                );
                rows.push(Row {
                    what,
                    bytes,
                    secs,
                    ceiling_secs,
                });
            }
        }
    }

    // Work order and SM cap, 4096 pages of the MLA buffer, both granularities.
    for granularity in [Granularity::Page, Granularity::Token] {
        for h2d in [true, false] {
            let (sp, dp) = if h2d {
                (&host_pool, &device_pool)
            } else {
                (&device_pool, &host_pool)
            };
            let specs = CopySpec::for_pool_buffer(sp, dp, 0, granularity, 0..LAYERS)?;
            let pages = rng.distinct_below(POOL_PAGES, 4096);
            let pages2 = rng.distinct_below(POOL_PAGES, 4096);
            let expand = |ps: &[u64]| -> Vec<u64> {
                match granularity {
                    Granularity::Page => ps.to_vec(),
                    Granularity::Token => ps
                        .iter()
                        .flat_map(|p| (0..PAGE_TOKENS).map(move |t| p * PAGE_TOKENS + t))
                        .collect(),
                }
            };
            let (si, di) = (expand(&pages), expand(&pages2));
            let (gsi, gdi) = (gpu.upload_indices(&si)?, gpu.upload_indices(&di)?);
            let bytes = specs[0].bytes_moved(si.len() as u64)?;
            for (sms, order) in [
                (None, CopyOrder::LayerThenItem),
                (None, CopyOrder::PageThenLayer),
                (Some(16), CopyOrder::Auto),
                (Some(32), CopyOrder::Auto),
            ] {
                let capped = LaunchShape {
                    max_sms: sms,
                    blocks_per_sm: 8,
                    order,
                };
                let secs = if h2d {
                    time_median(&gpu, 1, 5, || {
                        run_specs(&gpu, &specs, &host, &mut dev, &gsi, &gdi, capped)
                    })?
                } else {
                    time_median(&gpu, 1, 5, || {
                        run_specs(&gpu, &specs, &dev, &mut host, &gsi, &gdi, capped)
                    })?
                };
                let ceiling_secs = memcpy_secs(&gpu, &host, &dev, bytes, h2d)?;
                let sm_text = sms.map_or("all SMs".to_string(), |n| format!("{n} SMs"));
                let what = format!(
                    "MLA fp8 656 B {granularity:?} {} 4096 pages, {sm_text}, {order:?}",
                    if h2d { "H2D" } else { "D2H" }
                );
                println!(
                    "{what:<70} {:>8.2} GB/s ratio {:.3}",
                    gbps(bytes, secs),
                    ceiling_secs / secs
                );
                rows.push(Row {
                    what,
                    bytes,
                    secs,
                    ceiling_secs,
                });
            }
        }
    }
    drop(host);
    drop(dev);

    let quant = quantizer::quantizer_bench(&gpu, dump.as_deref())?;

    println!(
        "\n## GPU benchmark ({name}, {} SMs, {})\n",
        gpu.sm_count(),
        gpu.arch()
    );
    println!(
        "| transfer (61 layers, host page_first <-> device layer_first) | bytes | kernel GB/s | memcpy GB/s | ratio to memcpy |"
    );
    println!("|---|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.3} |",
            r.what,
            r.bytes,
            gbps(r.bytes, r.secs),
            gbps(r.bytes, r.ceiling_secs),
            r.ceiling_secs / r.secs
        );
    }
    println!(
        "\n| naive: one cuMemcpyAsync per item | bytes | naive GB/s | kernel GB/s | kernel / naive |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (what, bytes, naive, kernel) in &naive_rows {
        println!(
            "| {what} | {bytes} | {:.3} | {:.2} | {:.1}x |",
            gbps(*bytes, *naive),
            gbps(*bytes, *kernel),
            naive / kernel
        );
    }
    println!("\n{quant}");
    println!("total wall time {:.1} s", t0.elapsed().as_secs_f64());
    Ok(())
}

fn run_specs(
    gpu: &Gpu,
    specs: &[CopySpec],
    src: &dyn GpuBytes,
    dst: &mut dyn GpuBytes,
    si: &DeviceIndices,
    di: &DeviceIndices,
    shape: LaunchShape,
) -> Result<(), KernelError> {
    // SAFETY: the buffers outlive the timing loop, which ends in gpu.finish().
    unsafe { gpu.enqueue_copy_items_multi(specs, src, dst, si, di, shape) }
}

fn memcpy_secs(
    gpu: &Gpu,
    host: &PinnedBytes,
    dev: &DeviceBytes,
    bytes: u64,
    h2d: bool,
) -> Result<f64, KernelError> {
    let (warm, reps) = reps_for(bytes);
    let (h, d) = (host.device_address(), dev.device_address());
    time_median(gpu, warm, reps, || {
        // SAFETY: both buffers hold at least `bytes` bytes (the same bytes the kernel moved).
        unsafe {
            if h2d {
                gpu.enqueue_memcpy(d, h, bytes)
            } else {
                gpu.enqueue_memcpy(h, d, bytes)
            }
        }
    })
}

/// One cuMemcpyAsync per item per layer (per part for section_major tokens).
fn naive_secs(
    gpu: &Gpu,
    specs: &[CopySpec],
    host: &PinnedBytes,
    dev: &DeviceBytes,
    si: &[u64],
    di: &[u64],
    h2d: bool,
) -> Result<f64, KernelError> {
    let (h, d) = (host.device_address(), dev.device_address());
    let (src_base, dst_base) = if h2d { (h, d) } else { (d, h) };
    let mut plan: Vec<(u64, u64, u64)> = Vec::new();
    for spec in specs {
        for layer in spec.layers.clone() {
            for (&s, &t) in si.iter().zip(di) {
                plan.push((
                    dst_base + spec.offset_bytes(Side::Dst, layer, t)?,
                    src_base + spec.offset_bytes(Side::Src, layer, s)?,
                    spec.item_bytes,
                ));
            }
        }
    }
    let reps = if plan.len() > 10_000 { 3 } else { 11 };
    time_median(gpu, 1, reps, || {
        for &(dst, src, n) in &plan {
            // SAFETY: every range was computed by the checked spec inside both pools.
            unsafe { gpu.enqueue_memcpy(dst, src, n)? };
        }
        Ok(())
    })
}
