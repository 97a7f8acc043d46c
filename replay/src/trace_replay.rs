//! `kvlayout replay --trace`: a Mooncake trace through the [`crate::schedule`] model of SGLang's
//! HiCache, with the bytes of the simulated layers moving through the checked pools
//! ([`crate::store`]).
//!
//! Default capacities stand for DeepSeek-V3.2 served by one node of 8 H200 GPUs at tensor
//! parallelism 8 (SGLang replicates the MLA latent cache on every rank, so one rank's pool is the
//! node's cache):
//! - HBM per GPU: 141 GB ([`H200_HBM_BYTES`], NVIDIA H200 datasheet);
//! - static share SGLang may allocate (`--mem-fraction-static`): 0.90, the rest is activations
//!   and CUDA graphs;
//! - weights per GPU: about 690 GB of checkpoint (671 B parameters, mostly fp8) / 8 = 86.25 GB
//!   ([`WEIGHTS_PER_GPU_BYTES`]);
//! - KV budget per GPU: 0.90 x 141 GB - 86.25 GB = 40.65 GB ([`KV_BUDGET_BYTES`]);
//! - device pages: budget / (bytes per token over all layers x 64), bytes per token from
//!   `kvlayout describe`: with bf16 index-K 61 x (656 + 256) = 55,632 B, so
//!   40,650,000,000 / (55,632 x 64) = 11,417 pages (730,688 tokens); with fp8 index-K
//!   61 x (656 + 132) = 48,068 B: 13,213 pages;
//! - host pages: 2 x device pages (SGLang `--hicache-ratio` default 2).
//!
//! Another model gets the same budget divided by its own bytes per page, and the report says
//! the budget is DeepSeek-V3.2's (pass `--device-pages` for the model's own deployment); an
//! error blaming `--device-pages` when it was not given names the default it came from.
//!
//! The page schedule gives every buffer one page per 64 tokens and keeps them all: a model
//! with a sliding-window, chunked or state buffer is refused, naming the buffer and what it
//! keeps ([`crate::pairing::require_full_attention`]).
//!
//! DeepSeek-V4 (`kvlayout_models::dsv4`, SGLang's CUDA pool) is the exception: its page is
//! SGLang's 256 tokens, and one schedule page index addresses every buffer of the V4 pool, each
//! in its own rows: the SWA page (256 rows of 584 B), the C4 KV and C4 indexer pages (64 rows:
//! one per 4 tokens), the C128 KV page (2 rows: one per 128 tokens), the C4 compressor and
//! indexer state rings (8 rows per SWA page) and a C128 state slot, moved whole with the page.
//! What this does not model, and how it errs: SGLang frees SWA rows past the 128-token window
//! and keeps them in a pool of `--swa-full-tokens-ratio` (0.1) of the tokens, and sizes the
//! C128 state per running request; here both travel with every cached page, so a page costs
//! more than in SGLang (fewer pages fit the budget; every load moves them too).
//!
//! Its default capacity ([`DSV4_FLASH_KV_BUDGET_BYTES`]) is an H200 at TP 8 serving
//! DeepSeek-V4-Flash (every V4 buffer is replicated, so one rank's pool is the node's cache):
//! 0.90 x 141 GB - 20 GB of weights per GPU (about 160 GB of checkpoint: 43 layers x 256 routed
//! experts x 3 x 4096 x 2048 = 277.0 G parameters in fp4 e2m1 with one ue8m0 scale per 32,
//! 0.53125 B each = 147.2 GB, plus the fp8 / bf16 attention, shared experts and embeddings,
//! rounded up; / 8) = 106.9 GB; / 19,643,968 B per 256-token page over all layers and buffers
//! (`kvlayout describe --model deepseek-v4-flash`) = 5,441 pages (1,392,896 tokens).

use std::io::BufRead;

use kvlayout_models::{Model, PoolOptions};
use kvlayout_pool::backend::{Backend, CpuBackend};
use kvlayout_pool::{ChecksumMode, KvPool};

use crate::error::{Param, ReplayError, workload_err};
use crate::pairing::{HostSource, PairingFacts, Sample, pair_pools, require_full_attention};
use crate::report::{Minute, TraceRefusal, TraceReport, share};
use crate::schedule::{Schedule, ScheduleConfig, WritePolicy};
use crate::store::{IndexerParams, PoolStore};
use crate::trace::{TraceError, TraceReader, line_err};

/// Longest span of a trace, first request to last (31 days: a per-minute series of 44,640
/// minutes; the series is dense, and `--json` prints every minute).
pub const MAX_TRACE_SPAN_MS: u64 = 31 * 24 * 60 * 60 * 1000;

/// HBM of one H200 GPU, bytes (141 GB).
pub const H200_HBM_BYTES: u64 = 141_000_000_000;
/// DeepSeek-V3.2 weights on one GPU at tensor parallelism 8: 690 GB / 8.
pub const WEIGHTS_PER_GPU_BYTES: u64 = 86_250_000_000;
/// HBM left for the KV cache per GPU: 0.90 x 141 GB - 86.25 GB.
pub const KV_BUDGET_BYTES: u64 = H200_HBM_BYTES / 10 * 9 - WEIGHTS_PER_GPU_BYTES;
/// DeepSeek-V4-Flash weights on one H200 at tensor parallelism 8: about 160 GB / 8 (module
/// docs).
pub const DSV4_FLASH_WEIGHTS_PER_GPU_BYTES: u64 = 20_000_000_000;
/// HBM left for DeepSeek-V4-Flash's KV pool per GPU: 0.90 x 141 GB - 20 GB.
pub const DSV4_FLASH_KV_BUDGET_BYTES: u64 =
    H200_HBM_BYTES / 10 * 9 - DSV4_FLASH_WEIGHTS_PER_GPU_BYTES;
/// Host pages per device page (SGLang `--hicache-ratio` default).
pub const HICACHE_RATIO: u64 = 2;

/// The Mooncake FAST'25 conversation trace (Apache-2.0, data/SOURCE.md).
pub const CONVERSATION_TRACE: &str = include_str!("../../data/conversation_trace.jsonl");

/// Where the host pool comes from in a trace replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TraceHost {
    /// A mirror of the device pool; `pages: None` is [`HICACHE_RATIO`] x device pages.
    Mirror {
        /// Host pages.
        pages: Option<u64>,
        /// Host memory layout.
        memory_layout: kvlayout_core::MemoryLayout,
    },
    /// A geometry file: its `pages` is the host capacity.
    Foreign(HostSource),
}

/// Everything a trace replay needs but the trace.
#[derive(Clone, Debug)]
pub struct TraceInput {
    /// The model.
    pub model: Model,
    /// KV dtype and index-K dtype (pages come from `device_pages`).
    pub pool: PoolOptions,
    /// Device pages; `None`: the H200 default of the module docs.
    pub device_pages: Option<u64>,
    /// Host pool.
    pub host: TraceHost,
    /// Check at pairing and per transfer (false: `--no-verify`).
    pub verify: bool,
    /// Layers whose bytes move.
    pub layers: u64,
    /// Buffers whose bytes move; `None`: `index_k` when the model has one (the buffer the
    /// indexer reads), else all.
    pub buffers: Option<Vec<String>>,
    /// Indexer top-k.
    pub top_k: usize,
    /// Indexer heads.
    pub indexer_heads: u64,
    /// Seed of keys and queries.
    pub seed: u64,
    /// Write policy.
    pub write_policy: WritePolicy,
    /// Prefill speed per request.
    pub prefill_tokens_per_s: u64,
    /// Decode time per token.
    pub decode_ms_per_token: u64,
    /// Trace name for the report.
    pub trace_name: String,
    /// Page checksums on the pairing ([`ChecksumMode`]; `Off` by default): every load of the
    /// sampled layers verified against its backup.
    pub checksum: ChecksumMode,
}

/// Result of a trace replay.
#[derive(Clone, Debug)]
pub enum TraceOutcome {
    /// Pairing refused.
    Refused(TraceRefusal),
    /// The trace ran.
    Completed(Box<TraceReport>),
}

/// Device pages for a pool of `bytes_per_page` bytes per page over all layers: the H200 default.
pub fn default_device_pages(bytes_per_page: u64) -> u64 {
    KV_BUDGET_BYTES / bytes_per_page.max(1)
}

/// The H200 KV budget the default device pages come from: DeepSeek-V4-Flash's own for a
/// DeepSeek-V4 model, else DeepSeek-V3.2's.
pub fn kv_budget_bytes(model: &Model) -> u64 {
    if model.attention() == kvlayout_models::Attention::Dsv4 {
        DSV4_FLASH_KV_BUDGET_BYTES
    } else {
        KV_BUDGET_BYTES
    }
}

/// Where the default device pages came from, for the report. For DeepSeek-V3.2 the budget is
/// its own; for any other model the line says the budget is DeepSeek-V3.2's and that only this
/// model's bytes per page are its own.
pub fn default_device_pages_source(model: &str, bytes_per_page: u64) -> String {
    if model.to_ascii_lowercase().starts_with("deepseek-v4") {
        return format!(
            "H200 KV budget {DSV4_FLASH_KV_BUDGET_BYTES} B (0.90 x 141 GB HBM - 20 GB weights, \
             DeepSeek-V4-Flash at TP 8) / {bytes_per_page} B per 256-token page over all \
             layers and buffers (SWA rows and a C128 state slot with every page)"
        );
    }
    if model.to_ascii_lowercase().starts_with("deepseek-v3.2") {
        format!(
            "H200 KV budget {KV_BUDGET_BYTES} B (0.90 x 141 GB HBM - 86.25 GB weights, \
             DeepSeek-V3.2 at TP 8) / {bytes_per_page} B per page over all layers"
        )
    } else {
        format!(
            "DeepSeek-V3.2's H200 budget; pass --device-pages for this model's deployment: KV \
             budget {KV_BUDGET_BYTES} B (0.90 x 141 GB HBM - 86.25 GB DeepSeek-V3.2 weights at \
             TP 8) / {bytes_per_page} B per page of this model over all layers"
        )
    }
}

/// Replays `trace` on the CPU backend; `progress(bytes_read)` after each request.
///
/// # Errors
///
/// [`ReplayError::Workload`] naming the parameter (a zero layer, top-k, indexer head, device or
/// host page count; a top-k past the model's `index_topk`; a request that cannot fit the device
/// pages, with where a default came from); [`ReplayError::NotFullAttention`];
/// [`ReplayError::Trace`] for a bad line, a trace spanning more than 31 days or an empty trace; the
/// model's and pool's errors. A pairing refused by the check is `Ok(TraceOutcome::Refused)`, not an
/// error.
pub fn run_trace(
    input: &TraceInput,
    trace: impl BufRead,
    progress: &mut dyn FnMut(u64),
) -> Result<TraceOutcome, ReplayError> {
    run_trace_with(CpuBackend, input, trace, progress)
}

/// Counts the bytes read through it.
struct Counting<R> {
    inner: R,
    bytes: u64,
}

impl<R: BufRead> std::io::Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Counting<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }
    fn consume(&mut self, amt: usize) {
        self.bytes += amt as u64;
        self.inner.consume(amt);
    }
}

/// Replays `trace` with both pools on `backend`, loads and backups overlapped with the
/// schedule's work ([`run_trace_overlapped`] with `overlap` true).
///
/// # Errors
///
/// As [`run_trace_overlapped`].
pub fn run_trace_with<B: Backend>(
    backend: B,
    input: &TraceInput,
    trace: impl BufRead,
    progress: &mut dyn FnMut(u64),
) -> Result<TraceOutcome, ReplayError> {
    run_trace_overlapped(backend, input, true, trace, progress)
}

/// Replays `trace` with both pools on `backend`. `overlap` true: loads and backups are enqueued
/// and waited for only before the device pool's bytes are next read or written, and computed
/// pages are copied in one call per batch ([`PoolStore::with_overlap`]); false: every transfer
/// and page write waits. The outcome is the same either way.
///
/// # Errors
///
/// As [`run_trace`]'s, plus a transfer that failed on the device while running
/// ([`ReplayError::Pool`]).
pub fn run_trace_overlapped<B: Backend>(
    backend: B,
    input: &TraceInput,
    overlap: bool,
    trace: impl BufRead,
    progress: &mut dyn FnMut(u64),
) -> Result<TraceOutcome, ReplayError> {
    check_indexer_params(input)?;
    let sizing = size_pools(input)?;
    let opts = PoolOptions {
        pages: sizing.device.pages,
        ..input.pool
    };
    let paired = match pair_pools(
        backend,
        &input.model,
        &opts,
        &sizing.host,
        input.verify,
        &sizing.sample,
    )
    .map_err(|e| sizing.device.blame_default(e))?
    {
        Ok(p) => p,
        Err(r) => {
            return Ok(TraceOutcome::Refused(TraceRefusal {
                model: input.model.name.clone(),
                trace: input.trace_name.clone(),
                host_geometry: r.host_source,
                pairing: "refused",
                mismatch: r.mismatch,
                device_pages: sizing.device.pages,
                host_pages: sizing.host_pages,
                requests: 0,
                requests_with_host_hits: 0,
                corrupted_requests: 0,
            }));
        }
    };
    let (mut cache, facts) = paired.into_parts();
    if let ChecksumMode::Sampled(n) = input.checksum
        && n.get() >= sizing.host_pages
    {
        return Err(workload_err(
            Param::Checksum,
            format!(
                "sampled:{n} checks host pages that are multiples of {n}, but the host pool has {} pages: only page 0 would be checked (choose N below {})",
                sizing.host_pages, sizing.host_pages
            ),
        ));
    }
    cache
        .set_checksum_mode(input.checksum)
        .map_err(|e| workload_err(Param::Checksum, e.to_string()))?;
    let moved: Vec<String> = (cache.device().geometry().buffers.iter())
        .map(|b| b.name().to_string())
        .collect();
    let host_memory_layout = cache.host().geometry().memory_layout.to_string();
    let mut store = PoolStore::new(
        cache,
        IndexerParams {
            top_k: input.top_k,
            heads: input.indexer_heads,
            seed: input.seed,
        },
    )?;
    if overlap {
        store = store.with_overlap()?;
    }
    let mut schedule = Schedule::new(ScheduleConfig {
        device_pages: sizing.device.pages,
        host_pages: sizing.host_pages,
        page_size_tokens: sizing.page_size_tokens,
        write_policy: input.write_policy,
        prefill_tokens_per_s: input.prefill_tokens_per_s,
        decode_ms_per_token: input.decode_ms_per_token,
    })
    .map_err(|e| sizing.device.blame_default(e))?;
    let mut report = new_report(
        input,
        &sizing,
        facts,
        host_memory_layout,
        store.has_indexer(),
    );
    report.sampled = sampled_line(input, report.indexer, &moved);
    let per_minute = admit_requests(
        input,
        &sizing.device,
        trace,
        &mut schedule,
        &mut store,
        &mut report,
        progress,
    )?;
    schedule.drain();
    store.finish()?;
    finish_report(&mut report, per_minute, &schedule, &store);
    Ok(TraceOutcome::Completed(Box::new(report)))
}

/// Tokens sampled per step and layer at most for a model without an indexer: DeepSeek-V3.2's
/// `index_topk` (2,048), the most an indexer of the built-in models keeps (a trial's
/// `--top-k 18446744073709551615` on llama-3.1-8b panicked allocating the sample).
pub const SAMPLED_TOP_K_MAX: u64 = 2048;

/// Refuses a top-k past the model's indexer (`index_topk`), or past `SAMPLED_TOP_K_MAX` for a
/// model without one, and a zero layer, top-k or indexer head count, naming the parameter.
fn check_indexer_params(input: &TraceInput) -> Result<(), ReplayError> {
    let (max, keeps) = match input.model.config.index_topk {
        Some(topk) => (topk, "the model's indexer keeps (index_topk)"),
        None => (
            SAMPLED_TOP_K_MAX,
            "sampled per step and layer for a model without an indexer",
        ),
    };
    if input.top_k as u64 > max {
        return Err(workload_err(
            Param::TopK,
            format!("{} is more than the {max} tokens {keeps}", input.top_k),
        ));
    }
    for (field, v) in [
        (Param::Layers, input.layers),
        (Param::TopK, input.top_k as u64),
        (Param::IndexerHeads, input.indexer_heads),
    ] {
        if v == 0 {
            return Err(workload_err(field, "must be at least 1, got 0".into()));
        }
    }
    Ok(())
}

/// The device pool's pages and where they came from.
struct DevicePages {
    pages: u64,
    /// `"--device-pages"`, or the budget line of [`default_device_pages_source`].
    source: String,
    /// The pages are the H200 default (no `--device-pages`).
    defaulted: bool,
}

impl DevicePages {
    /// An error that blames `--device-pages` when the user did not pass it says where the
    /// default came from; any other error is returned as it is.
    fn blame_default(&self, e: ReplayError) -> ReplayError {
        match e {
            ReplayError::Workload {
                param: Param::DevicePages,
                problem,
                defaulted: None,
            } if self.defaulted => ReplayError::Workload {
                param: Param::DevicePages,
                problem,
                defaulted: Some(format!(
                    "the default {} pages came from {}",
                    self.pages, self.source
                )),
            },
            e => e,
        }
    }
}

/// The pools' capacities and what of them holds real bytes, decided before they are built.
struct Sizing {
    /// Tokens per page (the model pool's).
    page_size_tokens: u64,
    device: DevicePages,
    host: HostSource,
    host_pages: u64,
    /// `"--host-pages"`, the hicache ratio, or the host geometry file.
    host_pages_source: String,
    sample: Sample,
}

/// Sizes the pools from one model page: the device pages (given, or the H200 budget over the
/// bytes per page), the host (mirror of `--host-pages` or 2 x device pages, or the geometry
/// file) and the buffers whose bytes move (given, or the indexer's). Errors: a model buffer
/// that does not keep every token (DeepSeek-V4 aside), zero device or host pages, host pages
/// that overflow.
fn size_pools(input: &TraceInput) -> Result<Sizing, ReplayError> {
    // A page size the schedule cannot model is refused before any pool is sized (a 100,000-token
    // page built a 1.7 GB device pool first).
    crate::schedule::check_page_size(input.pool.page_size_tokens)?;
    let full = input.model.pool(&PoolOptions {
        pages: 1,
        ..input.pool
    })?;
    // DeepSeek-V4's pool is paged whole by the schedule (module docs); any other model with a
    // buffer that does not keep every token is refused by name.
    if input.model.attention() != kvlayout_models::Attention::Dsv4 {
        require_full_attention(&input.model.name, &full.geometry)?;
    }
    let bytes_per_page = full
        .geometry
        .total_bytes()
        .map_err(kvlayout_pool::PoolError::from)?;
    let device = match input.device_pages {
        Some(p) => DevicePages {
            pages: p,
            source: "--device-pages".to_string(),
            defaulted: false,
        },
        None => DevicePages {
            pages: kv_budget_bytes(&input.model) / bytes_per_page.max(1),
            source: default_device_pages_source(&input.model.name, bytes_per_page),
            defaulted: true,
        },
    };
    if device.pages == 0 {
        return Err(device.blame_default(workload_err(
            Param::DevicePages,
            "must be at least 1, got 0".into(),
        )));
    }
    let (host, host_pages_source) = host_source(&input.host, device.pages)?;
    let host_pages = match &host {
        HostSource::Mirror { pages, .. } => *pages,
        HostSource::Foreign { geometry, .. } => geometry.pages,
    };
    let buffers = match &input.buffers {
        Some(b) => Some(b.clone()),
        // The buffer the indexer reads: DeepSeek-V3.2's `index_k`, DeepSeek-V4's `c4_index_k`
        // (its other buffers move with `--buffers`: a C128 state slot is 524,288 B a page).
        None => ["index_k", "c4_index_k"]
            .into_iter()
            .find(|n| full.geometry.buffer_index(n).is_some())
            .map(|n| vec![n.to_string()]),
    };
    Ok(Sizing {
        page_size_tokens: full.geometry.page_size_tokens,
        device,
        host,
        host_pages,
        host_pages_source,
        sample: Sample {
            layers: input.layers,
            buffers,
        },
    })
}

/// The host of a trace replay and where its pages came from: a mirror of `--host-pages` (zero
/// refused) or [`HICACHE_RATIO`] x `device_pages` (an overflow refused), or the geometry file.
fn host_source(host: &TraceHost, device_pages: u64) -> Result<(HostSource, String), ReplayError> {
    match host {
        TraceHost::Mirror {
            pages,
            memory_layout,
        } => {
            let (pages, source) = match pages {
                Some(0) => {
                    return Err(workload_err(
                        Param::HostPages,
                        "must be at least 1, got 0".into(),
                    ));
                }
                Some(p) => (*p, "--host-pages".to_string()),
                None => (
                    device_pages.checked_mul(HICACHE_RATIO).ok_or_else(|| {
                        workload_err(Param::DevicePages, format!("{device_pages} x 2 overflows"))
                    })?,
                    "2 x device pages (SGLang --hicache-ratio 2)".to_string(),
                ),
            };
            Ok((
                HostSource::Mirror {
                    pages,
                    memory_layout: *memory_layout,
                },
                source,
            ))
        }
        TraceHost::Foreign(h) => Ok((h.clone(), "the host geometry file's pages".to_string())),
    }
}

/// The report before the first request: the pools, the pairing and the parameters, every
/// count zero (`sampled` empty, filled by [`sampled_line`]).
fn new_report(
    input: &TraceInput,
    sizing: &Sizing,
    facts: PairingFacts,
    host_memory_layout: String,
    indexer: bool,
) -> TraceReport {
    TraceReport {
        model: input.model.name.clone(),
        formats: facts.formats,
        trace: input.trace_name.clone(),
        model_layers: input.model.config.num_hidden_layers,
        simulated_layers: input.layers,
        page_size_tokens: sizing.page_size_tokens,
        device_pages: sizing.device.pages,
        device_pages_source: sizing.device.source.clone(),
        host_pages: sizing.host_pages,
        host_pages_source: sizing.host_pages_source.clone(),
        host_memory_layout,
        host_geometry: facts.host_geometry,
        pairing: facts.pairing,
        mismatch: facts.mismatch,
        device_fingerprint: facts.device_fingerprint,
        host_fingerprint: facts.host_fingerprint,
        write_policy: input.write_policy,
        prefill_tokens_per_s: input.prefill_tokens_per_s,
        decode_ms_per_token: input.decode_ms_per_token,
        sampled: String::new(),
        indexer,
        indexer_heads: input.indexer_heads,
        top_k: input.top_k as u64,
        requests: 0,
        requests_with_host_hits: 0,
        host_hit_share: 0.0,
        corrupted_requests: 0,
        corrupted_share: 0.0,
        prompt_tokens: 0,
        device_tokens: 0,
        host_tokens: 0,
        recomputed_tokens: 0,
        pages: Default::default(),
        backed_up_bytes: 0,
        loaded_bytes: 0,
        backup_transfers: 0,
        load_transfers: 0,
        first_refusal: None,
        checksum: input.checksum.to_string(),
        checksummed_pages: 0,
        checksum_mismatches: 0,
        checksum_mismatched_loads: 0,
        first_checksum_mismatch: None,
        end_ms: 0,
        per_minute: Vec::new(),
    }
}

/// The report's `sampled` line: what is exact (the page schedule) and what is sampled (the
/// layers and `moved` buffers whose bytes move, the indexer's heads and top-k).
fn sampled_line(input: &TraceInput, indexer: bool, moved: &[String]) -> String {
    let model_layers = input.model.config.num_hidden_layers;
    if indexer {
        let cfg = &input.model.config;
        format!(
            "page schedule exact at full scale; bytes of layers 0..{} of {}, buffers {}, move \
             through the pools; indexer: {} of {} heads, top-{} of {}, one query per request \
             per simulated layer, run for each request that loaded pages from the host",
            input.layers,
            model_layers,
            moved.join(", "),
            input.indexer_heads,
            cfg.index_n_heads.map_or("?".to_string(), |h| h.to_string()),
            input.top_k,
            cfg.index_topk.map_or("?".to_string(), |k| k.to_string()),
        )
    } else {
        format!(
            "page schedule exact at full scale; bytes of layers 0..{} of {}, buffers {}, move \
             through the pools; no indexer: rows of {} sampled tokens compared per request that \
             loaded pages from the host",
            input.layers,
            model_layers,
            moved.join(", "),
            input.top_k
        )
    }
}

/// The event loop: admits every request of `trace` in order (time from the first request's
/// timestamp), counting each into `report` and into its minute, and calls
/// `progress(bytes_read)` after each. Returns the per-minute series (dense, minute indices not
/// yet set). Errors: a request past [`MAX_TRACE_SPAN_MS`], an empty trace, and whatever the
/// reader and [`Schedule::admit`] refuse (a `--device-pages` error names a default's source).
fn admit_requests<B: Backend>(
    input: &TraceInput,
    device: &DevicePages,
    trace: impl BufRead,
    schedule: &mut Schedule,
    store: &mut PoolStore<B>,
    report: &mut TraceReport,
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<Minute>, ReplayError> {
    let mut per_minute: Vec<Minute> = Vec::new();
    let mut requests = TraceReader::new(Counting {
        inner: trace,
        bytes: 0,
    });
    let mut first_ms: Option<u64> = None;
    while let Some(req) = requests.next() {
        let mut req = req?;
        // Time runs from the first request (a trace of epoch timestamps replays as the same
        // trace from 0); the per-minute series is dense, so the span is bounded.
        let first_ms = *first_ms.get_or_insert(req.timestamp_ms);
        let since_ms = req.timestamp_ms - first_ms; // the reader refuses timestamps going back
        if since_ms > MAX_TRACE_SPAN_MS {
            return Err(line_err(
                req.line,
                "timestamp",
                format!(
                    "{} ms is {since_ms} ms after the first request's ({first_ms} ms), more \
                     than the {MAX_TRACE_SPAN_MS} ms (31 days) a trace may span",
                    req.timestamp_ms
                ),
            )
            .into());
        }
        let minute = (since_ms / 60_000) as usize; // at most 44,640
        req.timestamp_ms = since_ms;
        let out = schedule
            .admit(&req, store)
            .map_err(|e| device.blame_default(e))?;
        if per_minute.len() <= minute {
            per_minute.resize_with(minute + 1, Minute::default);
        }
        let m = &mut per_minute[minute];
        m.requests += 1;
        let hit = out.loaded_pages > 0;
        m.requests_with_host_hits += u64::from(hit);
        m.corrupted_requests += u64::from(out.corrupted);
        m.device_tokens += out.device_tokens;
        m.host_tokens += out.host_tokens;
        m.recomputed_tokens += out.recomputed_tokens;
        report.requests += 1;
        report.requests_with_host_hits += u64::from(hit);
        report.corrupted_requests += u64::from(out.corrupted);
        report.prompt_tokens += req.input_tokens;
        report.device_tokens += out.device_tokens;
        report.host_tokens += out.host_tokens;
        report.recomputed_tokens += out.recomputed_tokens;
        progress(requests.get_ref().bytes);
    }
    if report.requests == 0 {
        return Err(TraceError::Empty {
            trace: input.trace_name.clone(),
        }
        .into());
    }
    Ok(per_minute)
}

/// Fills in what the drained schedule and the finished store counted: pages, bytes and
/// transfers, refusals and checksums, shares, end time and the numbered per-minute series.
fn finish_report<B: Backend>(
    report: &mut TraceReport,
    mut per_minute: Vec<Minute>,
    schedule: &Schedule,
    store: &PoolStore<B>,
) {
    for (i, m) in per_minute.iter_mut().enumerate() {
        m.minute = i as u64;
    }
    let stats = store.cache().stats();
    report.pages = schedule.counts.clone();
    report.backed_up_bytes = stats.backed_up_bytes;
    report.loaded_bytes = stats.loaded_bytes;
    report.backup_transfers = stats.backups;
    report.load_transfers = stats.loads;
    report.first_refusal = store.first_refusal().map(str::to_string);
    report.checksummed_pages = stats.checksummed_pages;
    report.checksum_mismatches = stats.checksum_mismatches;
    let (mismatched_loads, first_mismatch) = store.checksum_mismatches();
    report.checksum_mismatched_loads = mismatched_loads;
    report.first_checksum_mismatch = first_mismatch.map(str::to_string);
    report.host_hit_share = share(report.requests_with_host_hits, report.requests);
    report.corrupted_share = share(report.corrupted_requests, report.requests);
    report.end_ms = schedule.now_ms();
    report.per_minute = per_minute;
}
