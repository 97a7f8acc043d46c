//! `kvlayout replay`: the main job. By default it replays the Mooncake FAST'25 conversation trace
//! (embedded; `--trace FILE` for another) through a page-accurate model of SGLang's HiCache,
//! moving the simulated layers' bytes through the checked pools (see
//! [`kvlayout_replay::trace_replay`]); `--workload synthetic` runs the multi-turn synthetic
//! workload ([`kvlayout_replay::synthetic`]). Exit 0 when it ran with nothing corrupted, 1 when
//! the host pool's pairing was refused (the mismatch lines are printed) or the shim refused a
//! trace transfer (its pages are recomputed; the first refusal is printed), 2 on bad input or a
//! pool or device failure while running (a GPU copy that failed, named), 3 when
//! it ran and requests (sessions) were corrupted (a CI gate). The replay models full-attention
//! pools only: a model with a sliding-window, chunked or state buffer is refused (exit 2).
//!
//! `--device cuda` puts the device pool in GPU memory and the host pool in pinned host memory
//! and runs every checked transfer on the GPU (`kvlayout_pool::backend::CudaBackend`: copy
//! engines for page runs; loads and backups enqueued and waited for before device bytes are
//! read); without a CUDA driver (or a build without the `cuda` feature) it says so on
//! stderr and runs on the CPU backend, unless `--require-gpu` makes that an error (exit 2). The
//! report names the backend that ran.

use std::io::IsTerminal;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use kvlayout_core::MemoryLayout;
use kvlayout_models::{IndexK, KvDtype, Model, PoolOptions};
use kvlayout_pool::ChecksumMode;
use kvlayout_replay::schedule::WritePolicy;
use kvlayout_replay::synthetic::{
    self as replay, ReplayInput, ReplayOutcome, ReplayReport, Workload,
};
use kvlayout_replay::trace_replay::{self, TraceInput, TraceOutcome};
use kvlayout_replay::{HostSource, read_host_geometry};

use super::describe::thousands;

mod plot;
mod trace;

/// `--device` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceArg {
    /// Both pools in ordinary memory (the CPU backend).
    Cpu,
    /// Device pool on GPU 0, host pool in pinned memory, transfers by the CUDA copy kernel.
    Cuda,
}

/// `--workload` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadArg {
    /// A Mooncake trace (the embedded conversation trace, or `--trace FILE`).
    Trace,
    /// The multi-turn synthetic workload (`--sessions`, `--turns`, `--concurrency`).
    Synthetic,
}

impl WorkloadArg {
    /// The value's spelling on the command line.
    fn name(self) -> &'static str {
        match self {
            WorkloadArg::Trace => "trace",
            WorkloadArg::Synthetic => "synthetic",
        }
    }
}

/// Arguments of `kvlayout replay`.
#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Built-in model (deepseek-v3.2-exp, deepseek-v3, kimi-k2, glm-4.5, llama-3.1-8b,
    /// llama-3.1-70b, qwen3-8b, qwen3-235b-a22b, deepseek-v4-flash; case-insensitive), a
    /// Hugging Face model directory (its config.json is read) or a path to a config.json.
    #[arg(long, default_value = "deepseek-v3.2-exp")]
    pub model: String,
    /// Index-K dtype (bf16: the seed bug's device pool; DSA models only: an error on a model
    /// without the indexer) [default: fp8, as `describe`].
    #[arg(long, value_enum, ignore_case = true)]
    pub index_k: Option<IndexK>,
    /// KV cache dtype (case-insensitive; torch spellings accepted) [default: fp8 for DSA
    /// models, bf16 otherwise].
    #[arg(long, value_enum, ignore_case = true)]
    pub kv_dtype: Option<KvDtype>,
    /// Which workload runs.
    #[arg(long, value_enum, default_value = "trace")]
    pub workload: WorkloadArg,
    /// A Mooncake FAST'25 JSONL trace (timestamp, input_length, output_length, hash_ids), read
    /// line by line; `-` reads stdin [default: the embedded conversation trace, 12,031 requests
    /// over one hour].
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Seed of the generated index-K keys, queries and latent values (the page schedule follows
    /// from the workload: the trace, or sessions, turns, prefixes and batches).
    #[arg(long, default_value_t = 2026)]
    pub seed: u64,
    /// Tokens per page of both pools [default: the engine's page for the model: SGLang's 256
    /// for DeepSeek-V4, else 64]. 1 is SGLang's `--page-size 1` (its default for the
    /// FlashAttention-3 and FlashInfer backends): every transfer is token-granular (one run per
    /// token, layer and buffer), which `--device cuda` moves with the token kernel (loads, and
    /// backups whose runs have one length; the replay declares no model SM carve-out, so
    /// backups are not paced). `--device-pages` and `--host-pages` count
    /// pages of this size (at 1, pages are tokens). The trace workload models at most 8 pages
    /// per 512-token block (64 tokens or more); the synthetic one any size.
    #[arg(long)]
    pub page_size_tokens: Option<u64>,
    /// Layers whose bytes move (the first ones; the pairing check covers all of them)
    /// [default: 1 for a trace, 4 synthetic].
    #[arg(long)]
    pub layers: Option<u64>,
    /// Trace: buffers whose bytes move, comma-separated (e.g. `index_k,kv`) [default: index_k
    /// when the model has the DSA indexer (the buffer it reads), c4_index_k for DeepSeek-V4,
    /// else all].
    #[arg(long, value_delimiter = ',')]
    pub buffers: Option<Vec<String>>,
    /// Device pool pages [default: trace: an H200's KV budget for DeepSeek-V3.2 at TP 8,
    /// 40.65 GB / the model's bytes per page (DeepSeek-V4: DeepSeek-V4-Flash's, 106.9 GB; for
    /// another model the report says the budget is DeepSeek-V3.2's: pass this for the model's
    /// deployment); synthetic: 128].
    #[arg(long)]
    pub device_pages: Option<u64>,
    /// Host pool pages (mirrored host only; a geometry file brings its own) [default: trace:
    /// 2 x device pages, SGLang's --hicache-ratio 2; synthetic: 512].
    #[arg(long)]
    pub host_pages: Option<u64>,
    /// Memory layout of the mirrored host pool (the geometry file's names; the dashed ones,
    /// `layer-first`, are accepted too; not with --host-geometry, whose file brings its own)
    /// [default: layer_first].
    #[arg(long, value_enum)]
    pub host_layout: Option<MemoryLayout>,
    /// Trace: when pages are written to the host (SGLang --hicache-write-policy)
    /// [default: write_back].
    #[arg(long, value_enum)]
    pub write_policy: Option<WritePolicy>,
    /// Trace: prefill speed of one request, tokens per second (how long its pages stay locked)
    /// [default: 20000].
    #[arg(long)]
    pub prefill_tokens_per_s: Option<u64>,
    /// Trace: decode time per output token, milliseconds [default: 20].
    #[arg(long)]
    pub decode_ms_per_token: Option<u64>,
    /// Synthetic: multi-turn sessions (run `--concurrency` at a time) [default: 80].
    #[arg(long)]
    pub sessions: Option<u64>,
    /// Synthetic: turns per session [default: 3].
    #[arg(long)]
    pub turns: Option<u64>,
    /// Synthetic: sessions in flight at once (a batch shares the device pool) [default: 16].
    #[arg(long)]
    pub concurrency: Option<u64>,
    /// Indexer top-k (8 of the model's 64 indexer heads are simulated; the model keeps 2048):
    /// at most the tokens it picks from.
    #[arg(long, default_value_t = 16)]
    pub top_k: usize,
    /// Use this host geometry file instead of mirroring the device pool (its `pages` is the
    /// host capacity).
    #[arg(long)]
    pub host_geometry: Option<PathBuf>,
    /// Skip the shim: no pairing check, no per-transfer check, the host's item size used on
    /// both sides (what an engine without kvlayout does). The memory backend still refuses a
    /// copy that would leave its buffers.
    #[arg(long)]
    pub no_verify: bool,
    /// Trace: page checksums on the pairing: `all` (every page recorded at backup and verified
    /// at load), `sampled:N` (host pages that are multiples of N), or `off`. A mismatch refuses
    /// the load (a miss) on a checked pairing; with --no-verify the bytes are used as the engine
    /// without kvlayout would, and the mismatch is counted.
    #[arg(long, default_value = "off", value_parser = parse_checksum)]
    pub checksum: ChecksumMode,
    /// Where the pools live: `cpu`, or `cuda` (GPU 0; falls back to the CPU backend, saying
    /// so, when no CUDA driver is found, unless --require-gpu).
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: DeviceArg,
    /// With `--device cuda`: fail (exit 2) instead of falling back to the CPU.
    #[arg(long)]
    pub require_gpu: bool,
    /// Trace: draw the per-minute series (requests, host hits, corrupted) into this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print one JSON object (no progress bar).
    #[arg(long)]
    pub json: bool,
}

fn parse_checksum(text: &str) -> Result<ChecksumMode, String> {
    ChecksumMode::parse(text)
}

/// The backend a replay runs on.
enum Pools {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(kvlayout_pool::backend::CudaBackend),
}

impl Pools {
    /// Opens the backend `--device` asks for; a CUDA request that cannot be met falls back to
    /// the CPU backend with a line on stderr, or is an error with `require_gpu`.
    fn open(device: DeviceArg, require_gpu: bool) -> Result<Pools, String> {
        match device {
            DeviceArg::Cpu => Ok(Pools::Cpu),
            DeviceArg::Cuda => match Pools::open_cuda() {
                Ok(p) => Ok(p),
                Err(why) if require_gpu => Err(format!("--require-gpu: {why}")),
                Err(why) => {
                    eprintln!("{why}; falling back to the CPU backend");
                    Ok(Pools::Cpu)
                }
            },
        }
    }

    #[cfg(feature = "cuda")]
    fn open_cuda() -> Result<Pools, String> {
        use kvlayout_pool::backend::{CudaBackend, KernelError};
        match CudaBackend::new(0) {
            Ok(b) => Ok(Pools::Cuda(b)),
            Err(e @ KernelError::NoDriver) => Err(e.to_string()),
            Err(e) => Err(format!("CUDA device 0 unavailable ({e})")),
        }
    }

    #[cfg(not(feature = "cuda"))]
    fn open_cuda() -> Result<Pools, String> {
        Err("no CUDA driver found (this kvlayout was built without the `cuda` feature)".into())
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
                 transfers: page runs by the copy engines (2D copies for pitched groups), token runs by the run-list kernel on a few SMs; loads and backups enqueued, waited for before the device bytes are read)",
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

    fn run_trace(
        self,
        input: &TraceInput,
        trace: Box<dyn std::io::BufRead>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<TraceOutcome, replay::ReplayError> {
        match self {
            Pools::Cpu => trace_replay::run_trace(input, trace, progress),
            #[cfg(feature = "cuda")]
            Pools::Cuda(b) => trace_replay::run_trace_with(b, input, trace, progress),
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
        r.backed_up_pages,
        thousands(r.backed_up_bytes),
        r.loaded_pages,
        thousands(r.loaded_bytes)
    );
    println!(
        "transfers: {} backups, {} loads, {} refused ({} pages recomputed)",
        r.backup_transfers, r.load_transfers, r.refused_transfers, r.recomputed_pages
    );
    if let Some(why) = &r.first_refusal {
        println!("first refusal: {why}");
    }
}

/// The host source from `--host-geometry` / `--host-pages` / `--host-layout`.
fn host_source(args: &ReplayArgs, default_pages: u64) -> Result<HostSource, String> {
    match &args.host_geometry {
        Some(path) => Ok(HostSource::Foreign {
            geometry: read_host_geometry(path)?,
            source: path.display().to_string(),
        }),
        None => Ok(HostSource::Mirror {
            pages: args.host_pages.unwrap_or(default_pages),
            memory_layout: args.host_layout.unwrap_or(MemoryLayout::LayerFirst),
        }),
    }
}

/// A progress bar on stderr when it is a terminal and `--json` is not given.
fn progress_bar(args: &ReplayArgs, len: u64, template: &str) -> Option<ProgressBar> {
    (!args.json && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(len);
        b.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    })
}

/// `a`, `a and b`, `a, b and c`.
fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_string(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Refuses the flags given on the command line that the chosen workload does not read, and
/// the host flags a `--host-geometry` file overrides: nothing is dropped silently.
///
/// # Errors
/// One line naming every such flag and what it belongs to.
fn check_applicable(args: &ReplayArgs) -> Result<(), String> {
    // (flag, given) for the flags only the other workload reads.
    let (other, flags) = match args.workload {
        WorkloadArg::Trace => (
            WorkloadArg::Synthetic,
            vec![
                ("--sessions", args.sessions.is_some()),
                ("--turns", args.turns.is_some()),
                ("--concurrency", args.concurrency.is_some()),
            ],
        ),
        WorkloadArg::Synthetic => (
            WorkloadArg::Trace,
            vec![
                ("--trace", args.trace.is_some()),
                ("--plot", args.plot.is_some()),
                ("--buffers", args.buffers.is_some()),
                ("--checksum", args.checksum != ChecksumMode::Off),
                ("--write-policy", args.write_policy.is_some()),
                (
                    "--prefill-tokens-per-s",
                    args.prefill_tokens_per_s.is_some(),
                ),
                ("--decode-ms-per-token", args.decode_ms_per_token.is_some()),
            ],
        ),
    };
    let given: Vec<&str> = flags
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect();
    if !given.is_empty() {
        let verb = if given.len() == 1 {
            "belongs"
        } else {
            "belong"
        };
        return Err(format!(
            "{} {verb} to --workload {} (this run's workload is {})",
            and_list(&given),
            other.name(),
            args.workload.name()
        ));
    }
    if args.host_geometry.is_some() {
        if args.host_pages.is_some() {
            return Err("--host-pages: the --host-geometry file brings the host pages".into());
        }
        if args.host_layout.is_some() {
            return Err(
                "--host-layout: the --host-geometry file brings the host memory layout".into(),
            );
        }
    }
    if args.require_gpu && args.device != DeviceArg::Cuda {
        return Err(
            "--require-gpu needs --device cuda (the device is cpu: nothing to require)".into(),
        );
    }
    Ok(())
}

/// The `kvlayout replay` option that sets `param`, or, for a parameter no option sets, the
/// replay's own name for it (`indexer_heads`). Exhaustive: a new [`Param`] needs a decision here.
///
/// [`Param`]: kvlayout_replay::Param
fn param_flag(param: kvlayout_replay::Param) -> &'static str {
    use kvlayout_replay::Param;
    match param {
        Param::Sessions => "--sessions",
        Param::Layers => "--layers",
        Param::Turns => "--turns",
        Param::Concurrency => "--concurrency",
        Param::DevicePages => "--device-pages",
        Param::HostPages => "--host-pages",
        Param::TopK => "--top-k",
        Param::Buffers => "--buffers",
        Param::PrefillTokensPerS => "--prefill-tokens-per-s",
        Param::DecodeMsPerToken => "--decode-ms-per-token",
        Param::Checksum => "--checksum",
        Param::PageSizeTokens => "--page-size-tokens",
        Param::HostLayout => "--host-layout",
        // Set by the CLI or the model, not by an option.
        Param::PrefixGroups | Param::IndexerHeads | Param::HostPool | Param::Pages => param.name(),
    }
}

/// A replay error in the CLI's terms: a workload parameter named by its option
/// (`workload: --device-pages: ...`), the model by `--model`.
fn error_text(e: &kvlayout_replay::ReplayError) -> String {
    use kvlayout_replay::{NOT_FULL_ATTENTION, ReplayError};
    match e {
        ReplayError::Workload {
            param,
            problem,
            defaulted,
        } => {
            let f = param_flag(*param);
            match defaulted {
                Some(from) => format!("workload: {f}: {problem} ({f} not given: {from})"),
                None => format!("workload: {f}: {problem}"),
            }
        }
        ReplayError::NotFullAttention { model, buffers } => {
            format!("--model {model}: {buffers}; {NOT_FULL_ATTENTION}")
        }
        // The page size the model refused is the flag's value (or the engine's default).
        ReplayError::Model(kvlayout_models::ModelError::Field {
            field,
            name,
            problem,
        }) if field == "page_size_tokens" => {
            format!("--page-size-tokens: {problem} (model \"{name}\")")
        }
        ReplayError::Model(_)
        | ReplayError::Pool(_)
        | ReplayError::Codec(_)
        | ReplayError::Trace(_) => e.to_string(),
    }
}

/// Runs the subcommand.
pub fn run(args: &ReplayArgs) -> u8 {
    if let Err(e) = check_applicable(args) {
        eprintln!("error: {e}");
        return 2;
    }
    let model = match Model::load(&args.model) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let pools = match Pools::open(args.device, args.require_gpu) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let index_k = match super::describe::index_k_for(&model, args.index_k) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let pool = PoolOptions {
        kv_dtype: args.kv_dtype,
        index_k,
        // The engine's page unless given: SGLang's 256 tokens for DeepSeek-V4, else 64.
        page_size_tokens: args
            .page_size_tokens
            .unwrap_or_else(|| model.engine_page_size_tokens()),
        ..PoolOptions::default()
    };
    match args.workload {
        WorkloadArg::Synthetic => run_synthetic(args, model, pool, pools),
        WorkloadArg::Trace => trace::run_trace(args, model, pool, pools),
    }
}

/// Host pages of the synthetic workload when `--host-pages` is left out.
const SYNTHETIC_HOST_PAGES: u64 = 512;

/// `e`, and when it names a flag the command line left out, the synthetic workload's default
/// that was used (`(--device-pages not given: the synthetic workload's default is 128 pages)`),
/// as the trace workload's errors say where its default device pages came from.
fn blame_synthetic_default(args: &ReplayArgs, e: replay::ReplayError) -> replay::ReplayError {
    use kvlayout_replay::Param;
    let d = Workload::default();
    match e {
        replay::ReplayError::Workload {
            param,
            problem,
            defaulted: None,
        } => {
            let default = match param {
                Param::Sessions if args.sessions.is_none() => {
                    Some(format!("{} sessions", d.sessions))
                }
                Param::Turns if args.turns.is_none() => Some(format!("{} turns", d.turns)),
                Param::Layers if args.layers.is_none() => Some(format!("{} layers", d.layers)),
                Param::Concurrency if args.concurrency.is_none() => {
                    Some(format!("{} sessions at once", d.concurrency))
                }
                Param::DevicePages if args.device_pages.is_none() => {
                    Some(format!("{} pages", d.device_pages))
                }
                // With --host-geometry the host pages are the file's, not a default.
                Param::HostPages if args.host_pages.is_none() && args.host_geometry.is_none() => {
                    Some(format!("{SYNTHETIC_HOST_PAGES} pages"))
                }
                _ => None,
            };
            replay::ReplayError::Workload {
                param,
                problem,
                defaulted: default.map(|v| format!("the synthetic workload's default is {v}")),
            }
        }
        e => e,
    }
}

fn run_synthetic(args: &ReplayArgs, model: Model, pool: PoolOptions, pools: Pools) -> u8 {
    let d = Workload::default();
    let (sessions, turns) = (
        args.sessions.unwrap_or(d.sessions),
        args.turns.unwrap_or(d.turns),
    );
    let host = match host_source(args, SYNTHETIC_HOST_PAGES) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let input = ReplayInput {
        model,
        pool,
        host,
        verify: !args.no_verify,
        workload: Workload {
            sessions,
            seed: args.seed,
            layers: args.layers.unwrap_or(d.layers),
            turns,
            top_k: args.top_k,
            concurrency: args.concurrency.unwrap_or(d.concurrency),
            device_pages: args.device_pages.unwrap_or(d.device_pages),
            ..d
        },
    };
    let bar = progress_bar(
        args,
        sessions.saturating_mul(turns),
        "{bar:40} {pos}/{len} session-turns {elapsed}",
    );
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
            eprintln!("error: {}", error_text(&blame_synthetic_default(args, e)));
            2
        }
        Ok(ReplayOutcome::Refused(r)) => {
            if args.json {
                println!("{}", json_with_backend(&r, backend, args.device));
            } else {
                print_refusal(
                    &r.host_geometry,
                    &r.model,
                    &r.mismatch,
                    "no session ran",
                    &backend_text,
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

fn print_refusal(host: &str, model: &str, mismatch: &[String], what: &str, backend: &str) {
    println!(
        "refused: the host pool ({host}) cannot exchange pages with the {model} device pool; {} differing field{} (device, host):",
        mismatch.len(),
        if mismatch.len() == 1 { "" } else { "s" }
    );
    for m in mismatch {
        println!("  {m}");
    }
    println!(
        "{what} (backend {backend}); mirror the device pool (drop --host-geometry) or fix the host geometry"
    );
}

#[cfg(test)]
mod tests {
    use kvlayout_replay::{Param, ReplayError};

    use super::{ReplayArgs, error_text, param_flag};

    /// Every parameter of the replay's errors, written out here (not taken from the enum).
    const PARAMS: [Param; 16] = [
        Param::Sessions,
        Param::Layers,
        Param::Turns,
        Param::PrefixGroups,
        Param::Concurrency,
        Param::DevicePages,
        Param::HostPages,
        Param::IndexerHeads,
        Param::TopK,
        Param::Buffers,
        Param::PageSizeTokens,
        Param::PrefillTokensPerS,
        Param::DecodeMsPerToken,
        Param::HostLayout,
        Param::HostPool,
        Param::Pages,
    ];

    /// A flag an error names is one `kvlayout replay` takes: the user can act on it.
    #[test]
    fn every_flag_an_error_names_is_an_option_of_replay() {
        let cmd = <ReplayArgs as clap::Args>::augment_args(clap::Command::new("replay"));
        let options: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long())
            .map(|l| format!("--{l}"))
            .collect();
        let mut flags = 0;
        for p in PARAMS {
            let named = param_flag(p);
            if named.starts_with("--") {
                assert!(
                    options.iter().any(|o| o == named),
                    "{p:?} maps to {named}, not an option of replay ({options:?})"
                );
                flags += 1;
            } else {
                // No option: the replay's own name, as its library error says it.
                assert_eq!(named, p.name(), "{p:?}");
            }
        }
        // --sessions, --layers, --turns, --concurrency, --device-pages, --host-pages, --top-k,
        // --buffers, --page-size-tokens, --prefill-tokens-per-s, --decode-ms-per-token,
        // --host-layout.
        assert_eq!(flags, 12);
    }

    /// A page size the model refuses is named by the flag (the model said `page_size_tokens`,
    /// and DeepSeek-V4's error named describe's `--page-size`, not an option of replay).
    #[test]
    fn a_model_page_size_error_is_printed_with_its_flag() {
        let e = ReplayError::Model(kvlayout_models::ModelError::Field {
            field: "page_size_tokens".into(),
            name: "m".into(),
            problem: "must be at least 1, got 0".into(),
        });
        assert_eq!(
            error_text(&e),
            "--page-size-tokens: must be at least 1, got 0 (model \"m\")"
        );
    }

    /// The library says `device_pages`; the CLI says the flag, the default's origin included.
    #[test]
    fn a_workload_error_is_printed_with_its_flag() {
        let e = ReplayError::Workload {
            param: Param::DevicePages,
            problem: "must be at least 1, got 0".into(),
            defaulted: None,
        };
        assert_eq!(
            e.to_string(),
            "workload: device_pages: must be at least 1, got 0"
        );
        assert_eq!(
            error_text(&e),
            "workload: --device-pages: must be at least 1, got 0"
        );
        let e = ReplayError::Workload {
            param: Param::HostPages,
            problem: "too small".into(),
            defaulted: Some("2 x device pages".into()),
        };
        assert_eq!(
            error_text(&e),
            "workload: --host-pages: too small (--host-pages not given: 2 x device pages)"
        );
        let e = ReplayError::Workload {
            param: Param::IndexerHeads,
            problem: "must be at least 1, got 0".into(),
            defaulted: None,
        };
        assert_eq!(
            error_text(&e),
            "workload: indexer_heads: must be at least 1, got 0"
        );
    }
}
