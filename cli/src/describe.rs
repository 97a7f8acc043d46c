//! `kvlayout describe --model NAME|PATH|DIR [--kv-dtype bf16|fp8] [--index-k fp8|bf16|fp4]
//! [--state-dtype f32|bf16|f16] [--tp N --rank r] [--page-size 64] [--pages N]
//! [--json | --totals]`: a real model's pool geometry for one rank — per buffer the format,
//! what it keeps (all tokens, a window, a chunk, a state slot), layers, bytes per token per
//! layer, page stride and all-layer bytes — or, with `--json`, the geometry file, or, with
//! `--totals`, docs/DESIGN.md's totals object. The mapping lives in the `kvlayout-models` crate.

use kvlayout_core::file;
use kvlayout_core::fingerprint::Fingerprints;
use kvlayout_models::{
    BufferAttention, BufferPlan, BufferSummary, IndexK, KvDtype, KvLayout, LayerKind, Model,
    ModelError, ModelPool, Options, Shard, StateDtype, Totals, Tp, summary,
};

/// Arguments of `kvlayout describe`.
#[derive(clap::Args)]
pub struct DescribeArgs {
    /// Built-in model name, case-insensitive (deepseek-v3.2-exp, deepseek-v3, kimi-k2, glm-4.5,
    /// llama-3.1-8b, llama-3.1-70b, qwen3-8b, qwen3-235b-a22b, gpt-oss-20b, qwen3-coder-next,
    /// gemma-3-4b-it, gemma-4-26b-a4b, nemotron-nano-9b-v2, llama-4-scout, recurrentgemma-2b,
    /// kimi-linear-48b-a3b, gemma-4-e2b-it, deepseek-v4-flash, mimo-v2-flash), a path to a
    /// Hugging Face
    /// config.json, or a model directory holding one (DIR/config.json).
    #[arg(long)]
    pub model: String,
    /// KV cache dtype (case-insensitive; torch spellings accepted) [default: fp8 for DSA
    /// models, bf16 otherwise].
    #[arg(long, value_enum, ignore_case = true)]
    pub kv_dtype: Option<KvDtype>,
    /// Index-K dtype (DSA models only: an error on a model without the indexer) [default: fp8].
    #[arg(long, value_enum, ignore_case = true)]
    pub index_k: Option<IndexK>,
    /// Linear-attention / Mamba recurrent-state dtype (models with such layers only: an error
    /// on a model without recurrent state) [default: the config's mamba_ssm_dtype, else f32 as
    /// SGLang].
    #[arg(long, value_enum, ignore_case = true)]
    pub state_dtype: Option<StateDtype>,
    /// Tensor-parallel ranks: describe one rank's pool (KV heads split, replicated when fewer
    /// than ranks; MLA latent and index-K replicated). Without --tp no shard is written: for
    /// the TP-1 side of a `check --level token` against another TP size's rank, pass --tp 1.
    #[arg(long)]
    pub tp: Option<u64>,
    /// The rank to describe, 0..tp [default: 0].
    #[arg(long, requires = "tp")]
    pub rank: Option<u64>,
    /// DeepSeek-V4's KV record: flashmla (584 B/token) or trtllm (512 B/token)
    /// (DeepSeek-V4 only: an error on another model) [default: flashmla].
    #[arg(long, value_enum, ignore_case = true)]
    pub kv_layout: Option<KvLayout>,
    /// Tokens per page [default: the engine's: 256 for DeepSeek-V4 (SGLang on CUDA), else 64].
    #[arg(long)]
    pub page_size: Option<u64>,
    /// Device pool pages (for the pool's total bytes; not with --totals, which has none).
    #[arg(long, default_value_t = 1024, conflicts_with = "totals")]
    pub pages: u64,
    /// Give every token buffer's page the bytes of the largest by raising its tokens per page,
    /// as vLLM's hybrid KV-cache allocator does (default: one page size, as SGLang).
    #[arg(long)]
    pub equal_page_bytes: bool,
    /// Print the geometry file instead of the table.
    #[arg(long, conflicts_with = "totals")]
    pub json: bool,
    /// Print one JSON object: full_bytes_per_token, window_bytes_per_request_max,
    /// state_bytes_per_request, compressed_bytes_per_token, layers_by_attention.
    #[arg(long)]
    pub totals: bool,
}

/// `48068` -> `48,068`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// An exact byte count: thousands-separated, with its fraction when it has one (`10,570.25`).
fn exact(v: f64) -> String {
    let whole = v.trunc();
    let frac = v - whole;
    if frac == 0.0 {
        thousands(whole as u64)
    } else {
        let f = format!("{frac}");
        format!("{}{}", thousands(whole as u64), f.trim_start_matches('0'))
    }
}

/// The `--index-k` choice (fp8 when absent).
///
/// # Errors
/// `--index-k` given for a model without the DeepSeek sparse-attention indexer: the flag does
/// not apply, and the message names it and the model.
pub fn index_k_for(model: &Model, arg: Option<IndexK>) -> Result<IndexK, String> {
    if arg.is_some() && !model.has_index_k() {
        return Err(format!(
            "--index-k does not apply: {} has no DeepSeek sparse-attention indexer (no index_head_dim)",
            model.name
        ));
    }
    Ok(arg.unwrap_or_default())
}

/// Refuses `--state-dtype` for a model without recurrent state (no linear-attention, KDA,
/// RG-LRU or Mamba layer). A model whose layers cannot be read passes here: that error comes with the pool.
///
/// # Errors
/// The message names the flag and the model.
fn check_state_dtype(model: &Model, arg: Option<StateDtype>) -> Result<(), String> {
    let Some(_) = arg else { return Ok(()) };
    let Ok(kinds) = model.layer_kinds() else {
        return Ok(());
    };
    if kinds.iter().any(|k| {
        matches!(
            k,
            LayerKind::Linear | LayerKind::Mamba | LayerKind::Kda | LayerKind::RgLru
        )
    }) {
        return Ok(());
    }
    Err(format!(
        "--state-dtype does not apply: {} has no linear-attention or Mamba layers (no recurrent state)",
        model.name
    ))
}

fn attention_text(a: BufferAttention) -> String {
    match a {
        BufferAttention::Full => "full".into(),
        BufferAttention::SlidingWindow { window_tokens } => format!("window {window_tokens}"),
        BufferAttention::Chunked { chunk_tokens } => format!("chunk {chunk_tokens}"),
        BufferAttention::State => "state".into(),
    }
}

fn shard_text(s: Shard) -> String {
    match s {
        Shard::Heads {
            tp,
            heads_total,
            local,
            first,
            replicas,
        } => {
            let heads = if local == 1 {
                format!("head {first}")
            } else {
                format!("heads {first}-{}", first + local - 1)
            };
            let rep = if replicas > 1 {
                format!(", each head on {replicas} ranks")
            } else {
                String::new()
            };
            format!(
                "rank {} of {}: {heads} of {heads_total}{rep}",
                tp.rank, tp.size
            )
        }
        Shard::Replicated { tp } => format!("rank {} of {}: replicated", tp.rank, tp.size),
    }
}

fn fail(e: impl std::fmt::Display) -> u8 {
    eprintln!("error: {e}");
    2
}

/// A model error in the CLI's terms: a page size the model refuses (0, an overflowing page,
/// DeepSeek-V4's non-256) is `--page-size`'s value (or the engine's default), so the flag is
/// named with it, as replay names `--page-size-tokens`.
fn model_error(e: ModelError) -> String {
    match e {
        ModelError::Field {
            field,
            name,
            problem,
        } if field == "page_size_tokens" => format!("--page-size: {problem} (model \"{name}\")"),
        e => e.to_string(),
    }
}

fn layer_counts(kinds: &[LayerKind]) -> String {
    let mut parts = Vec::new();
    for key in [
        "full",
        "sliding",
        "chunked",
        "linear",
        "compressed",
        "mamba",
        "no_cache",
    ] {
        let n = kinds.iter().filter(|k| k.key() == key).count();
        if n > 0 {
            let span = kinds.iter().find(|k| k.key() == key).and_then(|k| match k {
                LayerKind::Sliding { window_tokens } => Some(format!(" (window {window_tokens})")),
                LayerKind::Chunked { chunk_tokens } => Some(format!(" (chunk {chunk_tokens})")),
                _ => None,
            });
            parts.push(format!("{n} {key}{}", span.unwrap_or_default()));
        }
    }
    parts.join(", ")
}

fn formula(rows: &[&BufferSummary]) -> String {
    let same_layers = rows.iter().all(|r| r.layers == rows[0].layers);
    let per_layer: Vec<String> = rows.iter().map(|r| r.bytes_per_token.to_string()).collect();
    if same_layers && rows.len() > 1 {
        format!("{} x ({})", rows[0].layers, per_layer.join(" + "))
    } else if same_layers {
        format!("{} x {}", rows[0].layers, per_layer[0])
    } else {
        rows.iter()
            .map(|r| format!("{} x {}", r.layers, r.bytes_per_token))
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

/// Runs the subcommand: 0 on success, 2 on bad input.
pub fn run(args: &DescribeArgs) -> u8 {
    match describe(args) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// Loads the model and prints what the arguments ask for: the `--totals` object, the
/// `--json` geometry file, or the table. Nothing is printed before every value it needs is
/// computed, so an error goes to stderr alone.
fn describe(args: &DescribeArgs) -> Result<(), String> {
    let model = Model::load(&args.model).map_err(|e| e.to_string())?;
    let opts = pool_options(&model, args)?;
    if args.totals {
        let totals = model.totals(&opts).map_err(model_error)?;
        println!(
            "{}",
            serde_json::to_string_pretty(&totals).expect("totals serialize")
        );
        return Ok(());
    }
    if args.json {
        let pool = model.pool(&opts).map_err(model_error)?;
        print!("{}", file::to_json(&pool.geometry));
        return Ok(());
    }
    let table = DeviceTable::compute(&model, &opts)?;
    print_table(&model, &table);
    Ok(())
}

/// The pool options of the arguments, checked against the model: `--tp`/`--rank`, then
/// `--kv-layout` (DeepSeek-V4 only), `--index-k` (DSA only), `--state-dtype` (recurrent state
/// only); the tokens per page default to the engine's.
///
/// # Errors
/// The first argument that is out of range or does not apply to the model.
fn pool_options(model: &Model, args: &DescribeArgs) -> Result<Options, String> {
    let tp = args
        .tp
        .map(|n| Tp::new(n, args.rank.unwrap_or(0)))
        .transpose()?;
    if args.kv_layout.is_some() && model.config.compress_ratios.is_none() {
        return Err(format!(
            "--kv-layout does not apply: {} is not DeepSeek-V4 (no compress_ratios)",
            model.name
        ));
    }
    let index_k = index_k_for(model, args.index_k)?;
    check_state_dtype(model, args.state_dtype)?;
    let page_size_tokens = args
        .page_size
        .unwrap_or_else(|| model.engine_page_size_tokens());
    Ok(Options {
        kv_dtype: args.kv_dtype,
        index_k,
        page_size_tokens,
        pages: args.pages,
        tp,
        state_dtype: args.state_dtype,
        equal_page_bytes: args.equal_page_bytes,
        kv_layout: args.kv_layout.unwrap_or_default(),
    })
}

/// Everything the table prints, computed before its first line.
struct DeviceTable {
    layer_kinds: Vec<LayerKind>,
    buffers: Vec<BufferPlan>,
    rows: Vec<BufferSummary>,
    pool: ModelPool,
    fingerprints: Fingerprints,
    totals: Totals,
    pool_bytes: u64,
}

impl DeviceTable {
    /// The layers, buffers, per-buffer rows, device pool, its fingerprints, the totals and the
    /// pool's bytes under `opts`.
    ///
    /// # Errors
    /// The first of them that cannot be computed (the layers before the buffers).
    fn compute(model: &Model, opts: &Options) -> Result<DeviceTable, String> {
        let (layer_kinds, buffers) = match (model.layer_kinds(), model.plan(opts)) {
            (Ok(k), Ok(b)) => (k, b),
            (Err(e), _) | (_, Err(e)) => return Err(model_error(e)),
        };
        // The pool before the summary: it blames a page size whose page overflows on the page
        // size (the summary only on a buffer).
        let pool = model.pool(opts).map_err(model_error)?;
        let rows = summary(&buffers, opts.page_size_tokens).map_err(|e| e.to_string())?;
        let fingerprints = pool.geometry.fingerprints().map_err(|e| e.to_string())?;
        let totals = model.totals(opts).map_err(model_error)?;
        let pool_bytes = pool.geometry.total_bytes().map_err(|e| e.to_string())?;
        Ok(DeviceTable {
            layer_kinds,
            buffers,
            rows,
            pool,
            fingerprints,
            totals,
            pool_bytes,
        })
    }
}

/// Prints the table: the header, one row per buffer, the buffers' pages and shards, the
/// totals and the pool's bytes.
fn print_table(model: &Model, table: &DeviceTable) {
    let geometry = &table.pool.geometry;
    println!("model {} ({})", model.name, model.source);
    println!("layers: {}", layer_counts(&table.layer_kinds));
    println!(
        "pool: page_size_tokens {}, pages {}, memory_layout {}, fingerprint {:#018x}",
        geometry.page_size_tokens, geometry.pages, geometry.memory_layout, table.fingerprints.pool
    );
    println!("fingerprints: {}", table.fingerprints);
    print_buffer_rows(&table.rows);
    print_buffer_pages_and_shards(&table.buffers);
    for line in [
        full_total_line(&table.rows, &table.totals),
        window_total_line(&table.rows, &table.totals),
        state_total_line(&table.rows, &table.totals),
        compressed_total_line(&table.rows, &table.totals),
    ]
    .into_iter()
    .flatten()
    {
        println!("{line}");
    }
    println!(
        "pool bytes ({} pages x {} tokens): {}",
        geometry.pages,
        geometry.page_size_tokens,
        thousands(table.pool_bytes)
    );
}

/// The buffer columns, one row per buffer, and the notes on compressed and state rows.
fn print_buffer_rows(rows: &[BufferSummary]) {
    // Columns as wide as the longest buffer name and format (9 and 34 at the least).
    let name_width_chars = rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(9);
    let format_width_chars = rows
        .iter()
        .map(|r| r.format.len())
        .max()
        .unwrap_or(0)
        .max(34);
    println!(
        "{:<name_width_chars$} {:<format_width_chars$} {:<11} {:>6} {:>14} {:>14} {:>18}",
        "buffer", "format", "keeps", "layers", "B/token/layer", "page stride B", "B/token (layers)"
    );
    for r in rows {
        // A compressed buffer's bytes are per row, one row per R tokens.
        let per_row = |bytes: u64| match r.compress_ratio {
            1 => thousands(bytes),
            ratio => format!("{} per {ratio}", thousands(bytes)),
        };
        println!(
            "{:<name_width_chars$} {:<format_width_chars$} {:<11} {:>6} {:>14} {:>14} {:>18}",
            r.name,
            r.format,
            attention_text(r.attention),
            r.layers,
            per_row(r.bytes_per_token),
            thousands(r.page_stride_bytes),
            per_row(r.bytes_per_token_all_layers)
        );
    }
    if rows.iter().any(|r| r.compress_ratio > 1) {
        println!(
            "(\"per R\": a compressed buffer stores one row per R tokens; its bytes are per row)"
        );
    }
    if rows.iter().any(|r| r.attention == BufferAttention::State) {
        println!(
            "(state rows: bytes per request slot per layer, not per token; a page is one slot)"
        );
    }
}

/// A line per buffer with its own tokens per page (`--equal-page-bytes`), then a line per
/// sharded buffer.
fn print_buffer_pages_and_shards(buffers: &[BufferPlan]) {
    for b in buffers {
        if let Some(page_size_tokens) = b.page_size_tokens {
            println!(
                "page {}: {page_size_tokens} tokens (equal page bytes)",
                b.name
            );
        }
    }
    for b in buffers {
        if let Some(s) = b.shard {
            println!("shard {}: {}", b.name, shard_text(s));
        }
    }
}

/// `total:` the bytes per token of the full-attention, uncompressed buffers; none without one.
fn full_total_line(rows: &[BufferSummary], totals: &Totals) -> Option<String> {
    let full_rows: Vec<&BufferSummary> = rows
        .iter()
        .filter(|r| r.attention == BufferAttention::Full && r.compress_ratio == 1)
        .collect();
    if full_rows.is_empty() {
        return None;
    }
    let scope = if full_rows.len() != rows.len() {
        "in full-attention layers"
    } else {
        "all layers"
    };
    Some(format!(
        "total: {} = {} B/token, {scope}",
        formula(&full_rows),
        thousands(totals.full_bytes_per_token)
    ))
}

/// `window:` the most bytes a request keeps in windowed and chunked layers; none without one.
fn window_total_line(rows: &[BufferSummary], totals: &Totals) -> Option<String> {
    let window_terms: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let window_tokens = r.attention.tokens();
            (window_tokens > 0 && r.compress_ratio == 1)
                .then(|| format!("{} x {} x {window_tokens}", r.layers, r.bytes_per_token))
        })
        .collect();
    (!window_terms.is_empty()).then(|| {
        format!(
            "window: {} = {} B/request at most, windowed/chunked layers",
            window_terms.join(" + "),
            thousands(totals.window_bytes_per_request_max)
        )
    })
}

/// `state:` the recurrent-state (or compressor-state) bytes per request; none without state.
fn state_total_line(rows: &[BufferSummary], totals: &Totals) -> Option<String> {
    let state_rows: Vec<&BufferSummary> = rows
        .iter()
        .filter(|r| r.attention == BufferAttention::State)
        .collect();
    if state_rows.is_empty() {
        return None;
    }
    let what = if rows.iter().any(|r| r.compress_ratio > 1) {
        "compressor state rings kept per request"
    } else {
        "linear-attention / Mamba layers"
    };
    Some(format!(
        "state: {} = {} B/request, {what}",
        formula(&state_rows),
        thousands(totals.state_bytes_per_request)
    ))
}

/// `compressed:` the bytes per token of the compressed buffers; none without one.
fn compressed_total_line(rows: &[BufferSummary], totals: &Totals) -> Option<String> {
    let compressed_terms: Vec<String> = rows
        .iter()
        .filter(|r| r.compress_ratio > 1)
        .map(|r| {
            format!(
                "{} x {} / {}",
                r.layers, r.bytes_per_token, r.compress_ratio
            )
        })
        .collect();
    (!compressed_terms.is_empty()).then(|| {
        format!(
            "compressed: {} = {} B/token, rows stored once per R tokens",
            compressed_terms.join(" + "),
            exact(totals.compressed_bytes_per_token)
        )
    })
}
