//! Real model configs -> pool geometry.
//!
//! The configs under `configs/` carry the Hugging Face `config.json` field names and values
//! (sources in `configs/README.md`) and are embedded in the binary, so `--model NAME` works from
//! any directory; `--model PATH` reads a file. Mapping (DESIGN-facts.md "Token layouts"):
//! - MLA (`kv_lora_rank` present): buffer `kv`, one row per token: bf16 latent + rope
//!   (`mla_bf16`, 1152 B for 512 + 64), plain fp8 (`mla_fp8`, 576 B), or — for DSA models
//!   (`index_head_dim` present) in fp8 — FlashMLA's sparse row (`dsa_mla_fp8`, 656 B).
//! - DSA: plus buffer `index_k` (DeepSeek-V3.2 lightning indexer keys), one per layer:
//!   `index_k_fp8` 132 B, `index_k_bf16` 256 B or `index_k_fp4` 68 B (for `index_head_dim`
//!   128), values then scales.
//! - GQA/MHA: buffer `kv` with sections `k` and `v` of `[num_key_value_heads, head_dim]`
//!   (K plane then V plane in a page), bf16 or e4m3; `head_dim` = `hidden_size /
//!   num_attention_heads` when absent (Llama-3.1).

use std::borrow::Cow;
use std::io::Read;
use std::path::Path;

use kvlayout_core::{
    Arrangement, BufferGeometry, Dtype, GeometryError, MemoryLayout, PoolGeometry, ScaleOf,
    Section, TokenLayout, formats,
};
use serde::Deserialize;

/// The embedded configs: (CLI name, file name, JSON text).
pub const BUILTIN: &[(&str, &str, &str)] = &[
    (
        "deepseek-v3.2-exp",
        "deepseek-v3.2-exp.json",
        include_str!("../../configs/deepseek-v3.2-exp.json"),
    ),
    (
        "deepseek-v3",
        "deepseek-v3.json",
        include_str!("../../configs/deepseek-v3.json"),
    ),
    (
        "kimi-k2",
        "kimi-k2.json",
        include_str!("../../configs/kimi-k2.json"),
    ),
    (
        "glm-4.5",
        "glm-4.5.json",
        include_str!("../../configs/glm-4.5.json"),
    ),
    (
        "llama-3.1-8b",
        "llama-3.1-8b.json",
        include_str!("../../configs/llama-3.1-8b.json"),
    ),
    (
        "llama-3.1-70b",
        "llama-3.1-70b.json",
        include_str!("../../configs/llama-3.1-70b.json"),
    ),
    (
        "qwen3-8b",
        "qwen3-8b.json",
        include_str!("../../configs/qwen3-8b.json"),
    ),
    (
        "qwen3-235b-a22b",
        "qwen3-235b-a22b.json",
        include_str!("../../configs/qwen3-235b-a22b.json"),
    ),
];

/// An error reading a config or mapping it to a pool.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Neither a built-in name nor a readable file.
    #[error("model \"{name}\": not a built-in model ({known}) and not a readable file: {reason}")]
    NotFound {
        /// What was asked for.
        name: String,
        /// The built-in names.
        known: String,
        /// The I/O error.
        reason: String,
    },
    /// The JSON does not parse or lacks a field.
    #[error("model \"{name}\": {reason}")]
    Parse {
        /// Model name or path.
        name: String,
        /// serde_json's message (field, line, column).
        reason: String,
    },
    /// A field has a value the mapping cannot use.
    #[error("model \"{name}\": {field}: {problem}")]
    Field {
        /// Model name or path.
        name: String,
        /// `config.json` field.
        field: &'static str,
        /// What is wrong, with the value.
        problem: String,
    },
    /// The resulting geometry is invalid.
    #[error("model \"{name}\": {source}")]
    Geometry {
        /// Model name.
        name: String,
        /// The geometry error.
        #[source]
        source: GeometryError,
    },
}

/// Largest `config.json` read (16 MiB; real ones are a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The attention-related fields of a Hugging Face `config.json` (other fields are ignored).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ModelConfig {
    /// `model_type` (`deepseek_v32`, `llama`, ...).
    #[serde(default)]
    pub model_type: Option<String>,
    /// `architectures` (`DeepseekV32ForCausalLM`, `LlamaForCausalLM`, ...).
    #[serde(default)]
    pub architectures: Option<Vec<String>>,
    /// Transformer layers.
    pub num_hidden_layers: u64,
    /// Query heads.
    pub num_attention_heads: u64,
    /// KV heads (GQA); absent means MHA (= `num_attention_heads`).
    #[serde(default)]
    pub num_key_value_heads: Option<u64>,
    /// Model width.
    #[serde(default)]
    pub hidden_size: Option<u64>,
    /// Head dimension; absent means `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<u64>,
    /// MLA compressed KV rank (latent elements per token).
    #[serde(default)]
    pub kv_lora_rank: Option<u64>,
    /// MLA decoupled RoPE key elements per token.
    #[serde(default)]
    pub qk_rope_head_dim: Option<u64>,
    /// DSA indexer heads.
    #[serde(default)]
    pub index_n_heads: Option<u64>,
    /// DSA indexer key elements per token.
    #[serde(default)]
    pub index_head_dim: Option<u64>,
    /// DSA tokens selected per query.
    #[serde(default)]
    pub index_topk: Option<u64>,
}

/// Attention family of a config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    /// Grouped-query (or multi-head) attention: K and V per KV head.
    Gqa,
    /// Multi-head latent attention (DeepSeek-V3, Kimi-K2).
    Mla,
    /// MLA plus DeepSeek sparse attention's indexer keys (DeepSeek-V3.2).
    MlaDsa,
}

/// KV cache element type (`--kv-dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    /// bfloat16.
    Bf16,
    /// fp8 e4m3 (for DSA models: FlashMLA's 656-B sparse row).
    Fp8,
}

/// Index-K element type (`--index-k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexK {
    /// e4m3 + one f32 scale per 128 (132 B for 128 dims).
    Fp8,
    /// bf16, no scale (256 B for 128 dims): the seed bug's device pool.
    Bf16,
    /// e2m1 + one ue8m0 scale per 32 (68 B for 128 dims).
    Fp4,
}

/// Choices that are not in the config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    /// KV dtype; `None`: fp8 for DSA models (FlashMLA sparse needs it), bf16 otherwise.
    pub kv_dtype: Option<KvDtype>,
    /// Index-K dtype (DSA models only).
    pub index_k: IndexK,
    /// Tokens per page.
    pub page_size_tokens: u64,
    /// Device pool pages.
    pub pages: u64,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            kv_dtype: None,
            index_k: IndexK::Fp8,
            page_size_tokens: 64,
            pages: 1024,
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
    /// The config.
    pub config: ModelConfig,
}

/// One buffer of a model's pool, described.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSummary {
    /// Buffer name.
    pub name: String,
    /// Format name (`dsa_mla_fp8`, `index_k_bf16`, `mha_bf16_4x128`, ...).
    pub format: String,
    /// Layers holding the buffer.
    pub layers: u64,
    /// Bytes per token per layer.
    pub bytes_per_token: u64,
    /// Page stride in bytes.
    pub page_stride_bytes: u64,
    /// `layers * bytes_per_token`.
    pub bytes_per_token_all_layers: u64,
}

/// A model's device pool geometry with per-buffer format names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelPool {
    /// The geometry (`layer_first`).
    pub geometry: PoolGeometry,
    /// Format name per buffer, in buffer order.
    pub formats: Vec<String>,
}

impl Model {
    /// A built-in model by name (case-insensitive).
    pub fn builtin(name: &str) -> Option<Result<Model, ModelError>> {
        let (n, file, text) = BUILTIN
            .iter()
            .find(|(n, _, _)| n.eq_ignore_ascii_case(name))?;
        Some(Model::parse(n, &format!("configs/{file} (embedded)"), text))
    }

    /// A built-in name, else a path to a `config.json`.
    pub fn load(name_or_path: &str) -> Result<Model, ModelError> {
        if let Some(m) = Model::builtin(name_or_path) {
            return m;
        }
        let not_found = |reason: String| ModelError::NotFound {
            name: name_or_path.to_string(),
            known: BUILTIN
                .iter()
                .map(|(n, _, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
            reason,
        };
        // A Hugging Face model directory holds its config.json.
        let mut path = Path::new(name_or_path).to_path_buf();
        if path.is_dir() {
            path.push("config.json");
        }
        let file = std::fs::File::open(&path).map_err(|e| not_found(e.to_string()))?;
        let mut bytes = Vec::new();
        file.take(MAX_CONFIG_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| not_found(e.to_string()))?;
        if bytes.len() as u64 > MAX_CONFIG_BYTES {
            return Err(not_found(format!(
                "{} is larger than the {MAX_CONFIG_BYTES}-byte limit for a config.json",
                path.display()
            )));
        }
        let text = String::from_utf8(bytes).map_err(|e| not_found(format!("not UTF-8: {e}")))?;
        Model::parse(name_or_path, name_or_path, &text)
    }

    /// Parses config JSON.
    pub fn parse(name: &str, source: &str, text: &str) -> Result<Model, ModelError> {
        let parse_err = |reason: String| ModelError::Parse {
            name: name.to_string(),
            reason,
        };
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?;
        if !value.is_object() {
            return Err(parse_err("a config.json must be a JSON object".into()));
        }
        let config: ModelConfig = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            if path == "." {
                parse_err(e.inner().to_string())
            } else {
                parse_err(format!("{path}: {}", e.inner()))
            }
        })?;
        Ok(Model {
            name: name.to_string(),
            source: source.to_string(),
            config,
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
        match (self.config.kv_lora_rank, self.config.index_head_dim) {
            (Some(_), Some(_)) => Attention::MlaDsa,
            (Some(_), None) => Attention::Mla,
            (None, _) => Attention::Gqa,
        }
    }

    fn field_err(&self, field: &'static str, problem: impl Into<String>) -> ModelError {
        ModelError::Field {
            name: self.name.clone(),
            field,
            problem: problem.into(),
        }
    }

    fn positive(&self, field: &'static str, v: Option<u64>) -> Result<u64, ModelError> {
        match v {
            Some(0) => Err(self.field_err(field, "must be at least 1, got 0")),
            Some(v) => Ok(v),
            None => Err(self.field_err(field, "missing")),
        }
    }

    /// GQA head dimension: `head_dim`, else `hidden_size / num_attention_heads` (exact).
    pub fn head_dim(&self) -> Result<u64, ModelError> {
        if let Some(d) = self.config.head_dim {
            return self.positive("head_dim", Some(d));
        }
        let hidden = self.positive("hidden_size", self.config.hidden_size)?;
        let heads = self.positive("num_attention_heads", Some(self.config.num_attention_heads))?;
        if hidden % heads != 0 {
            return Err(self.field_err(
                "hidden_size",
                format!("{hidden} is not a multiple of num_attention_heads {heads}"),
            ));
        }
        Ok(hidden / heads)
    }

    fn kv_layout(&self, kv: KvDtype) -> Result<(String, TokenLayout), ModelError> {
        let c = &self.config;
        match self.attention() {
            Attention::Gqa => {
                let heads = self.positive(
                    "num_key_value_heads",
                    Some(c.num_key_value_heads.unwrap_or(c.num_attention_heads)),
                )?;
                let q_heads = self.positive("num_attention_heads", Some(c.num_attention_heads))?;
                if q_heads % heads != 0 {
                    return Err(self.field_err(
                        "num_key_value_heads",
                        format!(
                            "{heads} does not divide num_attention_heads {q_heads} (each KV head serves a whole group of query heads)"
                        ),
                    ));
                }
                let dim = self.head_dim()?;
                let (dtype, tag, konst) = match kv {
                    KvDtype::Bf16 => (Dtype::Bf16, "bf16", formats::MHA_BF16_8X128),
                    KvDtype::Fp8 => (Dtype::F8E4M3, "fp8", formats::MHA_FP8_8X128),
                };
                let name = format!("mha_{tag}_{heads}x{dim}");
                if (heads, dim) == (8, 128) {
                    return Ok((name, konst));
                }
                let shape: Cow<'static, [u64]> = Cow::Owned(vec![heads, dim]);
                Ok((
                    name,
                    owned_layout(
                        Arrangement::SectionMajor,
                        vec![
                            section("k", dtype, shape.clone(), None),
                            section("v", dtype, shape, None),
                        ],
                    ),
                ))
            }
            attention => {
                let rank = self.positive("kv_lora_rank", c.kv_lora_rank)?;
                let rope = self.positive("qk_rope_head_dim", c.qk_rope_head_dim)?;
                let standard = (rank, rope) == (512, 64);
                match (kv, attention == Attention::MlaDsa) {
                    (KvDtype::Bf16, _) => Ok((
                        if standard {
                            "mla_bf16".into()
                        } else {
                            format!("mla_bf16_{rank}_{rope}")
                        },
                        if standard {
                            formats::MLA_BF16
                        } else {
                            owned_layout(
                                Arrangement::TokenMajor,
                                vec![
                                    section("latent", Dtype::Bf16, Cow::Owned(vec![rank]), None),
                                    section("rope", Dtype::Bf16, Cow::Owned(vec![rope]), None),
                                ],
                            )
                        },
                    )),
                    (KvDtype::Fp8, false) => Ok((
                        if standard {
                            "mla_fp8".into()
                        } else {
                            format!("mla_fp8_{rank}_{rope}")
                        },
                        if standard {
                            formats::MLA_FP8
                        } else {
                            owned_layout(
                                Arrangement::TokenMajor,
                                vec![
                                    section("latent", Dtype::F8E4M3, Cow::Owned(vec![rank]), None),
                                    section("rope", Dtype::F8E4M3, Cow::Owned(vec![rope]), None),
                                ],
                            )
                        },
                    )),
                    (KvDtype::Fp8, true) => {
                        if standard {
                            return Ok(("dsa_mla_fp8".into(), formats::DSA_MLA_FP8));
                        }
                        if rank % 128 != 0 {
                            return Err(self.field_err(
                                "kv_lora_rank",
                                format!("{rank} is not a multiple of the 128-element scale block"),
                            ));
                        }
                        Ok((
                            format!("dsa_mla_fp8_{rank}_{rope}"),
                            owned_layout(
                                Arrangement::TokenMajor,
                                vec![
                                    section("nope", Dtype::F8E4M3, Cow::Owned(vec![rank]), None),
                                    section(
                                        "nope_scale",
                                        Dtype::F32,
                                        Cow::Owned(vec![rank / 128]),
                                        Some((0, 128)),
                                    ),
                                    section("rope", Dtype::Bf16, Cow::Owned(vec![rope]), None),
                                ],
                            ),
                        ))
                    }
                }
            }
        }
    }

    fn index_k_layout(&self, index_k: IndexK) -> Result<(String, TokenLayout), ModelError> {
        let dim = self.positive("index_head_dim", self.config.index_head_dim)?;
        let (name, konst, block) = match index_k {
            IndexK::Fp8 => ("index_k_fp8", formats::INDEX_K_FP8, 128),
            IndexK::Bf16 => ("index_k_bf16", formats::INDEX_K_BF16, 1),
            IndexK::Fp4 => ("index_k_fp4", formats::INDEX_K_FP4, 32),
        };
        if dim == 128 {
            return Ok((name.into(), konst));
        }
        if dim % block != 0 {
            return Err(self.field_err(
                "index_head_dim",
                format!("{dim} is not a multiple of the {block}-element scale block"),
            ));
        }
        let values = |d| section("values", d, Cow::Owned(vec![dim]), None);
        let sections = match index_k {
            IndexK::Fp8 => vec![
                values(Dtype::F8E4M3),
                section(
                    "scale",
                    Dtype::F32,
                    Cow::Owned(vec![dim / 128]),
                    Some((0, 128)),
                ),
            ],
            IndexK::Bf16 => vec![values(Dtype::Bf16)],
            IndexK::Fp4 => vec![
                values(Dtype::F4E2M1),
                section(
                    "scale",
                    Dtype::Ue8m0,
                    Cow::Owned(vec![dim / 32]),
                    Some((0, 32)),
                ),
            ],
        };
        // Not the built-in 128-dim format: the name says the dimension.
        Ok((
            format!("{name}_{dim}"),
            owned_layout(Arrangement::SectionMajor, sections),
        ))
    }

    /// The device pool geometry (`layer_first`) for `opts`.
    pub fn pool(&self, opts: &PoolOptions) -> Result<ModelPool, ModelError> {
        let layers = self.positive("num_hidden_layers", Some(self.config.num_hidden_layers))?;
        if self.config.kv_lora_rank.is_none()
            && (self.declares_mla() || self.config.index_head_dim.is_some())
        {
            return Err(self.field_err(
                "kv_lora_rank",
                "missing: the config declares an MLA model (DeepSeek / Kimi-K2 model_type or architectures, or an index_head_dim), whose KV cache is the compressed latent",
            ));
        }
        let dsa = self.attention() == Attention::MlaDsa;
        let kv = opts
            .kv_dtype
            .unwrap_or(if dsa { KvDtype::Fp8 } else { KvDtype::Bf16 });
        let (kv_format, kv_layout) = self.kv_layout(kv)?;
        let mut buffers = vec![BufferGeometry::new(Cow::Borrowed("kv"), layers, kv_layout)];
        let mut names = vec![kv_format];
        if dsa {
            let (f, l) = self.index_k_layout(opts.index_k)?;
            buffers.push(BufferGeometry::new(Cow::Borrowed("index_k"), layers, l));
            names.push(f);
        }
        let geometry = PoolGeometry {
            name: format!("device: {} ({})", self.name, names.join(" + ")),
            page_size_tokens: opts.page_size_tokens,
            pages: opts.pages,
            memory_layout: MemoryLayout::LayerFirst,
            buffers,
        };
        geometry.validate().map_err(|source| ModelError::Geometry {
            name: self.name.clone(),
            source,
        })?;
        Ok(ModelPool {
            geometry,
            formats: names,
        })
    }
}

impl ModelPool {
    /// Per-buffer sizes.
    pub fn summary(&self) -> Result<Vec<BufferSummary>, GeometryError> {
        let g = &self.geometry;
        (0..g.buffers.len())
            .map(|b| {
                let pg = g.page_geometry(b)?;
                let layers = g.buffers[b].layers;
                Ok(BufferSummary {
                    name: g.buffers[b].name().to_string(),
                    format: self.formats.get(b).cloned().unwrap_or_default(),
                    layers,
                    bytes_per_token: pg.bytes_per_token,
                    page_stride_bytes: pg.page_stride_bytes,
                    bytes_per_token_all_layers: layers
                        .checked_mul(pg.bytes_per_token)
                        .ok_or_else(|| GeometryError::new("bytes per token", "overflow"))?,
                })
            })
            .collect()
    }
}

fn section(
    name: &'static str,
    dtype: Dtype,
    shape: Cow<'static, [u64]>,
    scale: Option<(usize, u64)>,
) -> Section {
    Section {
        name: Cow::Borrowed(name),
        dtype,
        shape,
        scale: scale.map(|(target, block_elems)| ScaleOf {
            target,
            block_elems,
        }),
        order: None,
    }
}

fn owned_layout(arrangement: Arrangement, sections: Vec<Section>) -> TokenLayout {
    TokenLayout {
        arrangement,
        sections: Cow::Owned(sections),
        page_align_bytes: None,
        page_stride_bytes: None,
    }
}
