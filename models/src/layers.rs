//! Layer kinds: which attention each model layer runs, read the way the engines read it.
//!
//! In order of precedence:
//! 1. `layer_types` (one entry per layer): `full_attention`, `sliding_attention` (window
//!    `sliding_window`), `chunked_attention` (chunk `attention_chunk_size`), `linear_attention`
//!    (a per-request recurrent state); any other value is refused naming it.
//! 2. The 2026 families' own fields, in this order: `compress_ratios` (DeepSeek-V4: 0 a
//!    sliding-window layer, 4 / 128 compressed; [`crate::dsv4`]), `block_types` / `_block_types`
//!    (RecurrentGemma: `attention` blocks attend to the last `attention_window_size` tokens,
//!    `recurrent` blocks hold an RG-LRU state), `linear_attn_config` (Kimi-Linear: 1-based
//!    `kda_layers` and `full_attn_layers`), `hybrid_layer_pattern` (MiMo-V2: `1` sliding, `0`
//!    full), `block_configs` (DeciLM / Nemotron-NAS: `no_op` or `replace_with_linear`
//!    attention has no cache; see [`crate::decilm`]).
//! 3. `hybrid_override_pattern` (Nemotron-H, vLLM `nemotron_h.py`): one character per layer,
//!    `M` a Mamba2 mixer (state per request), `*` attention, `-` MLP and `E` MoE (no cache);
//!    any other character is refused naming it.
//! 4. `full_attention_interval` (Qwen3-Next, SGLang `configs/qwen3_next.py`
//!    `layers_block_type`): layer `i` is full iff `(i + 1) % interval == 0`, else linear.
//! 5. `attention_chunk_size` (Llama 4, transformers `Llama4TextConfig`, vLLM `llama4.py`):
//!    `no_rope_layers[i] == 1` is a RoPE layer with chunked local attention, `0` a NoPE layer
//!    attending globally; an empty or absent list is `(i + 1) % no_rope_layer_interval != 0`
//!    (interval 4 by default: layers 3, 7, 11, ... are global).
//! 6. `sliding_window`, when in use: `use_sliding_window` says so; absent, it is `false` for
//!    a `qwen*` model type or a config with `max_window_layers` (transformers `Qwen2Config`,
//!    `Qwen3Config` default it to `False`: the window field is carried, not used) and `true`
//!    otherwise. With `use_sliding_window: true` (or `max_window_layers`), layers
//!    `i >= max_window_layers` are windowed and the first ones full (transformers
//!    `Qwen3Config.layer_types`); `max_window_layers` missing is refused. Else, with
//!    `sliding_window_pattern` `p` (Gemma 3) layer `i` is global iff `(i + 1) % p == 0`; without
//!    it Gemma 2 alternates (`p` = 2) and Gemma 3 uses the transformers default `p` = 6, a
//!    Cohere 2 / EXAONE 4 config is refused (its default pattern is not modelled); any other
//!    model windows every layer (Mistral-7B-v0.1).
//! 7. Otherwise every layer is full attention.
//!
//! When both `layer_types` and a pattern field are given they must agree (the first layer where
//! they differ is named).

use crate::{ModelConfig, ModelError};

/// Most layers a config may declare (bounds memory; real models have at most a few hundred).
pub const MAX_LAYERS: u64 = 1 << 16;

/// The attention one layer runs, with its span in tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Attends to every past token.
    Full,
    /// Attends to the last `window_tokens` tokens.
    Sliding {
        /// `sliding_window`.
        window_tokens: u64,
    },
    /// Chunked local attention: tokens of the current `chunk_tokens`-token chunk.
    Chunked {
        /// `attention_chunk_size`.
        chunk_tokens: u64,
    },
    /// Linear attention (Gated DeltaNet): a fixed-size state per request, no per-token cache.
    Linear,
    /// A Mamba2 mixer (Nemotron-H `M`): a fixed-size state per request.
    Mamba,
    /// No cache at all (Nemotron-H `-` MLP and `E` MoE layers; DeciLM `no_op` and
    /// `replace_with_linear` attention).
    NoCache,
    /// Kimi Delta Attention (Kimi-Linear `linear_attn_config.kda_layers`): a fixed-size conv and
    /// recurrent state per request.
    Kda,
    /// RecurrentGemma's recurrent block (RG-LRU): a conv window and an f32 recurrent state per
    /// request.
    RgLru,
    /// DeepSeek-V4 compressed attention (`compress_ratios[i]` 4 or 128): one compressed row per
    /// `ratio` tokens beside the sliding window every V4 layer keeps.
    Compressed {
        /// Tokens per compressed row.
        ratio: u64,
    },
}

impl LayerKind {
    /// The `layers_by_attention` key: `full`, `sliding`, `chunked`, `linear`.
    pub const fn key(self) -> &'static str {
        match self {
            LayerKind::Full => "full",
            LayerKind::Sliding { .. } => "sliding",
            LayerKind::Chunked { .. } => "chunked",
            LayerKind::Linear | LayerKind::Kda | LayerKind::RgLru => "linear",
            LayerKind::Mamba => "mamba",
            LayerKind::NoCache => "no_cache",
            LayerKind::Compressed { .. } => "compressed",
        }
    }
}

struct Ctx<'a> {
    name: &'a str,
    c: &'a ModelConfig,
}

impl Ctx<'_> {
    fn err(&self, field: impl Into<String>, problem: impl Into<String>) -> ModelError {
        ModelError::field(self.name, field, problem)
    }

    fn positive(&self, field: &str, v: Option<u64>, needed_by: &str) -> Result<u64, ModelError> {
        match v {
            Some(0) => Err(self.err(field, format!("must be at least 1, got 0 ({needed_by})"))),
            Some(v) => Ok(v),
            None => Err(self.err(field, format!("missing ({needed_by})"))),
        }
    }

    fn window(&self, why: &str) -> Result<LayerKind, ModelError> {
        Ok(LayerKind::Sliding {
            window_tokens: self.positive("sliding_window", self.c.sliding_window, why)?,
        })
    }

    fn chunk(&self, why: &str) -> Result<LayerKind, ModelError> {
        Ok(LayerKind::Chunked {
            chunk_tokens: self.positive(
                "attention_chunk_size",
                self.c.attention_chunk_size,
                why,
            )?,
        })
    }

    fn kinds_of_layer_types(
        &self,
        types: &[String],
        layers: u64,
    ) -> Result<Vec<LayerKind>, ModelError> {
        if types.len() as u64 != layers {
            return Err(self.err(
                "layer_types",
                format!(
                    "{} entries, but num_hidden_layers is {layers} (one entry per layer)",
                    types.len()
                ),
            ));
        }
        types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                "full_attention" => Ok(LayerKind::Full),
                "sliding_attention" => {
                    self.window(&format!("layer_types[{i}] is sliding_attention"))
                }
                "chunked_attention" => {
                    self.chunk(&format!("layer_types[{i}] is chunked_attention"))
                }
                "linear_attention" => Ok(LayerKind::Linear),
                other => Err(self.err(
                    format!("layer_types[{i}]"),
                    format!(
                        "\"{other}\" is not a layer type kvlayout models (full_attention, \
                         sliding_attention, chunked_attention, linear_attention)"
                    ),
                )),
            })
            .collect()
    }

    fn every(
        &self,
        field: &str,
        period: Option<u64>,
        layers: u64,
    ) -> Result<Vec<bool>, ModelError> {
        let p = self.positive(field, period, "a layer pattern period")?;
        Ok((0..layers).map(|i| (i + 1) % p == 0).collect())
    }

    fn llama4(&self, layers: u64) -> Result<Vec<LayerKind>, ModelError> {
        let rope: Vec<bool> = match self.c.no_rope_layers.as_deref() {
            Some(list) if !list.is_empty() => {
                if list.len() as u64 != layers {
                    return Err(self.err(
                        "no_rope_layers",
                        format!(
                            "{} entries, but num_hidden_layers is {layers} (one entry per layer)",
                            list.len()
                        ),
                    ));
                }
                list.iter()
                    .enumerate()
                    .map(|(i, &v)| match v {
                        0 => Ok(false),
                        1 => Ok(true),
                        v => Err(self.err(
                            format!("no_rope_layers[{i}]"),
                            format!("{v}: expected 1 (RoPE, chunked) or 0 (NoPE, global)"),
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
            _ => self
                .every(
                    "no_rope_layer_interval",
                    Some(self.c.no_rope_layer_interval.unwrap_or(4)),
                    layers,
                )?
                .into_iter()
                .map(|nope| !nope)
                .collect(),
        };
        rope.into_iter()
            .map(|r| {
                if r {
                    self.chunk("RoPE layers of a Llama 4 config")
                } else {
                    Ok(LayerKind::Full)
                }
            })
            .collect()
    }

    fn sliding_period(&self) -> Result<Option<u64>, ModelError> {
        if self.c.sliding_window_pattern.is_some() {
            return Ok(self.c.sliding_window_pattern);
        }
        match self.c.model_type.as_deref() {
            Some(t) if t.starts_with("gemma2") => Ok(Some(2)),
            Some(t) if t.starts_with("gemma3") => Ok(Some(6)),
            // transformers Cohere2Config / Exaone4Config default the pattern (4) and derive
            // layer_types from it; not modelled without the field: refused, never every layer.
            Some(t) if t.starts_with("cohere2") || t.starts_with("exaone4") => Err(self.err(
                "sliding_window_pattern",
                format!(
                    "missing: a {t} config windows only some layers (transformers defaults the \
                     pattern); give sliding_window_pattern or layer_types"
                ),
            )),
            _ => Ok(None),
        }
    }

    /// Whether `sliding_window` is in use: `use_sliding_window` when given; absent, `false` for
    /// the configs that define it (transformers `Qwen2Config`, `Qwen3Config` and their MoE and
    /// multimodal kin default it to `False`; `max_window_layers` is their field too), else
    /// `true` (Mistral-7B-v0.1 windows every layer).
    fn uses_sliding_window(&self) -> bool {
        match self.c.use_sliding_window {
            Some(u) => u,
            None => !self.qwen() && self.c.max_window_layers.is_none(),
        }
    }

    /// A `qwen*` model type (Qwen2, Qwen3, their MoE and VL kin).
    fn qwen(&self) -> bool {
        self.c
            .model_type
            .as_deref()
            .is_some_and(|t| t.starts_with("qwen"))
    }

    /// `use_sliding_window: true` (transformers `Qwen2Config` / `Qwen3Config` `layer_types`):
    /// layers `i >= max_window_layers` are windowed, the first `max_window_layers` full. A
    /// missing `max_window_layers` (transformers would default it to 28) is refused by name.
    fn qwen_windows(&self, layers: u64) -> Result<Vec<LayerKind>, ModelError> {
        let first_window = self.c.max_window_layers.ok_or_else(|| {
            self.err(
                "max_window_layers",
                "missing: use_sliding_window true windows the layers from max_window_layers on \
                 (transformers defaults it to 28); give it",
            )
        })?;
        // The formula is the one of transformers Qwen2Config / Qwen3Config; the MoE and VL
        // kin are not checked against it: refused rather than guessed.
        if let Some(t) = self.c.model_type.as_deref()
            && t != "qwen2"
            && t != "qwen3"
        {
            return Err(self.err(
                "use_sliding_window",
                format!(
                    "true on a {t} config: windowing from max_window_layers on is modelled for \
                     qwen2 and qwen3 only"
                ),
            ));
        }
        if self.c.sliding_window_pattern.is_some() {
            return Err(self.err(
                "sliding_window_pattern",
                "given with use_sliding_window / max_window_layers: one windowing rule only",
            ));
        }
        (0..layers)
            .map(|i| {
                if i >= first_window {
                    self.window("layers from max_window_layers on")
                } else {
                    Ok(LayerKind::Full)
                }
            })
            .collect()
    }

    fn nemotron_h(&self, pattern: &str, layers: u64) -> Result<Vec<LayerKind>, ModelError> {
        if pattern.chars().count() as u64 != layers {
            return Err(self.err(
                "hybrid_override_pattern",
                format!(
                    "{} characters, but num_hidden_layers is {layers} (one per layer)",
                    pattern.chars().count()
                ),
            ));
        }
        pattern
            .chars()
            .enumerate()
            .map(|(i, ch)| match ch {
                'M' => Ok(LayerKind::Mamba),
                '*' => Ok(LayerKind::Full),
                '-' | 'E' => Ok(LayerKind::NoCache),
                other => Err(self.err(
                    format!("hybrid_override_pattern[{i}]"),
                    format!(
                        "'{other}' is not a layer kvlayout models (M Mamba2, * attention, - MLP, E MoE)"
                    ),
                )),
            })
            .collect()
    }

    /// RecurrentGemma (transformers `RecurrentGemmaConfig.block_types`): layer `i` runs
    /// `block_types[i % len]`: `attention` (local attention over the last
    /// `attention_window_size` tokens) or `recurrent` (RG-LRU state).
    fn block_types(&self, types: &[String], layers: u64) -> Result<Vec<LayerKind>, ModelError> {
        if types.is_empty() {
            return Err(self.err("block_types", "empty: one entry per block of the pattern"));
        }
        (0..layers)
            .map(|i| {
                let j = (i % types.len() as u64) as usize;
                match types[j].as_str() {
                    "attention" => Ok(LayerKind::Sliding {
                        window_tokens: self.positive(
                            "attention_window_size",
                            self.c.attention_window_size,
                            "RecurrentGemma's attention blocks attend to a local window",
                        )?,
                    }),
                    "recurrent" => Ok(LayerKind::RgLru),
                    other => Err(self.err(
                        format!("block_types[{j}]"),
                        format!(
                            "\"{other}\" is not a block kvlayout models (attention, recurrent)"
                        ),
                    )),
                }
            })
            .collect()
    }

    /// Kimi-Linear (`linear_attn_config`, vLLM `kimi_linear.py`): `kda_layers` and
    /// `full_attn_layers` list the layers 1-based (Kimi-Linear-48B: 27 layers, full 4, 8, ...,
    /// 24, 27); every layer is in exactly one list.
    fn kimi_linear(
        &self,
        cfg: &serde_json::Value,
        layers: u64,
    ) -> Result<Vec<LayerKind>, ModelError> {
        let mut kinds: Vec<Option<LayerKind>> = vec![None; layers as usize];
        for (list, kind) in [
            ("kda_layers", LayerKind::Kda),
            ("full_attn_layers", LayerKind::Full),
        ] {
            let field = format!("linear_attn_config.{list}");
            let Some(ids) = cfg.get(list).and_then(serde_json::Value::as_array) else {
                return Err(self.err(field, "missing: a list of 1-based layer numbers"));
            };
            for (k, id) in ids.iter().enumerate() {
                let n = id
                    .as_u64()
                    .filter(|n| (1..=layers).contains(n))
                    .ok_or_else(|| {
                        self.err(
                            format!("{field}[{k}]"),
                            format!("{id}: expected a layer number 1..={layers} (1-based)"),
                        )
                    })?;
                let slot = &mut kinds[(n - 1) as usize];
                if slot.is_some() {
                    return Err(self.err(
                        format!("{field}[{k}]"),
                        format!("layer {n} is listed twice in kda_layers / full_attn_layers"),
                    ));
                }
                *slot = Some(kind);
            }
        }
        kinds
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                k.ok_or_else(|| {
                    self.err(
                        "linear_attn_config",
                        format!(
                            "layer {} (1-based) is in neither kda_layers nor full_attn_layers",
                            i + 1
                        ),
                    )
                })
            })
            .collect()
    }

    /// MiMo-V2 (`hybrid_layer_pattern`, SGLang `mimo_v2_flash.py`): `1` a sliding-window layer
    /// (`sliding_window`), `0` full attention.
    fn mimo(&self, pattern: &[u64], layers: u64) -> Result<Vec<LayerKind>, ModelError> {
        if pattern.len() as u64 != layers {
            return Err(self.err(
                "hybrid_layer_pattern",
                format!(
                    "{} entries, but num_hidden_layers is {layers} (one entry per layer)",
                    pattern.len()
                ),
            ));
        }
        pattern
            .iter()
            .enumerate()
            .map(|(i, &p)| match p {
                0 => Ok(LayerKind::Full),
                1 => self.window(&format!("hybrid_layer_pattern[{i}] is 1 (sliding)")),
                v => Err(self.err(
                    format!("hybrid_layer_pattern[{i}]"),
                    format!("{v}: expected 1 (sliding window) or 0 (full attention)"),
                )),
            })
            .collect()
    }

    fn kinds_from_patterns(&self, layers: u64) -> Result<Option<Vec<LayerKind>>, ModelError> {
        let c = self.c;
        if c.compress_ratios.is_some() {
            return crate::dsv4::kinds(self.name, c).map(Some);
        }
        if let Some(types) = c.block_types.as_deref() {
            return self.block_types(types, layers).map(Some);
        }
        if let Some(cfg) = c.linear_attn_config.as_ref().filter(|v| !v.is_null()) {
            return self.kimi_linear(cfg, layers).map(Some);
        }
        if let Some(p) = c.hybrid_layer_pattern.as_deref() {
            return self.mimo(p, layers).map(Some);
        }
        if c.block_configs.as_ref().is_some_and(|v| !v.is_null()) {
            return crate::decilm::kinds(self.name, c, layers).map(Some);
        }
        if let Some(p) = c.hybrid_override_pattern.as_deref() {
            return self.nemotron_h(p, layers).map(Some);
        }
        if c.full_attention_interval.is_some() {
            let full = self.every("full_attention_interval", c.full_attention_interval, layers)?;
            return Ok(Some(
                full.into_iter()
                    .map(|f| {
                        if f {
                            LayerKind::Full
                        } else {
                            LayerKind::Linear
                        }
                    })
                    .collect(),
            ));
        }
        if c.attention_chunk_size.is_some() {
            return self.llama4(layers).map(Some);
        }
        if c.sliding_window.is_some() && self.uses_sliding_window() {
            if c.use_sliding_window == Some(true) && (self.qwen() || c.max_window_layers.is_some())
            {
                return self.qwen_windows(layers).map(Some);
            }
            return Ok(Some(match self.sliding_period()? {
                Some(p) => {
                    let global = self.every("sliding_window_pattern", Some(p), layers)?;
                    global
                        .into_iter()
                        .map(|g| {
                            if g {
                                Ok(LayerKind::Full)
                            } else {
                                self.window("sliding layers")
                            }
                        })
                        .collect::<Result<_, _>>()?
                }
                None => (0..layers)
                    .map(|_| self.window("every layer windowed"))
                    .collect::<Result<_, _>>()?,
            }));
        }
        Ok(None)
    }
}

/// The attention kind of every layer (length `num_hidden_layers`).
///
/// # Errors
///
/// ModelError::Field naming the `config.json` field and its value: `num_hidden_layers` 0, a field
/// the layer pattern needs missing or zero, a `layer_types` or block-pattern entry of an unknown
/// kind, or a list whose length or layer numbers do not fit the layer count.
pub fn layer_kinds(name: &str, c: &ModelConfig) -> Result<Vec<LayerKind>, ModelError> {
    let cx = Ctx { name, c };
    let layers = c.num_hidden_layers;
    if layers == 0 {
        return Err(cx.err("num_hidden_layers", "must be at least 1, got 0"));
    }
    if layers > MAX_LAYERS {
        return Err(cx.err(
            "num_hidden_layers",
            format!("{layers} is more than the {MAX_LAYERS} layers kvlayout accepts"),
        ));
    }
    let Some(types) = c.layer_types.as_deref() else {
        return Ok(cx
            .kinds_from_patterns(layers)?
            .unwrap_or_else(|| vec![LayerKind::Full; layers as usize]));
    };
    // With layer_types, a pattern field given explicitly must agree with it.
    let explicit = c.hybrid_override_pattern.is_some()
        || c.compress_ratios.is_some()
        || c.block_types.is_some()
        || c.linear_attn_config.as_ref().is_some_and(|v| !v.is_null())
        || c.hybrid_layer_pattern.is_some()
        || c.block_configs.as_ref().is_some_and(|v| !v.is_null())
        || c.full_attention_interval.is_some()
        || c.attention_chunk_size.is_some()
        || (c.sliding_window_pattern.is_some() && c.sliding_window.is_some());
    let from_pattern = if explicit {
        cx.kinds_from_patterns(layers)?
    } else {
        None
    };
    let kinds = cx.kinds_of_layer_types(types, layers)?;
    if let Some(pattern) = from_pattern {
        let field = if c.compress_ratios.is_some() {
            "compress_ratios"
        } else if c.block_types.is_some() {
            "block_types"
        } else if c.linear_attn_config.as_ref().is_some_and(|v| !v.is_null()) {
            "linear_attn_config"
        } else if c.hybrid_layer_pattern.is_some() {
            "hybrid_layer_pattern"
        } else if c.block_configs.as_ref().is_some_and(|v| !v.is_null()) {
            "block_configs"
        } else if c.hybrid_override_pattern.is_some() {
            "hybrid_override_pattern"
        } else if c.full_attention_interval.is_some() {
            "full_attention_interval"
        } else if c.attention_chunk_size.is_some() {
            "no_rope_layers"
        } else {
            "sliding_window_pattern"
        };
        if let Some(i) = (0..kinds.len()).find(|&i| kinds[i].key() != pattern[i].key()) {
            return Err(cx.err(
                field,
                format!(
                    "gives layer {i} {} attention but layer_types[{i}] is \"{}\"",
                    pattern[i].key(),
                    types[i]
                ),
            ));
        }
    }
    Ok(kinds)
}
