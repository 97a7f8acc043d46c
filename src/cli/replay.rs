//! `kvlayout replay`: a HiCache workload on a real model config (see
//! [`kvlayout_pool::replay`]); prints sessions, corrupted sessions, pages backed up / loaded,
//! bytes moved and refused transfers (`--json`: one object). Exit 0 when the workload ran with
//! no corrupted session, 1 when the host pool's pairing was refused (the mismatch lines are
//! printed), 2 on bad input, 3 when it ran and sessions were corrupted (a CI gate).
//!
//! `--device cuda` puts the device pool in GPU memory and the host pool in pinned host memory
//! and runs every checked transfer with the CUDA copy kernel (`kvlayout_pool::backend::
//! CudaBackend`); without a CUDA driver (or a build without the `cuda` feature) it says so on
//! stderr and runs on the CPU backend. The report names the backend that ran.

use std::io::IsTerminal;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use kvlayout_core::MemoryLayout;
use kvlayout_models::{Model, PoolOptions};
use kvlayout_pool::replay::{self, HostSource, ReplayInput, ReplayOutcome, ReplayReport, Workload};

use super::describe::{IndexKArg, KvDtypeArg, thousands};

/// `--host-layout` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum HostLayoutArg {
    /// [layer][page][...] per buffer.
    LayerFirst,
    /// [page][layer][...] per buffer.
    PageFirst,
    /// [page][buffer][layer][...]: one contiguous run per page.
    PageFirstDirect,
    /// [page][head][layer][token][dim] (MHA models only).
    PageHead,
}

impl From<HostLayoutArg> for MemoryLayout {
    fn from(a: HostLayoutArg) -> MemoryLayout {
        match a {
            HostLayoutArg::LayerFirst => MemoryLayout::LayerFirst,
            HostLayoutArg::PageFirst => MemoryLayout::PageFirst,
            HostLayoutArg::PageFirstDirect => MemoryLayout::PageFirstDirect,
            HostLayoutArg::PageHead => MemoryLayout::PageHead,
        }
    }
}

/// `--device` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    /// Both pools in ordinary memory (the CPU backend).
    Cpu,
    /// Device pool on GPU 0, host pool in pinned memory, transfers by the CUDA copy kernel.
    Cuda,
}

/// Arguments of `kvlayout replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Built-in model name or a path to a Hugging Face config.json.
    #[arg(long, default_value = "deepseek-v3.2-exp")]
    pub model: String,
    /// Index-K dtype (bf16: the seed bug's device pool) [default: fp8, as `describe`].
    #[arg(long, value_enum)]
    pub index_k: Option<IndexKArg>,
    /// KV cache dtype [default: fp8 for DSA models, bf16 otherwise].
    #[arg(long, value_enum)]
    pub kv_dtype: Option<KvDtypeArg>,
    /// Multi-turn sessions in the workload (run `--concurrency` at a time).
    #[arg(long, default_value_t = 80)]
    pub sessions: u64,
    /// Seed of the generated index-K keys, queries and latent values (the page schedule follows
    /// from the workload's shape: sessions, turns, prefixes, batches).
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
    /// Layers simulated (the first ones of the model; the pairing check covers all of them).
    #[arg(long, default_value_t = 4)]
    pub layers: u64,
    /// Turns per session.
    #[arg(long, default_value_t = 3)]
    pub turns: u64,
    /// Sessions in flight at once (a batch shares the device pool).
    #[arg(long, default_value_t = 16)]
    pub concurrency: u64,
    /// Device pool pages (smaller than the working set, so pages are backed up and loaded).
    #[arg(long, default_value_t = 128)]
    pub device_pages: u64,
    /// Host pool pages (mirrored host only; a geometry file brings its own).
    #[arg(long, default_value_t = 512)]
    pub host_pages: u64,
    /// Memory layout of the mirrored host pool.
    #[arg(long, value_enum, default_value = "layer-first")]
    pub host_layout: HostLayoutArg,
    /// Indexer top-k.
    #[arg(long, default_value_t = 16)]
    pub top_k: usize,
    /// Use this host geometry file instead of mirroring the device pool.
    #[arg(long)]
    pub host_geometry: Option<PathBuf>,
    /// Skip the shim: no pairing check, no per-transfer check, the host's item size used on
    /// both sides (what an engine without kvlayout does). The memory backend still refuses a
    /// copy that would leave its buffers.
    #[arg(long)]
    pub no_verify: bool,
    /// Where the pools live: `cpu`, or `cuda` (GPU 0; falls back to the CPU backend, saying
    /// so, when no CUDA driver is found).
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The backend a replay runs on.
enum Pools {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(kvlayout_pool::backend::CudaBackend),
}

impl Pools {
    /// Opens the backend `--device` asks for; a CUDA request that cannot be met falls back to
    /// the CPU backend with a line on stderr.
    fn open(device: DeviceArg) -> Pools {
        match device {
            DeviceArg::Cpu => Pools::Cpu,
            DeviceArg::Cuda => Pools::open_cuda(),
        }
    }

    #[cfg(feature = "cuda")]
    fn open_cuda() -> Pools {
        use kvlayout_pool::backend::{CudaBackend, KernelError};
        match CudaBackend::new(0) {
            Ok(b) => Pools::Cuda(b),
            Err(e @ KernelError::NoDriver) => {
                eprintln!("{e}; falling back to the CPU backend");
                Pools::Cpu
            }
            Err(e) => {
                eprintln!("CUDA device 0 unavailable ({e}); falling back to the CPU backend");
                Pools::Cpu
            }
        }
    }

    #[cfg(not(feature = "cuda"))]
    fn open_cuda() -> Pools {
        eprintln!(
            "no CUDA driver found (this kvlayout was built without the `cuda` feature); \
             falling back to the CPU backend"
        );
        Pools::Cpu
    }

    /// `cpu` or `cuda`, as the JSON report's `backend`.
    fn name(&self) -> &'static str {
        match self {
            Pools::Cpu => "cpu",
            #[cfg(feature = "cuda")]
            Pools::Cuda(_) => "cuda",
        }
    }

    /// Where the pools live, for the text report.
    fn describe(&self) -> String {
        match self {
            Pools::Cpu => "cpu (device and host pools in ordinary memory)".to_string(),
            #[cfg(feature = "cuda")]
            Pools::Cuda(b) => format!(
                "cuda (device pool in GPU 0 memory, {}; host pool in pinned host memory; \
                 transfers by the run-list copy kernel)",
                b.describe()
            ),
        }
    }

    fn run(
        self,
        input: &ReplayInput,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ReplayOutcome, replay::ReplayError> {
        match self {
            Pools::Cpu => replay::run(input, progress),
            #[cfg(feature = "cuda")]
            Pools::Cuda(b) => replay::run_with(b, input, progress),
        }
    }
}

/// `value` as JSON with the `backend` that ran and the `device_requested` added (they differ
/// after a fallback to the CPU).
fn json_with_backend(value: &impl serde::Serialize, backend: &str, requested: DeviceArg) -> String {
    let mut v = serde_json::to_value(value).unwrap_or_default();
    if let serde_json::Value::Object(map) = &mut v {
        map.insert("backend".into(), backend.into());
        let requested = match requested {
            DeviceArg::Cpu => "cpu",
            DeviceArg::Cuda => "cuda",
        };
        map.insert("device_requested".into(), requested.into());
    }
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

fn print_report(r: &ReplayReport, backend: &str) {
    println!(
        "kvlayout replay: {} ({}), layers 0..{} of {} simulated, page_size_tokens {}",
        r.model,
        r.formats.join(", "),
        r.simulated_layers,
        r.model_layers,
        r.page_size_tokens
    );
    println!("  backend: {backend}");
    println!(
        "  device pool {} pages; host pool {} pages, {} ({}); pairing {}",
        r.device_pages, r.host_pages, r.host_memory_layout, r.host_geometry, r.pairing
    );
    if !r.mismatch.is_empty() {
        println!("  geometry NOT checked; device and host differ:");
        for m in &r.mismatch {
            println!("    {m}");
        }
    }
    println!(
        "  fingerprints: device {}, host {}",
        r.device_fingerprint, r.host_fingerprint
    );
    if r.indexer {
        println!(
            "  indexer: top-{} of {} heads per decode step per layer, keys read from the device pool",
            r.top_k, r.indexer_heads
        );
    } else {
        println!(
            "  no indexer in this model: kv rows of {} sampled past tokens compared per step per layer",
            r.top_k
        );
    }
    println!(
        "sessions {}: corrupted {} ({} had pages loaded from the host; {} decode steps, top-k mismatches {}, latent mismatches {})",
        r.sessions,
        r.corrupted_sessions,
        r.sessions_with_loaded_pages,
        r.decode_steps,
        r.topk_mismatches,
        r.latent_mismatches
    );
    println!(
        "pages: {} device hits, {} backed up ({} B), {} loaded ({} B)",
        r.device_page_hits,
        r.pages_backed_up,
        thousands(r.bytes_backed_up),
        r.pages_loaded,
        thousands(r.bytes_loaded)
    );
    println!(
        "transfers: {} backups, {} loads, {} refused ({} pages recomputed)",
        r.backup_transfers, r.load_transfers, r.refused_transfers, r.recomputed_pages
    );
    if let Some(why) = &r.first_refusal {
        println!("first refusal: {why}");
    }
}

/// Runs the subcommand.
pub fn run(args: &ReplayArgs) -> u8 {
    let model = match Model::load(&args.model) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let host = match &args.host_geometry {
        Some(path) => match replay::read_host_geometry(path) {
            Ok(geometry) => HostSource::Foreign {
                geometry,
                source: path.display().to_string(),
            },
            Err(e) => {
                eprintln!("error: {e}");
                return 2;
            }
        },
        None => HostSource::Mirror {
            pages: args.host_pages,
            memory_layout: args.host_layout.into(),
        },
    };
    let index_k = super::describe::index_k_for(&model, args.index_k);
    let input = ReplayInput {
        model,
        pool: PoolOptions {
            kv_dtype: args.kv_dtype.map(Into::into),
            index_k,
            ..PoolOptions::default()
        },
        host,
        verify: !args.no_verify,
        workload: Workload {
            sessions: args.sessions,
            seed: args.seed,
            layers: args.layers,
            turns: args.turns,
            top_k: args.top_k,
            concurrency: args.concurrency,
            device_pages: args.device_pages,
            ..Workload::default()
        },
    };
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(args.sessions.saturating_mul(args.turns));
        b.set_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} session-turns {elapsed}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    });
    let pools = Pools::open(args.device);
    let (backend, backend_text) = (pools.name(), pools.describe());
    let outcome = pools.run(&input, &mut |done, _| {
        if let Some(b) = &bar {
            b.set_position(done);
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    match outcome {
        Err(e) => {
            eprintln!("error: {e}");
            2
        }
        Ok(ReplayOutcome::Refused(r)) => {
            if args.json {
                println!("{}", json_with_backend(&r, backend, args.device));
            } else {
                println!(
                    "refused: the host pool ({}) cannot exchange pages with the {} device pool; {} differing field{} (device, host):",
                    r.host_geometry,
                    r.model,
                    r.mismatch.len(),
                    if r.mismatch.len() == 1 { "" } else { "s" }
                );
                for m in &r.mismatch {
                    println!("  {m}");
                }
                println!(
                    "no session ran (backend {backend_text}); mirror the device pool (drop --host-geometry) or fix the host geometry"
                );
            }
            1
        }
        Ok(ReplayOutcome::Completed(r)) => {
            if args.json {
                println!("{}", json_with_backend(&r, backend, args.device));
            } else {
                print_report(&r, &backend_text);
            }
            if r.corrupted_sessions > 0 { 3 } else { 0 }
        }
    }
}
