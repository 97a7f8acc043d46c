//! `kvlayout describe --totals` (docs/DESIGN.md contract): one JSON object for the pool of one rank.
//!
//! - `full_bytes_per_token`: sum over full-attention buffers of bytes per token x layers;
//! - `window_bytes_per_request_max`: sum over sliding / chunked buffers of bytes per token x
//!   layers x window (or chunk) tokens, no page rounding;
//! - `layers_by_attention.linear` counts every recurrent-state layer that is not Mamba2: Gated
//!   DeltaNet, Kimi Delta Attention, RecurrentGemma's RG-LRU blocks;
//! - `state_bytes_per_request`: sum over state buffers of slot bytes x layers;
//! - `compressed_bytes_per_token`: sum over buffers storing one row per R > 1 tokens of row
//!   bytes x layers / R (layout-core's totals; DeepSeek-V4's C4 / C128 KV, C4 indexer and the
//!   C4 compressor state rings, which DESIGN writes as paged rings with R = 32);
//! - `layers_by_attention`: model layers per kind (`full`, `sliding`, `chunked`, `linear`, and
//!   `mamba`, `no_cache` for Nemotron-H).

use serde::Serialize;

use crate::ModelError;
use crate::layers::LayerKind;
use kvlayout_core::PoolGeometry;

/// Model layers per attention kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LayersByAttention {
    /// Full attention.
    pub full: u64,
    /// Sliding window.
    pub sliding: u64,
    /// Chunked local attention.
    pub chunked: u64,
    /// Linear attention (recurrent state).
    pub linear: u64,
    /// Compressed-attention layers (DeepSeek-V4 `compress_ratios` 4 and 128).
    pub compressed: u64,
    /// Mamba2 mixers (recurrent state).
    pub mamba: u64,
    /// Layers without a cache (MLP / MoE only).
    pub no_cache: u64,
}

/// The `--totals` object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Totals {
    /// Model name (built-in name or the path given).
    pub model: String,
    /// Bytes per token of all full-attention layers (buffers storing a row per token).
    pub full_bytes_per_token: u64,
    /// Bytes one request holds at most in windowed / chunked layers.
    pub window_bytes_per_request_max: u64,
    /// Bytes of recurrent state per request.
    pub state_bytes_per_request: u64,
    /// Bytes per token of the compressed buffers (one row per R tokens): row bytes x layers /
    /// R, exact (R is a power of two); written as an integer when it is one (DeepSeek-V4-Flash
    /// C128 KV: 584 x 20 / 128 = 91.25).
    #[serde(serialize_with = "exact_number")]
    pub compressed_bytes_per_token: f64,
    /// Model layers per kind.
    pub layers_by_attention: LayersByAttention,
}

/// Totals of `geometry` (layout-core's [`PoolGeometry::totals`], the one computation) with the
/// model name and its layers per kind.
pub(crate) fn totals(
    model: &str,
    kinds: &[LayerKind],
    geometry: &PoolGeometry,
) -> Result<Totals, ModelError> {
    let bytes = geometry.totals().map_err(|source| ModelError::Geometry {
        name: model.to_string(),
        source,
    })?;
    let mut t = Totals {
        model: model.to_string(),
        full_bytes_per_token: bytes.full_bytes_per_token,
        compressed_bytes_per_token: bytes.compressed_bytes_per_token,
        window_bytes_per_request_max: bytes.window_bytes_per_request_max,
        state_bytes_per_request: bytes.state_bytes_per_request,
        layers_by_attention: LayersByAttention::default(),
    };
    for k in kinds {
        let n = &mut t.layers_by_attention;
        *match k {
            LayerKind::Full => &mut n.full,
            LayerKind::Sliding { .. } => &mut n.sliding,
            LayerKind::Chunked { .. } => &mut n.chunked,
            LayerKind::Linear | LayerKind::Kda | LayerKind::RgLru => &mut n.linear,
            LayerKind::Mamba => &mut n.mamba,
            LayerKind::NoCache => &mut n.no_cache,
            LayerKind::Compressed { .. } => &mut n.compressed,
        } += 1;
    }
    Ok(t)
}

/// A byte count that is a whole number written as a JSON integer (`0`, `3066`), else as a
/// decimal (`91.25`): the totals' exact value either way.
fn exact_number<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53
    if v.fract() == 0.0 && *v >= 0.0 && *v < EXACT {
        s.serialize_u64(*v as u64)
    } else {
        s.serialize_f64(*v)
    }
}
