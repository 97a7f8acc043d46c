//! `describe` and `totals`: a model's pool for one rank, as `kvlayout describe --json` and
//! `kvlayout describe --totals` (the `kvlayout-models` crate: Hugging Face `config.json` ->
//! pool geometry, every layer kind, tensor-parallel ranks).

use std::path::PathBuf;

use kvlayout_models::{IndexK, KvDtype, KvLayout, LayerKind, Model, Options, StateDtype, Tp};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyBool, PyInt};

use crate::errors;
use crate::geometry::{Geometry, to_py};

/// The options shared by `describe` and `totals`, parsed and checked; the model loaded.
#[allow(clippy::too_many_arguments)]
fn load(
    py: Python<'_>,
    model: PathBuf,
    kv_dtype: Option<&str>,
    index_k: Option<&str>,
    tp: Option<&Bound<'_, PyAny>>,
    rank: Option<&Bound<'_, PyAny>>,
    state_dtype: Option<&str>,
    kv_layout: Option<&str>,
    page_size_tokens: Option<u64>,
    pages: u64,
    equal_page_bytes: bool,
) -> PyResult<(Model, Options)> {
    let tp = tp.map(|t| count_arg(py, "tp", t)).transpose()?;
    let rank = rank.map(|r| count_arg(py, "rank", r)).transpose()?;
    let kv_dtype = kv_dtype
        .map(|s| {
            KvDtype::from_name(s).ok_or_else(|| {
                errors::invalid_geometry(
                    py,
                    "kv_dtype",
                    &format!("{s:?} (expected \"bf16\" or \"fp8\")"),
                )
            })
        })
        .transpose()?;
    let index_k_choice = match index_k {
        None | Some("fp8") => IndexK::Fp8,
        Some("bf16") => IndexK::Bf16,
        Some("fp4") => IndexK::Fp4,
        Some(other) => {
            return Err(errors::invalid_geometry(
                py,
                "index_k",
                &format!("{other:?} (expected \"fp8\", \"bf16\" or \"fp4\")"),
            ));
        }
    };
    let state_dtype = state_dtype
        .map(|s| {
            StateDtype::from_name(s).ok_or_else(|| {
                errors::invalid_geometry(
                    py,
                    "state_dtype",
                    &format!("{s:?} (expected \"f32\", \"bf16\" or \"f16\")"),
                )
            })
        })
        .transpose()?;
    let tp = match (tp, rank) {
        (None, None) => None,
        (None, Some(r)) => {
            return Err(errors::invalid_geometry(
                py,
                "rank",
                &format!("{r} given without tp (the tensor-parallel size)"),
            ));
        }
        (Some(n), r) => Some(
            Tp::new(n, r.unwrap_or(0))
                .map_err(|e| errors::invalid_geometry(py, "tp", &e.to_string()))?,
        ),
    };
    let name = model
        .to_str()
        .ok_or_else(|| PyTypeError::new_err("model: not valid UTF-8"))?;
    // A directory is read as a Hugging Face model directory: say which file was missing
    // rather than "not a built-in model".
    if model.is_dir() && !model.join("config.json").is_file() {
        return Err(errors::model_error(
            py,
            format!(
                "model: {name} is a directory without config.json (looked for {})",
                model.join("config.json").display()
            ),
        ));
    }
    let m = Model::load(name).map_err(|e| errors::model_error(py, e.to_string()))?;
    // As the CLI refuses `--index-k` there: an option that does not apply is an error naming
    // it, never dropped.
    if index_k.is_some() && !m.has_index_k() {
        return Err(errors::invalid_geometry(
            py,
            "index_k",
            &format!(
                "does not apply: {} has no DeepSeek sparse-attention indexer (no index_head_dim)",
                m.name
            ),
        ));
    }
    // As the CLI refuses `--state-dtype` there: a model without recurrent state (no
    // linear-attention, KDA, RG-LRU or Mamba layer) has nothing it applies to. A model whose
    // layers cannot be read passes here: that error comes with the pool.
    if state_dtype.is_some()
        && let Ok(kinds) = m.layer_kinds()
        && !kinds.iter().any(|k| {
            matches!(
                k,
                LayerKind::Linear | LayerKind::Mamba | LayerKind::Kda | LayerKind::RgLru
            )
        })
    {
        return Err(errors::invalid_geometry(
            py,
            "state_dtype",
            &format!(
                "does not apply: {} has no linear-attention, KDA, RG-LRU or Mamba layers (no recurrent state)",
                m.name
            ),
        ));
    }
    // DeepSeek-V4's KV record, as the CLI's `--kv-layout flashmla|trtllm`; refused by name on
    // any other model, as the CLI refuses it.
    let kv_layout = match kv_layout {
        None => KvLayout::FlashMla,
        Some(name) => {
            let layout = match name.to_ascii_lowercase().as_str() {
                "flashmla" => KvLayout::FlashMla,
                "trtllm" => KvLayout::Trtllm,
                _ => {
                    return Err(errors::invalid_geometry(
                        py,
                        "kv_layout",
                        &format!("{name:?} (expected \"flashmla\" or \"trtllm\")"),
                    ));
                }
            };
            if m.config.compress_ratios.is_none() {
                return Err(errors::invalid_geometry(
                    py,
                    "kv_layout",
                    &format!(
                        "does not apply: {} is not DeepSeek-V4 (no compress_ratios)",
                        m.name
                    ),
                ));
            }
            layout
        }
    };
    // The engine's page when not given: SGLang's 256 tokens for DeepSeek-V4, else 64.
    let page_size_tokens = page_size_tokens.unwrap_or_else(|| m.engine_page_size_tokens());
    let opts = Options {
        kv_dtype,
        index_k: index_k_choice,
        page_size_tokens,
        pages,
        tp,
        state_dtype,
        equal_page_bytes,
        // DeepSeek-V4's KV record: SGLang's default FlashMLA pool (584 B/token) unless given.
        kv_layout,
    };
    Ok((m, opts))
}

/// `v` as a Python int: an `int`, or an integer that converts losslessly through `__index__`
/// (numpy's `int64`, `uint32`...); `None` for a bool (Python's or numpy's) and anything else.
pub(crate) fn index_int<'py>(v: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyInt>>> {
    if v.is_instance_of::<PyBool>() {
        return Ok(None);
    }
    if let Ok(i) = v.cast::<PyInt>() {
        return Ok(Some(i.clone()));
    }
    let index = v.py().import("operator")?.getattr("index")?;
    match index.call1((v,)) {
        // numpy's bool_ has no __index__ (numpy >= 1.24 raises TypeError): refused above or here.
        Ok(i) => Ok(i.cast_into::<PyInt>().ok()),
        Err(e) if e.is_instance_of::<PyTypeError>(v.py()) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A count argument (`tp`, `rank`, `pages`, `page_size_tokens`): an int (not a bool; numpy
/// integers too) in `0..2^64`; otherwise `InvalidGeometry` (a `ValueError`) or `TypeError`
/// naming the field and the value.
pub(crate) fn count_arg(py: Python<'_>, field: &str, v: &Bound<'_, PyAny>) -> PyResult<u64> {
    let Some(v) = index_int(v)? else {
        return Err(PyTypeError::new_err(format!(
            "{field}: expected an int, got {} {}",
            v.get_type().name()?,
            v.repr()?
        )));
    };
    v.extract::<u64>().map_err(|_| {
        let r = v.repr().map(|r| r.to_string()).unwrap_or_default();
        let problem = if v.lt(0).unwrap_or(false) {
            format!("{r} is negative")
        } else {
            format!("{r} is past 64 bits")
        };
        errors::invalid_geometry(py, field, &problem)
    })
}

/// The device pool geometry of one rank of a model, as `kvlayout describe --json`.
///
/// `model`: a built-in name (`kvlayout describe --help` lists them: deepseek-v3.2-exp,
/// deepseek-v3, kimi-k2, glm-4.5, llama-3.1-8b, qwen3-8b, gpt-oss-20b, gemma-3-4b-it, ...), a
/// config.json path or a Hugging Face model directory. `kv_dtype`: "bf16" | "fp8" (default fp8
/// for DSA models, bf16 otherwise); `index_k`: "fp8" | "bf16" | "fp4" (DeepSeek indexer
/// models, default fp8; `InvalidGeometry`, a `ValueError`, naming `index_k` and the model on
/// any other, as the CLI refuses `--index-k`); `tp`, `rank`: tensor-parallel size and
/// this rank (default one rank, with no `shard`: pass `tp=1` for the TP-1 side of a
/// token-level `compare` against another TP size's rank); `state_dtype`: recurrent-state dtype ("f32" | "bf16" | "f16");
/// `page_size_tokens`, `pages`: the pool's page size (default the engine's: 256 for
/// DeepSeek-V4 as SGLang allocates it, 64 otherwise) and page count; `equal_page_bytes`: give
/// every token buffer's page the bytes of the largest (vLLM's hybrid allocator); `kv_layout`:
/// DeepSeek-V4's KV record, "flashmla" (default, 584 B/token) | "trtllm" (512 B/token), as the
/// CLI's `--kv-layout` (`InvalidGeometry` naming `kv_layout` on any other model).
/// Raises `ModelError` (unreadable config, a field that changes the cache and is not modelled,
/// named) or `ValueError` (a bad option, named).
#[pyfunction]
#[pyo3(signature = (model, kv_dtype = None, index_k = None, tp = None, rank = None, *, state_dtype = None, page_size_tokens = None, pages = None, equal_page_bytes = false, kv_layout = None), text_signature = "(model, kv_dtype=None, index_k=None, tp=None, rank=None, *, state_dtype=None, page_size_tokens=None, pages=1024, equal_page_bytes=False, kv_layout=None)")]
#[allow(clippy::too_many_arguments)]
pub fn describe(
    py: Python<'_>,
    model: PathBuf,
    kv_dtype: Option<&str>,
    index_k: Option<&str>,
    tp: Option<&Bound<'_, PyAny>>,
    rank: Option<&Bound<'_, PyAny>>,
    state_dtype: Option<&str>,
    page_size_tokens: Option<&Bound<'_, PyAny>>,
    pages: Option<&Bound<'_, PyAny>>,
    equal_page_bytes: bool,
    kv_layout: Option<&str>,
) -> PyResult<Geometry> {
    let page_size_tokens = page_size_tokens
        .map(|p| count_arg(py, "page_size_tokens", p))
        .transpose()?;
    let pages = match pages {
        Some(p) => count_arg(py, "pages", p)?,
        None => 1024,
    };
    let (m, opts) = load(
        py,
        model,
        kv_dtype,
        index_k,
        tp,
        rank,
        state_dtype,
        kv_layout,
        page_size_tokens,
        pages,
        equal_page_bytes,
    )?;
    let pool = m
        .pool(&opts)
        .map_err(|e| errors::model_error(py, e.to_string()))?;
    Geometry::new(py, pool.geometry)
}

/// The per-rank totals of a model, as `kvlayout describe --totals`: a dict with `model`,
/// `full_bytes_per_token` (full-attention buffers, bytes per token x layers),
/// `window_bytes_per_request_max` (sliding / chunked buffers, x window, no page rounding),
/// `state_bytes_per_request` (recurrent state, slot bytes x layers),
/// `compressed_bytes_per_token` (buffers storing one row per R > 1 tokens: row bytes x layers /
/// R, an int when whole, else a float: DeepSeek-V4-Flash 10570.25) and `layers_by_attention`.
/// Options as `describe`.
#[pyfunction]
#[pyo3(signature = (model, kv_dtype = None, index_k = None, tp = None, rank = None, *, state_dtype = None, kv_layout = None))]
#[allow(clippy::too_many_arguments)]
pub fn totals<'py>(
    py: Python<'py>,
    model: PathBuf,
    kv_dtype: Option<&str>,
    index_k: Option<&str>,
    tp: Option<&Bound<'py, PyAny>>,
    rank: Option<&Bound<'py, PyAny>>,
    state_dtype: Option<&str>,
    kv_layout: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let (m, opts) = load(
        py,
        model,
        kv_dtype,
        index_k,
        tp,
        rank,
        state_dtype,
        kv_layout,
        None,
        1024,
        false,
    )?;
    let t = m
        .totals(&opts)
        .map_err(|e| errors::model_error(py, e.to_string()))?;
    to_py(py, &serde_json::to_value(&t).expect("totals serialize"))
}
