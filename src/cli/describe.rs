//! `kvlayout describe --model NAME|PATH [--kv-dtype bf16|fp8] [--index-k fp8|bf16|fp4]
//! [--page-size 64] [--pages N] [--json]`: a real model's device pool geometry — per buffer the
//! format, layers, bytes per token per layer, page stride and all-layer bytes per token, and the
//! all-layer total — or, with `--json`, the geometry file (`kvlayout.geometry/v1`).

use kvlayout_core::file;
use kvlayout_pool::model::{Attention, IndexK, KvDtype, Model, PoolOptions};

/// `--kv-dtype` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum KvDtypeArg {
    /// bfloat16.
    Bf16,
    /// fp8 e4m3 (DSA models: FlashMLA's 656-B sparse row).
    Fp8,
}

impl From<KvDtypeArg> for KvDtype {
    fn from(a: KvDtypeArg) -> KvDtype {
        match a {
            KvDtypeArg::Bf16 => KvDtype::Bf16,
            KvDtypeArg::Fp8 => KvDtype::Fp8,
        }
    }
}

/// `--index-k` values.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum IndexKArg {
    /// 128 e4m3 + one f32 scale per 128: 132 B/token.
    Fp8,
    /// 128 bf16: 256 B/token.
    Bf16,
    /// 128 e2m1 + 4 ue8m0: 68 B/token.
    Fp4,
}

impl From<IndexKArg> for IndexK {
    fn from(a: IndexKArg) -> IndexK {
        match a {
            IndexKArg::Fp8 => IndexK::Fp8,
            IndexKArg::Bf16 => IndexK::Bf16,
            IndexKArg::Fp4 => IndexK::Fp4,
        }
    }
}

/// Arguments of `kvlayout describe`.
#[derive(clap::Args)]
pub struct DescribeArgs {
    /// Built-in model name (deepseek-v3.2-exp, deepseek-v3, kimi-k2, glm-4.5, llama-3.1-8b,
    /// llama-3.1-70b, qwen3-8b, qwen3-235b-a22b) or a path to a Hugging Face config.json.
    #[arg(long)]
    pub model: String,
    /// KV cache dtype [default: fp8 for DSA models, bf16 otherwise].
    #[arg(long, value_enum)]
    pub kv_dtype: Option<KvDtypeArg>,
    /// Index-K dtype (DSA models) [default: fp8].
    #[arg(long, value_enum)]
    pub index_k: Option<IndexKArg>,
    /// Tokens per page.
    #[arg(long, default_value_t = 64)]
    pub page_size: u64,
    /// Device pool pages (for the pool's total bytes).
    #[arg(long, default_value_t = 1024)]
    pub pages: u64,
    /// Print the geometry file instead of the table.
    #[arg(long)]
    pub json: bool,
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

/// The `--index-k` choice (fp8 when absent); says on stderr when the model has no DSA indexer
/// to apply it to.
pub fn index_k_for(model: &Model, arg: Option<IndexKArg>) -> IndexK {
    if arg.is_some() && model.attention() != Attention::MlaDsa {
        eprintln!(
            "note: --index-k ignored: {} has no DeepSeek sparse-attention indexer (no index_head_dim)",
            model.name
        );
    }
    arg.unwrap_or(IndexKArg::Fp8).into()
}

/// Runs the subcommand: 0 on success, 2 on bad input.
pub fn run(args: &DescribeArgs) -> u8 {
    let model = match Model::load(&args.model) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    let opts = PoolOptions {
        kv_dtype: args.kv_dtype.map(Into::into),
        index_k: index_k_for(&model, args.index_k),
        page_size_tokens: args.page_size,
        pages: args.pages,
    };
    let pool = match model.pool(&opts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    if args.json {
        print!("{}", file::to_json(&pool.geometry));
        return 0;
    }
    let (rows, total, pool_bytes, fingerprint) = match (
        pool.summary(),
        pool.geometry.bytes_per_token_all_layers(),
        pool.geometry.total_bytes(),
        pool.geometry.fingerprint(),
    ) {
        (Ok(r), Ok(t), Ok(b), Ok(f)) => (r, t, b, f),
        (r, t, b, f) => {
            let e = [r.err(), t.err(), b.err()]
                .into_iter()
                .flatten()
                .map(|e| e.to_string())
                .chain(f.err().map(|e| e.to_string()))
                .collect::<Vec<_>>()
                .join("; ");
            eprintln!("error: {e}");
            return 2;
        }
    };
    let g = &pool.geometry;
    println!("model {} ({})", model.name, model.source);
    println!(
        "pool: page_size_tokens {}, pages {}, memory_layout {}, fingerprint {fingerprint:#018x}",
        g.page_size_tokens, g.pages, g.memory_layout
    );
    println!(
        "{:<8} {:<16} {:>6} {:>14} {:>14} {:>18}",
        "buffer", "format", "layers", "B/token/layer", "page stride B", "B/token (layers)"
    );
    for r in &rows {
        println!(
            "{:<8} {:<16} {:>6} {:>14} {:>14} {:>18}",
            r.name,
            r.format,
            r.layers,
            thousands(r.bytes_per_token),
            thousands(r.page_stride_bytes),
            thousands(r.bytes_per_token_all_layers)
        );
    }
    let per_layer: Vec<String> = rows.iter().map(|r| r.bytes_per_token.to_string()).collect();
    let same_layers = rows.iter().all(|r| r.layers == rows[0].layers);
    let formula = if same_layers && rows.len() > 1 {
        format!("{} x ({})", rows[0].layers, per_layer.join(" + "))
    } else if same_layers {
        format!("{} x {}", rows[0].layers, per_layer[0])
    } else {
        rows.iter()
            .map(|r| format!("{} x {}", r.layers, r.bytes_per_token))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    println!(
        "total: {formula} = {} B/token, all layers",
        thousands(total)
    );
    println!(
        "pool bytes ({} pages x {} tokens): {}",
        g.pages,
        g.page_size_tokens,
        thousands(pool_bytes)
    );
    0
}
