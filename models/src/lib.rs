//! # kvlayout-models
//!
//! Hugging Face `config.json` -> the KV pool one rank of an engine holds: every layer kind
//! (full, sliding-window, chunked local, linear-attention state), MLA and DeepSeek sparse
//! attention, tensor-parallel ranks. The CLI (`kvlayout describe`) and the Python package call
//! [`describe`] and [`totals()`]; errors name the config field and its value, and a field that
//! changes the cache but is not modelled is refused ([`ModelError::Unmodelled`]), never dropped.
//!
//! ```
//! use kvlayout_models::{ModelSource, Options, totals};
//!
//! // gpt-oss-20b: 12 sliding-window (128) + 12 full layers, 8 KV heads x 64, bf16:
//! // 2 x 8 x 64 x 2 = 2,048 B/token/layer.
//! let t = totals(&ModelSource::Name("gpt-oss-20b".into()), &Options::default())?;
//! assert_eq!(t.full_bytes_per_token, 12 * 2_048);
//! assert_eq!(t.window_bytes_per_request_max, 12 * 2_048 * 128);
//! # Ok::<(), kvlayout_models::ModelError>(())
//! ```
//!
//! Not included: the draft layers of speculative decoding (`num_nextn_predict_layers`, DeepSeek
//! MTP), which engines allocate only when speculative decoding is on.
//!
//! Modules: [`config`] (reading `config.json`), [`layers`] (layer kinds), `kv` and `state`
//! (per-layer layouts), [`shard`] (tensor parallelism), [`plan`] (buffers and geometry),
//! [`totals`](mod@totals), [`builtin`] and [`source`] (where configs come from).

#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]

pub mod builtin;
pub mod config;
pub mod decilm;
pub mod dsv4;
mod error;
mod kv;
pub mod layers;
pub mod plan;
pub mod shard;
pub mod source;
mod state;
pub mod totals;

use kvlayout_core::{Dtype, GeometryError, PoolGeometry};

pub use builtin::BUILTIN;
pub use config::ModelConfig;
pub use error::ModelError;
pub use kvlayout_core::Attention as BufferAttention;
pub use layers::LayerKind;
pub use plan::BufferPlan;
pub use shard::{Shard, Tp};
pub use source::{MAX_CONFIG_BYTES, ModelSource};
pub use totals::{LayersByAttention, Totals};

/// Attention family of a config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    /// Grouped-query (or multi-head) attention: K and V per KV head (every layer kind).
    Gqa,
    /// Multi-head latent attention (DeepSeek-V3, Kimi-K2).
    Mla,
    /// MLA plus DeepSeek sparse attention's indexer keys (DeepSeek-V3.2).
    MlaDsa,
    /// DeepSeek-V4: a sliding window on every layer, compressed KV (one row per 4 or 128
    /// tokens) and the C4 lightning indexer's keys ([`dsv4`]).
    Dsv4,
}

/// KV cache element type (`--kv-dtype`).
///
/// With the feature `clap`, a `clap::ValueEnum` taking every spelling [`Self::from_name`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum KvDtype {
    /// bfloat16.
    #[cfg_attr(feature = "clap", value(alias = "bfloat16"))]
    Bf16,
    /// fp8 e4m3 (for DSA models: FlashMLA's 656-B sparse row).
    #[cfg_attr(
        feature = "clap",
        value(alias = "fp8_e4m3", alias = "f8e4m3", alias = "float8_e4m3fn")
    )]
    Fp8,
}

impl KvDtype {
    /// Parses `bf16` / `bfloat16`, `fp8` / `f8e4m3` / `float8_e4m3fn`, case-insensitively.
    pub fn from_name(s: &str) -> Option<KvDtype> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Some(KvDtype::Bf16),
            "fp8" | "fp8_e4m3" | "f8e4m3" | "float8_e4m3fn" => Some(KvDtype::Fp8),
            _ => None,
        }
    }
}

/// Index-K element type (`--index-k`).
///
/// With the feature `clap`, a `clap::ValueEnum` taking every spelling [`Self::from_name`] takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum IndexK {
    /// e4m3 + one f32 scale per 128 (132 B for 128 dims).
    #[default]
    #[cfg_attr(feature = "clap", value(alias = "float8_e4m3fn"))]
    Fp8,
    /// bf16, no scale (256 B for 128 dims): the seed bug's device pool.
    #[cfg_attr(feature = "clap", value(alias = "bfloat16"))]
    Bf16,
    /// e2m1 + one ue8m0 scale per 32 (68 B for 128 dims).
    Fp4,
}

/// DeepSeek-V4 KV record (`--kv-layout`): which SGLang pool class writes the SWA and
/// compressed KV rows (`deepseek_v4_memory_pool.py`).
///
/// With the feature `clap`, a `clap::ValueEnum` (`flashmla`, `trtllm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum KvLayout {
    /// `DeepSeekV4SingleKVPool` (the default FlashMLA backend): 448 e4m3 NoPE + 64 bf16 RoPE,
    /// then 7 ue8m0 scales + 1 pad byte: 584 B per token, pages padded to 576 B.
    #[default]
    #[cfg_attr(feature = "clap", value(name = "flashmla"))]
    FlashMla,
    /// `DeepSeekV4UniformFP8KVPool` (`--dsv4-attn-backend trtllm`): 448 + 64 e4m3, 512 B per
    /// token, no in-cache scales, no padding.
    Trtllm,
}

impl IndexK {
    /// Parses `fp8` / `float8_e4m3fn`, `bf16` / `bfloat16`, `fp4`, case-insensitively.
    pub fn from_name(s: &str) -> Option<IndexK> {
        match s.to_ascii_lowercase().as_str() {
            "fp8" | "float8_e4m3fn" => Some(IndexK::Fp8),
            "bf16" | "bfloat16" => Some(IndexK::Bf16),
            "fp4" => Some(IndexK::Fp4),
            _ => None,
        }
    }
}

/// Recurrent-state element type (`--state-dtype`, or the config's `mamba_ssm_dtype`).
///
/// With the feature `clap`, a `clap::ValueEnum` taking every spelling [`Self::from_name`] takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum StateDtype {
    /// float32 (SGLang's default).
    #[cfg_attr(feature = "clap", value(alias = "float32", alias = "fp32"))]
    F32,
    /// bfloat16.
    #[cfg_attr(feature = "clap", value(alias = "bfloat16"))]
    Bf16,
    /// float16.
    #[cfg_attr(feature = "clap", value(alias = "float16", alias = "fp16"))]
    F16,
}

impl StateDtype {
    /// Parses `float32`/`f32`/`fp32`, `bfloat16`/`bf16`, `float16`/`f16`/`fp16`,
    /// case-insensitively.
    pub fn from_name(s: &str) -> Option<StateDtype> {
        match s.to_ascii_lowercase().as_str() {
            "float32" | "f32" | "fp32" => Some(StateDtype::F32),
            "bfloat16" | "bf16" => Some(StateDtype::Bf16),
            "float16" | "f16" | "fp16" => Some(StateDtype::F16),
            _ => None,
        }
    }

    /// The geometry dtype.
    pub const fn dtype(self) -> Dtype {
        match self {
            StateDtype::F32 => Dtype::F32,
            StateDtype::Bf16 => Dtype::Bf16,
            StateDtype::F16 => Dtype::F16,
        }
    }

    /// The geometry-file name (`f32`, `bf16`, `f16`).
    pub const fn name(self) -> &'static str {
        self.dtype().name()
    }
}

/// Choices that are not in the config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// KV dtype; `None`: fp8 for DSA models (FlashMLA sparse needs it), else the model dtype,
    /// which must be bf16 (another one is refused naming `torch_dtype`).
    pub kv_dtype: Option<KvDtype>,
    /// Index-K dtype (DSA models only).
    pub index_k: IndexK,
    /// Tokens per page.
    pub page_size_tokens: u64,
    /// Device pool pages (state buffers: slots).
    pub pages: u64,
    /// The tensor-parallel rank; `None`: the whole model on one device, no `shard` fields.
    pub tp: Option<Tp>,
    /// Recurrent-state dtype; `None`: the config's `mamba_ssm_dtype`, else f32.
    pub state_dtype: Option<StateDtype>,
    /// Give every token buffer's page the bytes of the largest (vLLM's hybrid allocator) by
    /// raising its tokens per page; `false`: one page size for all (SGLang's pools).
    pub equal_page_bytes: bool,
    /// DeepSeek-V4's KV record (other models: not read).
    pub kv_layout: KvLayout,
}

/// The name the pool crate and the CLI used before the split.
pub type PoolOptions = Options;

impl Default for Options {
    fn default() -> Self {
        Options {
            kv_dtype: None,
            index_k: IndexK::Fp8,
            page_size_tokens: 64,
            pages: 1024,
            tp: None,
            state_dtype: None,
            equal_page_bytes: false,
            kv_layout: KvLayout::FlashMla,
        }
    }
}

/// A model: its name and config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    /// Built-in name or the path given.
    pub name: String,
    /// Where the config came from (`configs/NAME.json (embedded)` or the path).
    pub source: String,
    /// The config (its `text_config` when nested).
    pub config: ModelConfig,
}

/// One buffer of a model's pool, described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSummary {
    /// Buffer name.
    pub name: String,
    /// Format name (`dsa_mla_fp8`, `index_k_bf16`, `mha_bf16_4x128`, ...).
    pub format: String,
    /// What it keeps per request.
    pub attention: BufferAttention,
    /// Layers holding the buffer.
    pub layers: u64,
    /// Bytes per token per layer (state: per slot per layer).
    pub bytes_per_token: u64,
    /// Page stride in bytes.
    pub page_stride_bytes: u64,
    /// `layers * bytes_per_token`.
    pub bytes_per_token_all_layers: u64,
    /// Tokens per stored row (1: `bytes_per_token` is per token; R > 1: it is one row's bytes,
    /// stored once per R tokens).
    pub compress_ratio: u64,
}

/// A model's pool: the buffers, and the geometry when it can be written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPool {
    /// The geometry (`layer_first`).
    pub geometry: PoolGeometry,
    /// Format name per buffer, in buffer order.
    pub formats: Vec<String>,
    /// The buffers with their attention, layers and shard.
    pub buffers: Vec<BufferPlan>,
}

impl Model {
    /// A built-in model by name (case-insensitive).
    pub fn builtin(name: &str) -> Option<Result<Model, ModelError>> {
        let (n, file, text) = builtin::find(name)?;
        Some(Model::parse(n, &format!("configs/{file} (embedded)"), text))
    }

    /// A built-in name, else a path to a `config.json` or a model directory.
    ///
    /// # Errors
    ///
    /// As [`ModelSource::load`]: ModelError::NotFound when the name is neither built in nor a
    /// readable file, else the errors of [`config::parse`].
    pub fn load(name_or_path: &str) -> Result<Model, ModelError> {
        ModelSource::Name(name_or_path.to_string()).load()
    }

    /// Parses config JSON (see [`config::parse`]).
    ///
    /// # Errors
    ///
    /// As [`config::parse`].
    pub fn parse(name: &str, source: &str, text: &str) -> Result<Model, ModelError> {
        Ok(Model {
            name: name.to_string(),
            source: source.to_string(),
            config: config::parse(name, text)?,
        })
    }

    /// Whether `model_type` or `architectures` names an MLA family (DeepSeek-V2/V3/V3.2,
    /// Kimi-K2), which must then carry `kv_lora_rank`.
    pub fn declares_mla(&self) -> bool {
        let c = &self.config;
        let mla = |s: &str| {
            let s = s.to_ascii_lowercase();
            s.starts_with("deepseek") || s.starts_with("kimi_k2")
        };
        c.model_type.as_deref().is_some_and(mla) || c.architectures.iter().flatten().any(|a| mla(a))
    }

    /// The attention family.
    pub fn attention(&self) -> Attention {
        if self.config.compress_ratios.is_some() {
            return Attention::Dsv4;
        }
        match (self.config.kv_lora_rank, self.config.index_head_dim) {
            (Some(_), Some(_)) => Attention::MlaDsa,
            (Some(_), None) => Attention::Mla,
            (None, _) => Attention::Gqa,
        }
    }

    /// Tokens per page of the engine this crate follows for the model: 256 for DeepSeek-V4
    /// (`compress_ratios`; SGLang asserts it on CUDA), 64 otherwise (the `--page-size`
    /// default).
    pub fn engine_page_size_tokens(&self) -> u64 {
        if self.config.compress_ratios.is_some() {
            dsv4::PAGE_TOKENS
        } else {
            64
        }
    }

    /// Whether the pool holds indexer keys (`--index-k` applies): DeepSeek-V3.2's DSA and
    /// DeepSeek-V4's C4 indexer.
    pub fn has_index_k(&self) -> bool {
        matches!(self.attention(), Attention::MlaDsa | Attention::Dsv4)
    }

    /// The attention kind of every layer.
    ///
    /// # Errors
    ///
    /// As [`layers::layer_kinds`].
    pub fn layer_kinds(&self) -> Result<Vec<LayerKind>, ModelError> {
        layers::layer_kinds(&self.name, &self.config)
    }

    /// The buffers of the pool under `opts`.
    ///
    /// # Errors
    ///
    /// The errors of [`Model::layer_kinds`]; ModelError::Field naming the field when heads do not
    /// split over `opts.tp`, a field the plan reads is missing or zero, or a size overflows;
    /// ModelError::Unmodelled for a value that changes the KV cache and is not modelled.
    pub fn plan(&self, opts: &Options) -> Result<Vec<BufferPlan>, ModelError> {
        if opts.page_size_tokens == 0 {
            return Err(ModelError::field(
                &self.name,
                "page_size_tokens",
                "must be at least 1, got 0",
            ));
        }
        let kinds = self.layer_kinds()?;
        plan::plan(self, &kinds, opts)
    }

    /// The device pool (`layer_first`) under `opts`.
    ///
    /// # Errors
    ///
    /// The errors of [`Model::plan`]; ModelError::Geometry when the pool's geometry is invalid or
    /// its sizes overflow 64 bits.
    pub fn pool(&self, opts: &Options) -> Result<ModelPool, ModelError> {
        let buffers = self.plan(opts)?;
        let formats: Vec<String> = buffers.iter().map(|b| b.format.clone()).collect();
        let title = format!("device: {} ({})", self.name, formats.join(" + "));
        let geometry = plan::geometry(
            &self.name,
            self.config.num_hidden_layers,
            title,
            &buffers,
            opts,
        )?;
        Ok(ModelPool {
            geometry,
            formats,
            buffers,
        })
    }

    /// The `--totals` object under `opts`.
    ///
    /// # Errors
    ///
    /// The errors of [`Model::pool`]; ModelError::Geometry when a total overflows 64 bits.
    pub fn totals(&self, opts: &Options) -> Result<Totals, ModelError> {
        let kinds = self.layer_kinds()?;
        let pool = self.pool(opts)?;
        totals::totals(&self.name, &kinds, &pool.geometry)
    }
}

/// Per-buffer sizes of `buffers` with pages of `page_size_tokens`.
///
/// # Errors
///
/// GeometryError naming `bytes per token` when a buffer's bytes per token or per page overflow 64
/// bits, or the buffer's layout is invalid.
pub fn summary(
    buffers: &[BufferPlan],
    page_size_tokens: u64,
) -> Result<Vec<BufferSummary>, GeometryError> {
    buffers
        .iter()
        .map(|b| {
            let err = |e: kvlayout_core::LayoutError| {
                GeometryError::new(format!("buffer {}", b.name), e.message())
            };
            let per = b.layout.bytes_per_token().map_err(err)?;
            // A state slot is one row (kvlayout-core: a state page is one slot).
            let page = if b.attention == BufferAttention::State {
                1
            } else {
                b.page_size_tokens.unwrap_or(page_size_tokens)
            };
            // A page of P tokens holds P / R rows of a compressed buffer.
            let rows = page / b.compress_ratio.max(1);
            let stride = b.layout.page_stride_bytes(rows).map_err(err)?;
            Ok(BufferSummary {
                name: b.name.clone(),
                format: b.format.clone(),
                attention: b.attention,
                layers: b.layers(),
                bytes_per_token: per,
                page_stride_bytes: stride,
                bytes_per_token_all_layers: b
                    .layers()
                    .checked_mul(per)
                    .ok_or_else(|| GeometryError::new("bytes per token", "overflow"))?,
                compress_ratio: b.compress_ratio,
            })
        })
        .collect()
}

impl ModelPool {
    /// Per-buffer sizes.
    ///
    /// # Errors
    ///
    /// As [`summary`].
    pub fn summary(&self) -> Result<Vec<BufferSummary>, GeometryError> {
        summary(&self.buffers, self.geometry.page_size_tokens)
    }
}

/// The pool geometry of one rank for `source` under `opts`.
///
/// # Errors
///
/// The errors of [`ModelSource::load`] and [`Model::pool`].
pub fn describe(source: &ModelSource, opts: &Options) -> Result<PoolGeometry, ModelError> {
    Ok(source.load()?.pool(opts)?.geometry)
}

/// The `--totals` object for `source` under `opts` (docs/DESIGN.md "describe --totals").
///
/// # Errors
///
/// The errors of [`ModelSource::load`] and [`Model::totals`].
pub fn totals(source: &ModelSource, opts: &Options) -> Result<Totals, ModelError> {
    source.load()?.totals(opts)
}
