//! Reading a Hugging Face `config.json`: the object engines read (`text_config` when the
//! model is multimodal, as vLLM's `get_text_config` and SGLang do), the fields that shape the
//! KV cache, and a refusal for the fields that change the cache but are not modelled.

use serde::Deserialize;
use serde_json::Value;

use crate::ModelError;

/// The cache-relevant fields of a Hugging Face `config.json` (its `text_config` when nested);
/// other fields are ignored, except those [`UNMODELLED`] names (refused).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct ModelConfig {
    /// `model_type` (`deepseek_v32`, `llama`, `gemma3_text`, ...).
    #[serde(default)]
    pub model_type: Option<String>,
    /// `architectures` (`DeepseekV32ForCausalLM`, `LlamaForCausalLM`, ...); taken from the
    /// outer object when the config is nested.
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
    /// Per-layer attention kind (`full_attention`, `sliding_attention`, `chunked_attention`,
    /// `linear_attention`).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Sliding-window length in tokens.
    #[serde(default)]
    pub sliding_window: Option<u64>,
    /// Gemma 3: every `sliding_window_pattern`-th layer is global (`(i + 1) % p == 0`).
    /// transformers' own exports write it `_sliding_window_pattern` (read the same).
    #[serde(default, alias = "_sliding_window_pattern")]
    pub sliding_window_pattern: Option<u64>,
    /// `false` turns `sliding_window` off (Qwen2/Qwen3 configs carry a window they do not use;
    /// absent on a `qwen*` config it is `false`, the transformers default).
    #[serde(default)]
    pub use_sliding_window: Option<bool>,
    /// Qwen2/Qwen3: with `use_sliding_window`, the first `max_window_layers` layers stay full
    /// and the rest are windowed.
    #[serde(default)]
    pub max_window_layers: Option<u64>,
    /// Llama 4: chunk length of the chunked local attention of RoPE layers.
    #[serde(default)]
    pub attention_chunk_size: Option<u64>,
    /// Llama 4: `1` = RoPE layer (chunked), `0` = NoPE layer (global); empty = from the interval.
    #[serde(default)]
    pub no_rope_layers: Option<Vec<u64>>,
    /// Llama 4: every `no_rope_layer_interval`-th layer is NoPE (default 4).
    #[serde(default)]
    pub no_rope_layer_interval: Option<u64>,
    /// Gemma 4: head dimension of the full-attention (global) layers.
    #[serde(default)]
    pub global_head_dim: Option<u64>,
    /// Gemma 4: KV heads of the global layers when `attention_k_eq_v`.
    #[serde(default)]
    pub num_global_key_value_heads: Option<u64>,
    /// Gemma 4: global layers compute V with the K projection.
    #[serde(default)]
    pub attention_k_eq_v: Option<bool>,
    /// Qwen3-Next: every `full_attention_interval`-th layer is full attention, others linear.
    #[serde(default)]
    pub full_attention_interval: Option<u64>,
    /// Gated DeltaNet key heads.
    #[serde(default)]
    pub linear_num_key_heads: Option<u64>,
    /// Gated DeltaNet value heads.
    #[serde(default)]
    pub linear_num_value_heads: Option<u64>,
    /// Gated DeltaNet key head dimension.
    #[serde(default)]
    pub linear_key_head_dim: Option<u64>,
    /// Gated DeltaNet value head dimension.
    #[serde(default)]
    pub linear_value_head_dim: Option<u64>,
    /// Gated DeltaNet causal-conv kernel width.
    #[serde(default)]
    pub linear_conv_kernel_dim: Option<u64>,
    /// Nemotron-H: one character per layer, `M` Mamba2, `*` attention, `-` MLP, `E` MoE.
    #[serde(default)]
    pub hybrid_override_pattern: Option<String>,
    /// Mamba2 heads.
    #[serde(default)]
    pub mamba_num_heads: Option<u64>,
    /// Mamba2 head dimension.
    #[serde(default)]
    pub mamba_head_dim: Option<u64>,
    /// Mamba2 B/C groups.
    #[serde(default)]
    pub n_groups: Option<u64>,
    /// Mamba2 state size per head element.
    #[serde(default)]
    pub ssm_state_size: Option<u64>,
    /// Mamba2 causal-conv kernel width.
    #[serde(default)]
    pub conv_kernel: Option<u64>,
    /// SGLang's recurrent-state dtype field (`float32`, `bfloat16`, `float16`).
    #[serde(default)]
    pub mamba_ssm_dtype: Option<String>,
    /// vLLM's recurrent (SSM) state cache dtype (`mamba_ssm_cache_dtype`, NemotronH configs and
    /// `--mamba-ssm-cache-dtype`); read like `mamba_ssm_dtype` (both given must agree).
    #[serde(default)]
    pub mamba_ssm_cache_dtype: Option<String>,
    /// RecurrentGemma: the repeating block pattern (`recurrent`, `attention`); transformers
    /// writes it `_block_types` and reads layer `i` as `block_types[i % len]`.
    #[serde(default, alias = "_block_types")]
    pub block_types: Option<Vec<String>>,
    /// RecurrentGemma: the local-attention window of the attention blocks, in tokens.
    #[serde(default)]
    pub attention_window_size: Option<u64>,
    /// RecurrentGemma: width of the RG-LRU recurrent state.
    #[serde(default)]
    pub lru_width: Option<u64>,
    /// RecurrentGemma: the recurrent block's causal-conv width.
    #[serde(default)]
    pub conv1d_width: Option<u64>,
    /// DeciLM / Nemotron-NAS: one object per layer (`attention.n_heads_in_group`,
    /// `attention.no_op`, `attention.replace_with_linear`, ...), read in [`crate::layers`].
    #[serde(default)]
    pub block_configs: Option<Value>,
    /// Gemma 3n / 4: the last `num_kv_shared_layers` layers reuse the KV of an earlier layer of
    /// their kind and own no cache.
    #[serde(default)]
    pub num_kv_shared_layers: Option<u64>,
    /// MiMo-V2: one entry per layer, `1` sliding-window attention, `0` full attention.
    #[serde(default)]
    pub hybrid_layer_pattern: Option<Vec<u64>>,
    /// MiMo-V2: KV heads of the sliding-window layers.
    #[serde(default)]
    pub swa_num_key_value_heads: Option<u64>,
    /// MiMo-V2: query heads of the sliding-window layers.
    #[serde(default)]
    pub swa_num_attention_heads: Option<u64>,
    /// MiMo-V2: K head dim of the sliding-window layers.
    #[serde(default)]
    pub swa_head_dim: Option<u64>,
    /// MiMo-V2: V head dim of the sliding-window layers.
    #[serde(default)]
    pub swa_v_head_dim: Option<u64>,
    /// V head dim: under MLA it sizes the rebuilt V (not cached); outside MLA only MiMo-V2's
    /// full-attention V width is read from it (K `head_dim`, V `v_head_dim`).
    #[serde(default)]
    pub v_head_dim: Option<u64>,
    /// Kimi linear attention (`kda_layers`, `full_attn_layers`, 1-based; `num_heads`,
    /// `head_dim`, `short_conv_kernel_size`), read in [`crate::layers`] and `state`.
    #[serde(default)]
    pub linear_attn_config: Option<Value>,
    /// DeepSeek-V4: one compression ratio per layer (0 sliding window only, 4, 128), read in
    /// [`crate::dsv4`].
    #[serde(default)]
    pub compress_ratios: Option<Vec<u64>>,
    /// The model dtype (`torch_dtype`, or `dtype` in newer files): the engines' default KV dtype.
    #[serde(default)]
    pub torch_dtype: Option<String>,
    /// Newer spelling of `torch_dtype`.
    #[serde(default)]
    pub dtype: Option<String>,
}

/// Fields that change the KV cache but are not modelled, with what they change. Present with a
/// value other than `null`, `false`, `0`, `""` or `[]`, they refuse the config.
pub const UNMODELLED: &[(&str, &str)] = &[
    ("layers_block_type", "per-layer Mamba / attention blocks"),
    (
        "attn_layer_period",
        "attention every N layers, Mamba elsewhere (Jamba)",
    ),
    ("attn_layer_offset", "attention layer offset (Jamba)"),
    ("mamba_d_state", "Mamba state per request"),
    (
        "cross_attention_layers",
        "cross-attention layers keep encoder KV per request",
    ),
    (
        "interleaved_sliding_window",
        "interleaved sliding-window layers",
    ),
    (
        "multi_query_group_num",
        "KV heads under another name (ChatGLM)",
    ),
    (
        "multi_query",
        "one KV head shared by all query heads (Falcon, GPT-BigCode)",
    ),
    ("num_kv_heads", "KV heads under another name (Falcon)"),
    ("n_head_kv", "KV heads under another name (Falcon)"),
    (
        "attn_type_list",
        "per-layer lightning (linear) or softmax attention (MiniMax)",
    ),
    ("use_cla", "cross-layer KV sharing (Hunyuan CLA)"),
    (
        "kv_cache_scheme",
        "a quantized KV cache dtype and scales (compressed-tensors); use --kv-dtype",
    ),
    (
        "kv_cache_quant_algo",
        "a quantized KV cache dtype (ModelOpt, e.g. \"FP8\"); use --kv-dtype",
    ),
    (
        "indexer_types",
        "per-layer sparse-attention indexer kinds (Kimi-K3 / GLM-5.3 style: which layers keep indexer keys, pooled or not)",
    ),
    (
        "num_attention_groups",
        "KV heads under another name (Step-3.5; transformers maps it to num_key_value_heads)",
    ),
];

/// Name endings of fields that size KV heads, head dims or per-layer patterns. A text-config
/// field ending so and not in [`MODELLED_SHAPE_FIELDS`] is refused: a reader that does not
/// know it would size the cache without it.
pub const SHAPE_FIELD_ENDINGS: &[&str] =
    &["_key_value_heads", "_kv_heads", "_head_dim", "_pattern"];

/// Fields with a [`SHAPE_FIELD_ENDINGS`] ending that are read ([`ModelConfig`]) or do not
/// change the cache: `qk_nope_head_dim` sizes MLA queries and keys, which are rebuilt from the
/// cached latent; `v_head_dim` is checked on its own (harmless under MLA or equal to
/// `head_dim`); `mtp_hybrid_override_pattern` lays out Nemotron-H's multi-token-prediction draft
/// layers, which keep their own pool. Besides these, a `*_head_dim` equal to the head dim (a
/// synonym: Hunyuan's `attention_head_dim`) and, under MLA, `qk_head_dim` (transformers'
/// `qk_nope_head_dim + qk_rope_head_dim`, the query/key width rebuilt from the latent) pass.
pub const MODELLED_SHAPE_FIELDS: &[&str] = &[
    "mtp_hybrid_override_pattern",
    "_sliding_window_pattern",
    "num_key_value_heads",
    "num_global_key_value_heads",
    "global_head_dim",
    "index_head_dim",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "mamba_head_dim",
    "sliding_window_pattern",
    "hybrid_override_pattern",
    "hybrid_layer_pattern",
    "swa_num_key_value_heads",
    "swa_head_dim",
    "swa_v_head_dim",
];

fn is_live(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => false,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Bool(true) => true,
    }
}

/// Refuses the first field of [`UNMODELLED`] set in `text` (the text config), the outer object,
/// or either's `quantization_config`; then a text-config field with a [`SHAPE_FIELD_ENDINGS`]
/// ending not in [`MODELLED_SHAPE_FIELDS`]; then a `v_head_dim` other than the head dim outside
/// MLA.
fn refuse_unmodelled(name: &str, outer: &Value, text: &Value) -> Result<(), ModelError> {
    let mut places = vec![("", text)];
    if !std::ptr::eq(outer, text) {
        places.push(("", outer));
    }
    for (_, obj) in places.clone() {
        if let Some(q) = obj.get("quantization_config") {
            places.push(("quantization_config.", q));
        }
    }
    let refuse = |field: String, v: &Value, why: &str| ModelError::Unmodelled {
        name: name.to_string(),
        field,
        value: v.to_string(),
        why: why.to_string(),
    };
    // MiniMax's attn_type_list: 1 is softmax attention (an ordinary KV cache), 0 lightning
    // (linear) attention; a list of 1s only (MiniMax-M2) lays out plain full attention.
    let all_softmax = |field: &str, v: &Value| {
        field == "attn_type_list"
            && v.as_array()
                .is_some_and(|a| a.iter().all(|x| x.as_u64() == Some(1)))
    };
    for (prefix, obj) in places {
        for (field, why) in UNMODELLED {
            if let Some(v) = obj
                .get(*field)
                .filter(|v| is_live(v) && !all_softmax(field, v))
            {
                return Err(refuse(format!("{prefix}{field}"), v, why));
            }
        }
    }
    let Some(fields) = text.as_object() else {
        return Ok(());
    };
    let number = |f: &str| fields.get(f).and_then(Value::as_u64);
    let head_dim = number("head_dim").or_else(|| {
        let (hidden, heads) = (number("hidden_size")?, number("num_attention_heads")?);
        hidden.checked_div(heads)
    });
    let mla = fields.get("kv_lora_rank").is_some_and(is_live);
    // MiMo-V2's `swa_*` heads and dims are read only beside its `hybrid_layer_pattern`.
    let mimo_pattern = fields.get("hybrid_layer_pattern").is_some_and(is_live);
    for (field, v) in fields {
        let shape_field = SHAPE_FIELD_ENDINGS.iter().any(|e| field.ends_with(e));
        let mimo_only = field.starts_with("swa_") && !mimo_pattern;
        let harmless = (MODELLED_SHAPE_FIELDS.contains(&field.as_str()) && !mimo_only)
            || (field.ends_with("_head_dim") && head_dim.is_some() && v.as_u64() == head_dim)
            || (mla && field == "qk_head_dim");
        if shape_field && !harmless && is_live(v) {
            return Err(refuse(
                field.clone(),
                v,
                "a KV head count, head dim or layer pattern this reader does not know",
            ));
        }
    }
    // V heads narrower or wider than K: the V plane is not `head_dim` wide. Under MLA
    // (`kv_lora_rank`) V is rebuilt from the cached latent.
    // MiMo-V2 (`hybrid_layer_pattern`) caches V at `v_head_dim` (SGLang's SWAKVPool
    // `v_head_dim`, `swa_v_head_dim`): read, not refused.
    let mimo = fields.get("hybrid_layer_pattern").is_some_and(is_live);
    let v_dim = fields.get("v_head_dim").filter(|v| is_live(v));
    if let Some(v) = v_dim.filter(|v| !mla && !mimo && v.as_u64() != head_dim) {
        return Err(refuse(
            "v_head_dim".to_string(),
            v,
            "V heads of another width than head_dim; K and V planes are modelled equal",
        ));
    }
    Ok(())
}

/// Parses `config.json` text: a JSON object (BOM allowed, a key named twice refused); a
/// `kvlayout` geometry file is refused saying which kind of file was expected; the text config
/// is the `text_config` object when there is one.
///
/// # Errors
///
/// ModelError::Parse when the text is not a JSON object (with serde_json's line and column), names
/// a key twice, lacks a required field or is a `kvlayout` geometry file; ModelError::Field or
/// ModelError::Unmodelled for a field whose value the mapping cannot use or does not model.
pub fn parse(name: &str, text: &str) -> Result<ModelConfig, ModelError> {
    let parse_err = |reason: String| ModelError::Parse {
        name: name.to_string(),
        reason,
    };
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let outer: Value = serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?;
    // serde_json keeps the last of a repeated key: refuse it, naming the key.
    kvlayout_core::check_unique_keys(text)
        .map_err(|e| parse_err(format!("{}: {}", e.field, e.problem)))?;
    let Some(obj) = outer.as_object() else {
        return Err(parse_err("a config.json must be a JSON object".into()));
    };
    if obj.contains_key("buffers") || obj.get("schema").is_some_and(Value::is_string) {
        let schema = obj.get("schema").and_then(Value::as_str).unwrap_or("none");
        return Err(parse_err(format!(
            "this is a kvlayout geometry file (schema {schema}), not a model config: --model expects \
             a built-in name, a Hugging Face config.json, or a model directory holding one; \
             compare geometry files with `kvlayout check A.json B.json`"
        )));
    }
    let (inner, prefix) = match obj.get("text_config") {
        Some(t) if t.is_object() => (t, "text_config."),
        Some(t) if !t.is_null() => {
            return Err(parse_err(format!(
                "text_config: expected an object, got {t}"
            )));
        }
        _ => (&outer, ""),
    };
    refuse_unmodelled(name, &outer, inner)?;
    let mut config: ModelConfig = serde_path_to_error::deserialize(inner.clone()).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            // serde's "missing field `x`": say where it was looked for.
            parse_err(format!("{}{}", e.inner(), where_looked(prefix)))
        } else {
            parse_err(format!("{prefix}{path}: {}", e.inner()))
        }
    })?;
    if config.architectures.is_none() {
        config.architectures = obj
            .get("architectures")
            .and_then(|a| serde_json::from_value(a.clone()).ok());
    }
    if config.torch_dtype.is_none() && config.dtype.is_none() {
        config.torch_dtype = obj
            .get("torch_dtype")
            .or_else(|| obj.get("dtype"))
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if config.mamba_ssm_cache_dtype.is_none() {
        config.mamba_ssm_cache_dtype = obj
            .get("mamba_ssm_cache_dtype")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if config.mamba_ssm_dtype.is_none() {
        config.mamba_ssm_dtype = obj
            .get("mamba_ssm_dtype")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    Ok(config)
}

fn where_looked(prefix: &str) -> String {
    if prefix.is_empty() {
        String::new()
    } else {
        " (in text_config, where the model's text fields are)".to_string()
    }
}

impl ModelConfig {
    /// The model dtype as written (`torch_dtype`, else `dtype`).
    pub fn model_dtype(&self) -> Option<&str> {
        self.torch_dtype.as_deref().or(self.dtype.as_deref())
    }
}
