//! DeciLM / Nemotron-NAS `block_configs` (Llama-3.3-Nemotron-Super-49B, Llama-3.1-Nemotron-
//! Ultra-253B): one object per layer, read as vLLM `model_executor/models/nemotron_nas.py`
//! (`DeciLMDecoderLayer`) reads it:
//! - `attention.no_op: true`: the layer has no attention, so no KV cache;
//! - `attention.replace_with_linear: true`: attention replaced by a linear map (DeciLM's
//!   `modeling_decilm.py`), no KV cache either;
//! - otherwise the layer caches K and V of `num_attention_heads / attention.n_heads_in_group`
//!   KV heads (`num_kv_heads = config.num_attention_heads // n_heads_in_group`), which may
//!   differ from layer to layer; the top-level `num_key_value_heads` is not read.
//!
//! A field that would change the cache and is not modelled is refused by name:
//! `attention.window_length` (a windowed layer), `attention.num_sink_tokens` (sink tokens kept
//! besides the window), `attention.sparsify`, and `attention.mamba` / `attention.llama4`
//! (other mixers in newer Nemotron-NAS puzzles).

use serde_json::Value;

use crate::layers::LayerKind;
use crate::{ModelConfig, ModelError};

/// Fields of `block_configs[i].attention` that change the cache and are not modelled.
const UNMODELLED_ATTENTION: &[(&str, &str)] = &[
    (
        "window_length",
        "a sliding-window layer of that many tokens",
    ),
    ("num_sink_tokens", "sink tokens kept beside a window"),
    ("sparsify", "sparsified attention"),
    ("mamba", "a Mamba mixer in place of attention"),
    ("llama4", "Llama 4 attention in place of GQA"),
];

fn live(v: &Value) -> bool {
    !matches!(v, Value::Null | Value::Bool(false))
}

fn blocks<'a>(name: &str, c: &'a ModelConfig, layers: u64) -> Result<&'a [Value], ModelError> {
    let list = c
        .block_configs
        .as_ref()
        .and_then(Value::as_array)
        .ok_or_else(|| {
            ModelError::field(
                name,
                "block_configs",
                "expected a list (one object per layer)",
            )
        })?;
    if list.len() as u64 != layers {
        return Err(ModelError::field(
            name,
            "block_configs",
            format!(
                "{} entries, but num_hidden_layers is {layers} (one entry per layer)",
                list.len()
            ),
        ));
    }
    Ok(list)
}

/// One layer's KV heads, or `None` for a layer without attention cache.
fn layer_heads(
    name: &str,
    c: &ModelConfig,
    i: usize,
    b: &Value,
) -> Result<Option<u64>, ModelError> {
    let at = format!("block_configs[{i}].attention");
    let Some(att) = b.get("attention").filter(|a| a.is_object()) else {
        return Err(ModelError::field(name, at, "missing (an object per layer)"));
    };
    let flag = |f: &str| -> Result<bool, ModelError> {
        match att.get(f) {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(v)) => Ok(*v),
            Some(v) => Err(ModelError::field(
                name,
                format!("{at}.{f}"),
                format!("{v}: expected true or false"),
            )),
        }
    };
    if flag("no_op")? || flag("replace_with_linear")? {
        return Ok(None);
    }
    for (f, why) in UNMODELLED_ATTENTION {
        if let Some(v) = att.get(*f).filter(|v| live(v)) {
            return Err(ModelError::Unmodelled {
                name: name.to_string(),
                field: format!("{at}.{f}"),
                value: v.to_string(),
                why: (*why).to_string(),
            });
        }
    }
    let field = format!("{at}.n_heads_in_group");
    let group = match att.get("n_heads_in_group") {
        Some(v) => v.as_u64().filter(|&g| g > 0).ok_or_else(|| {
            ModelError::field(
                name,
                field.clone(),
                format!("{v}: expected a positive integer (query heads per KV head)"),
            )
        })?,
        None => {
            return Err(ModelError::field(
                name,
                field,
                "missing (an attention layer)",
            ));
        }
    };
    let q = c.num_attention_heads;
    if !q.is_multiple_of(group) {
        return Err(ModelError::field(
            name,
            field,
            format!("{group} does not divide num_attention_heads {q}"),
        ));
    }
    Ok(Some(q / group))
}

/// The layer kinds: `Full` for an attention layer, `NoCache` for `no_op` or
/// `replace_with_linear`.
///
/// # Errors
/// As [`kv_heads`].
pub fn kinds(name: &str, c: &ModelConfig, layers: u64) -> Result<Vec<LayerKind>, ModelError> {
    Ok(kv_heads(name, c, layers)?
        .into_iter()
        .map(|h| match h {
            Some(_) => LayerKind::Full,
            None => LayerKind::NoCache,
        })
        .collect())
}

/// KV heads of every layer (`None`: a layer without cache).
///
/// # Errors
/// A [`ModelError`] naming the field: `block_configs` not a list of `num_hidden_layers`
/// entries, a layer without `attention`, a flag that is not a boolean, an `n_heads_in_group`
/// missing, zero or not dividing `num_attention_heads`; [`ModelError::Unmodelled`] for an
/// attention field that changes the cache and is not modelled.
pub fn kv_heads(name: &str, c: &ModelConfig, layers: u64) -> Result<Vec<Option<u64>>, ModelError> {
    blocks(name, c, layers)?
        .iter()
        .enumerate()
        .map(|(i, b)| layer_heads(name, c, i, b))
        .collect()
}
