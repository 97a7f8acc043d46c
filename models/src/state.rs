//! Linear-attention (Gated DeltaNet, Qwen3-Next) state: one fixed-size slot per request per
//! linear layer, following SGLang `python/sglang/srt/configs/qwen3_next.py`
//! (`mamba2_cache_params`) and `configs/mamba_utils.py` (`Mamba2StateShape.create`,
//! `mamba2_state_dtype`); vLLM `layers/mamba/mamba_utils.py` `gated_delta_net_state_shape`
//! gives the same element counts.
//!
//! With `kh` = `linear_num_key_heads`, `vh` = `linear_num_value_heads`, `dk` / `dv` the key /
//! value head dims, `K` = `linear_conv_kernel_dim` and `N` ranks:
//! - buffer `conv`: the causal-conv window, `conv_dim = 2*kh*dk + vh*dv` channels x `K - 1`
//!   positions, SGLang's `(conv_dim / N, K - 1)` tensor, channels ordered query, key, value.
//!   Written as three sections whose first axis is the key-head group, so a rank's part is a
//!   head range: `q [kh/N, dk, K-1]`, `k [kh/N, dk, K-1]`, `v [kh/N, (vh/kh)*dv, K-1]` (the
//!   same bytes in the same order). dtype bf16 (SGLang's `SGLANG_MAMBA_CONV_DTYPE` default).
//! - buffer `temporal`: the recurrent state `[vh/N, dv, dk]`, f32 by default (SGLang's
//!   `mamba2_state_dtype`: the config's `mamba_ssm_dtype`, else float32), or `--state-dtype`.
//!   vLLM's default conv layout is the transpose, `(K - 1, conv_dim / N)` ("SD",
//!   `VLLM_SSM_CONV_STATE_LAYOUT`); its "DS" layout is the one written here.
//!   vLLM instead defaults both to the model dtype (`mamba_ssm_cache_dtype` "auto"); pass
//!   `--state-dtype bf16` for a vLLM pool.
//!
//! Mamba2 (Nemotron-H; vLLM `mamba_utils.py` `mamba2_state_shape`, SGLang
//! `Mamba2StateShape.create`), with `h` = `mamba_num_heads`, `p` = `mamba_head_dim`, `g` =
//! `n_groups`, `s` = `ssm_state_size`, `K` = `conv_kernel`:
//! - `conv`: `conv_dim = h*p + 2*g*s` channels (x, then B, then C) x `K - 1`, bf16, written per
//!   group: `x [g/N, (h/g)*p, K-1]`, `b [g/N, s, K-1]`, `c [g/N, s, K-1]`;
//! - `temporal`: `[h/N, p, s]`, f32 by default (as above).
//!
//! `n_groups` must divide by `N` (SGLang's group replication for other splits is not modelled).
//!
//! Under `--tp N` the conv window is written in geometry v3's spelling: one section `conv` of
//! `[conv_dim / N, K - 1]` with `split_groups` = the whole-model channels of q, k, v (x, B, C),
//! each split by TP on its own, as SGLang slices it since #30997 (`conv_shard_groups`);
//! Qwen3-Coder-Next: `[2048, 2048, 4096]`, `heads_total` 8,192. Without `--tp` (no shard, where
//! `split_groups` cannot be written) the three per-head sections above stay.
//!
//! Qwen3-Coder-Next (kh 16, vh 32, dk = dv = 128, K 4), one rank: conv 2 x 16 x 128 x 3 +
//! 32 x 128 x 3 = 24,576 bf16 = 49,152 B; temporal 32 x 128 x 128 f32 = 2,097,152 B.

use std::borrow::Cow;

use kvlayout_core::{Arrangement, Dtype, Section, TokenLayout, formats};

use crate::kv::{Built, Kv};
use crate::shard::{Shard, Tp, divide_evenly};
use crate::{ModelError, StateDtype};

/// The recurrent-state dtype: `--state-dtype`, else the config's `mamba_ssm_dtype` (SGLang) or
/// `mamba_ssm_cache_dtype` (vLLM's field, NemotronH configs; "auto" is the default, f32 here),
/// else f32. Both fields given with different values are refused naming both.
fn temporal_dtype(kv: &Kv<'_>, state_dtype: Option<StateDtype>) -> Result<StateDtype, ModelError> {
    if let Some(d) = state_dtype {
        return Ok(d);
    }
    let read = |field: &str, v: Option<&str>| -> Result<Option<StateDtype>, ModelError> {
        match v {
            None | Some("auto") => Ok(None),
            Some(s) => StateDtype::from_name(s).map(Some).ok_or_else(|| {
                ModelError::field(
                    kv.name,
                    field,
                    format!("\"{s}\": expected float32, bfloat16 or float16"),
                )
            }),
        }
    };
    let ssm = read("mamba_ssm_dtype", kv.c.mamba_ssm_dtype.as_deref())?;
    let cache = read(
        "mamba_ssm_cache_dtype",
        kv.c.mamba_ssm_cache_dtype.as_deref(),
    )?;
    match (ssm, cache) {
        (Some(a), Some(b)) if a != b => Err(ModelError::field(
            kv.name,
            "mamba_ssm_cache_dtype",
            format!(
                "{} disagrees with mamba_ssm_dtype {} (one recurrent-state dtype)",
                b.name(),
                a.name()
            ),
        )),
        (Some(d), _) | (None, Some(d)) => Ok(d),
        (None, None) => Ok(StateDtype::F32),
    }
}

fn kernel(kv: &Kv<'_>, field: &str, v: Option<u64>) -> Result<u64, ModelError> {
    let k = kv.positive(field, v)?;
    if k < 2 {
        return Err(ModelError::field(
            kv.name,
            field,
            format!("{k}: a causal conv keeps K - 1 past positions, so K must be at least 2"),
        ));
    }
    Ok(k)
}

/// One conv part: its name, whole-model heads (groups), this rank's heads, and channels per
/// head.
type ConvPart = (&'static str, u64, u64, u64);

/// The bf16 conv window of `parts` (channels in the engines' order: q|k|v, x|B|C), `window`
/// positions, with its shard:
/// - without `--tp`: three sections whose first axis is the head group, `[heads, channels per
///   head, window]` (the same bytes in the same order as the engines' one `[conv_dim, K - 1]`
///   tensor; the v1/v2 spelling, unchanged);
/// - with `--tp N`: geometry v3's spelling, one section `conv` of `[conv_dim / N, window]`
///   whose leading axis is the concatenation of the parts, each split by TP on its own
///   (`split_groups` = the parts' whole-model channels; SGLang #30997 `conv_shard_groups`), the
///   shard's `heads_total` their sum: a plan then moves each group's slice, never the section
///   as one block.
fn conv_layout(
    kv: &Kv<'_>,
    field: &str,
    parts: [ConvPart; 3],
    window: u64,
) -> Result<(TokenLayout, Option<Shard>), ModelError> {
    let overflow = || ModelError::field(kv.name, field, "overflow: conv channels");
    let sections = match kv.tp {
        None => parts
            .iter()
            .map(|&(n, _, local, width)| Section::owned(n, Dtype::Bf16, vec![local, width, window]))
            .collect(),
        Some(_) => {
            let mut groups = Vec::with_capacity(3);
            let mut local_channels = 0u64;
            for &(_, total, local, width) in &parts {
                groups.push(total.checked_mul(width).ok_or_else(overflow)?);
                local_channels = local
                    .checked_mul(width)
                    .and_then(|c| c.checked_add(local_channels))
                    .ok_or_else(overflow)?;
            }
            vec![
                Section::owned("conv", Dtype::Bf16, vec![local_channels, window])
                    .with_split_groups(groups),
            ]
        }
    };
    let shard = match kv.tp {
        None => None,
        Some(_) => {
            let mut total = 0u64;
            let mut local = 0u64;
            for &(_, t, l, width) in &parts {
                total = t
                    .checked_mul(width)
                    .and_then(|c| c.checked_add(total))
                    .ok_or_else(overflow)?;
                local = l
                    .checked_mul(width)
                    .and_then(|c| c.checked_add(local))
                    .ok_or_else(overflow)?;
            }
            heads_shard(kv.tp, total, local)
        }
    };
    let layout = TokenLayout {
        arrangement: Arrangement::TokenMajor,
        sections: Cow::Owned(sections),
        page_align_bytes: None,
        page_stride_bytes: None,
    };
    layout
        .validate()
        .map_err(|e| ModelError::field(kv.name, field, format!("gives an invalid layout: {e}")))?;
    Ok((layout, shard))
}

fn ssm_layout(
    kv: &Kv<'_>,
    field: &str,
    dtype: StateDtype,
    shape: Vec<u64>,
) -> Result<TokenLayout, ModelError> {
    formats::single("ssm", dtype.dtype(), shape)
        .map_err(|e| ModelError::field(kv.name, field, format!("gives an invalid layout: {e}")))
}

fn heads_shard(tp: Option<Tp>, total: u64, local: u64) -> Option<Shard> {
    tp.map(|tp| Shard::Heads {
        tp,
        heads_total: total,
        local,
        first: tp.rank * local,
        replicas: 1,
    })
}

fn ratio_width(
    kv: &Kv<'_>,
    field: &str,
    num: u64,
    den: u64,
    den_field: &str,
    dim: u64,
) -> Result<u64, ModelError> {
    if !num.is_multiple_of(den) {
        return Err(ModelError::field(
            kv.name,
            field,
            format!("{num} is not a multiple of {den_field} {den}"),
        ));
    }
    (num / den)
        .checked_mul(dim)
        .ok_or_else(|| ModelError::field(kv.name, field, format!("{num}: overflow")))
}

/// The conv and temporal buffers of one linear-attention (Gated DeltaNet) layer.
pub(crate) fn gated_delta_net(
    kv: &Kv<'_>,
    state_dtype: Option<StateDtype>,
) -> Result<(Built, Built), ModelError> {
    let c = kv.c;
    let kh = kv.positive("linear_num_key_heads", c.linear_num_key_heads)?;
    let vh = kv.positive("linear_num_value_heads", c.linear_num_value_heads)?;
    let dk = kv.positive("linear_key_head_dim", c.linear_key_head_dim)?;
    let dv = kv.positive("linear_value_head_dim", c.linear_value_head_dim)?;
    let k = kernel(kv, "linear_conv_kernel_dim", c.linear_conv_kernel_dim)?;
    let v_width = ratio_width(
        kv,
        "linear_num_value_heads",
        vh,
        kh,
        "linear_num_key_heads",
        dv,
    )?;
    let dtype = temporal_dtype(kv, state_dtype)?;
    let tp = kv.tp.unwrap_or(Tp::SINGLE);
    let kh_local = divide_evenly(kv.name, "linear_num_key_heads", kh, tp)?;
    let vh_local = divide_evenly(kv.name, "linear_num_value_heads", vh, tp)?;
    let window = k - 1;
    let (conv, conv_shard) = conv_layout(
        kv,
        "linear_num_key_heads",
        [
            ("q", kh, kh_local, dk),
            ("k", kh, kh_local, dk),
            ("v", kh, kh_local, v_width),
        ],
        window,
    )?;
    let temporal = ssm_layout(kv, "linear_num_value_heads", dtype, vec![vh_local, dv, dk])?;
    Ok((
        Built {
            format: format!("gdn_conv_bf16_{kh_local}x{dk}+{vh_local}x{dv}_k{k}"),
            layout: conv,
            shard: conv_shard,
        },
        Built {
            format: format!("gdn_state_{}_{vh_local}x{dv}x{dk}", dtype.name()),
            layout: temporal,
            shard: heads_shard(kv.tp, vh, vh_local),
        },
    ))
}

/// The conv and temporal buffers of one Mamba2 layer.
pub(crate) fn mamba2(
    kv: &Kv<'_>,
    state_dtype: Option<StateDtype>,
) -> Result<(Built, Built), ModelError> {
    let c = kv.c;
    let h = kv.positive("mamba_num_heads", c.mamba_num_heads)?;
    let p = kv.positive("mamba_head_dim", c.mamba_head_dim)?;
    let g = kv.positive("n_groups", c.n_groups)?;
    let s = kv.positive("ssm_state_size", c.ssm_state_size)?;
    let k = kernel(kv, "conv_kernel", c.conv_kernel)?;
    let x_width = ratio_width(kv, "mamba_num_heads", h, g, "n_groups", p)?;
    let dtype = temporal_dtype(kv, state_dtype)?;
    let tp = kv.tp.unwrap_or(Tp::SINGLE);
    let g_local = divide_evenly(kv.name, "n_groups", g, tp)?;
    let h_local = divide_evenly(kv.name, "mamba_num_heads", h, tp)?;
    let window = k - 1;
    let (conv, conv_shard) = conv_layout(
        kv,
        "mamba_num_heads",
        [
            ("x", g, g_local, x_width),
            ("b", g, g_local, s),
            ("c", g, g_local, s),
        ],
        window,
    )?;
    let temporal = ssm_layout(kv, "mamba_num_heads", dtype, vec![h_local, p, s])?;
    Ok((
        Built {
            format: format!("mamba2_conv_bf16_{h_local}x{p}+2x{g_local}x{s}_k{k}"),
            layout: conv,
            shard: conv_shard,
        },
        Built {
            format: format!("mamba2_state_{}_{h_local}x{p}x{s}", dtype.name()),
            layout: temporal,
            shard: heads_shard(kv.tp, h, h_local),
        },
    ))
}

/// The conv and recurrent buffers of one Kimi Delta Attention layer (Kimi-Linear;
/// `linear_attn_config`: `num_heads` h, `head_dim` d, `short_conv_kernel_size` K), following
/// vLLM `layers/mamba/mamba_utils.py` `kda_state_shape`: q, k and v each have a causal conv of
/// h x d channels, `(h*d / N, K - 1)` each, and the recurrent state is `(h / N, d, d)`. The
/// conv windows are written as three bf16 sections `q`, `k`, `v` of `[h/N, d, K-1]` (the
/// layout of the GDN conv above); the recurrent state is f32 unless `--state-dtype` or the
/// config says otherwise.
///
/// Kimi-Linear-48B (h 32, d 128, K 4), one rank: conv 3 x 32 x 128 x 3 bf16 = 73,728 B;
/// recurrent 32 x 128 x 128 f32 = 2,097,152 B.
pub(crate) fn kda(
    kv: &Kv<'_>,
    state_dtype: Option<StateDtype>,
) -> Result<(Built, Built), ModelError> {
    let cfg = kv.c.linear_attn_config.as_ref();
    let get = |f: &str| {
        cfg.and_then(|c| c.get(f))
            .and_then(serde_json::Value::as_u64)
    };
    let field = |f: &str| format!("linear_attn_config.{f}");
    let h = kv.positive(&field("num_heads"), get("num_heads"))?;
    let d = kv.positive(&field("head_dim"), get("head_dim"))?;
    let k = kernel(
        kv,
        &field("short_conv_kernel_size"),
        get("short_conv_kernel_size"),
    )?;
    // A config giving K heads of their own (vLLM's num_k_heads / head_k_dim) is not modelled.
    for f in ["num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim"] {
        if let Some(v) = cfg.and_then(|c| c.get(f)).filter(|v| !v.is_null()) {
            return Err(ModelError::Unmodelled {
                name: kv.name.to_string(),
                field: field(f),
                value: v.to_string(),
                why: "KDA K or V heads of their own shape".into(),
            });
        }
    }
    let dtype = temporal_dtype(kv, state_dtype)?;
    let tp = kv.tp.unwrap_or(Tp::SINGLE);
    let h_local = divide_evenly(kv.name, &field("num_heads"), h, tp)?;
    let window = k - 1;
    let (conv, conv_shard) = conv_layout(
        kv,
        &field("num_heads"),
        [
            ("q", h, h_local, d),
            ("k", h, h_local, d),
            ("v", h, h_local, d),
        ],
        window,
    )?;
    let temporal = ssm_layout(kv, &field("num_heads"), dtype, vec![h_local, d, d])?;
    Ok((
        Built {
            format: format!("kda_conv_bf16_3x{h_local}x{d}_k{k}"),
            layout: conv,
            shard: conv_shard,
        },
        Built {
            format: format!("kda_state_{}_{h_local}x{d}x{d}", dtype.name()),
            layout: temporal,
            shard: heads_shard(kv.tp, h, h_local),
        },
    ))
}

/// The conv and recurrent buffers of one RecurrentGemma recurrent block, following
/// transformers `models/recurrent_gemma/modeling_recurrent_gemma.py`
/// (`RecurrentGemmaRecurrentBlock._setup_cache`): the causal conv keeps `conv1d_width - 1`
/// past positions of the `lru_width` channels in the model dtype (bf16 here), `[lru_width,
/// conv1d_width - 1]`, and the RG-LRU keeps `[lru_width]` in f32 ("recurrent_states always
/// computed in full precision"; `--state-dtype` does not apply). No engine shards it: `--tp`
/// is refused.
///
/// RecurrentGemma-2B (lru_width 2,560, conv1d_width 4): conv 2,560 x 3 x 2 = 15,360 B;
/// RG-LRU 2,560 x 4 = 10,240 B.
pub(crate) fn rg_lru(kv: &Kv<'_>) -> Result<(Built, Built), ModelError> {
    let c = kv.c;
    if let Some(tp) = kv.tp {
        return Err(ModelError::field(
            kv.name,
            "block_types",
            format!(
                "--tp {}: RecurrentGemma's recurrent blocks have no tensor-parallel split in an engine kvlayout follows",
                tp.size
            ),
        ));
    }
    let w = kv.positive("lru_width", c.lru_width)?;
    let k = kernel(kv, "conv1d_width", c.conv1d_width)?;
    let conv = formats::single("conv", Dtype::Bf16, vec![w, k - 1]).map_err(|e| {
        ModelError::field(
            kv.name,
            "lru_width",
            format!("gives an invalid layout: {e}"),
        )
    })?;
    let lru = ssm_layout(kv, "lru_width", StateDtype::F32, vec![w])?;
    Ok((
        Built {
            format: format!("rglru_conv_bf16_{w}_k{k}"),
            layout: conv,
            shard: None,
        },
        Built {
            format: format!("rglru_state_f32_{w}"),
            layout: lru,
            shard: None,
        },
    ))
}
