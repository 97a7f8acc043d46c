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
//!   vLLM instead defaults both to the model dtype (`mamba_ssm_cache_dtype` "auto"); pass
//!   `--state-dtype bf16` for a vLLM pool.
//!
//! Qwen3-Coder-Next (kh 16, vh 32, dk = dv = 128, K 4), one rank: conv 2 x 16 x 128 x 3 +
//! 32 x 128 x 3 = 24,576 bf16 = 49,152 B; temporal 32 x 128 x 128 f32 = 2,097,152 B.

use std::borrow::Cow;

use kvlayout_core::{Arrangement, Dtype, Section, TokenLayout, formats};

use crate::kv::{Built, Kv};
use crate::shard::{Shard, Tp, divide_evenly};
use crate::{ModelError, StateDtype};

/// The conv and temporal buffers of one linear-attention layer.
pub(crate) fn gated_delta_net(
    kv: &Kv<'_>,
    state_dtype: Option<StateDtype>,
) -> Result<(Built, Built), ModelError> {
    let c = kv.c;
    let kh = kv.positive("linear_num_key_heads", c.linear_num_key_heads)?;
    let vh = kv.positive("linear_num_value_heads", c.linear_num_value_heads)?;
    let dk = kv.positive("linear_key_head_dim", c.linear_key_head_dim)?;
    let dv = kv.positive("linear_value_head_dim", c.linear_value_head_dim)?;
    let k = kv.positive("linear_conv_kernel_dim", c.linear_conv_kernel_dim)?;
    if k < 2 {
        return Err(ModelError::field(
            kv.name,
            "linear_conv_kernel_dim",
            format!("{k}: a causal conv keeps K - 1 past positions, so K must be at least 2"),
        ));
    }
    if vh % kh != 0 {
        return Err(ModelError::field(
            kv.name,
            "linear_num_value_heads",
            format!("{vh} is not a multiple of linear_num_key_heads {kh}"),
        ));
    }
    let temporal_dtype = match state_dtype {
        Some(d) => d,
        None => match c.mamba_ssm_dtype.as_deref() {
            None => StateDtype::F32,
            Some(s) => StateDtype::from_name(s).ok_or_else(|| {
                ModelError::field(
                    kv.name,
                    "mamba_ssm_dtype",
                    format!("\"{s}\": expected float32, bfloat16 or float16"),
                )
            })?,
        },
    };
    let tp = kv.tp.unwrap_or(Tp::SINGLE);
    let kh_local = divide_evenly(kv.name, "linear_num_key_heads", kh, tp)?;
    let vh_local = divide_evenly(kv.name, "linear_num_value_heads", vh, tp)?;
    let window = k - 1;
    let ratio = vh / kh;
    let v_width = ratio.checked_mul(dv).ok_or_else(|| {
        ModelError::field(kv.name, "linear_value_head_dim", format!("{dv}: overflow"))
    })?;
    // Three sections rather than formats::single's one [conv_dim / N, K - 1]: the same bytes,
    // but each section's first axis is the key-head group, so a rank's part is a head range.
    let conv = TokenLayout {
        arrangement: Arrangement::TokenMajor,
        sections: Cow::Owned(vec![
            Section::owned("q", Dtype::Bf16, vec![kh_local, dk, window]),
            Section::owned("k", Dtype::Bf16, vec![kh_local, dk, window]),
            Section::owned("v", Dtype::Bf16, vec![kh_local, v_width, window]),
        ]),
        page_align_bytes: None,
        page_stride_bytes: None,
    };
    let temporal =
        formats::single("ssm", temporal_dtype.dtype(), vec![vh_local, dv, dk]).map_err(|e| {
            ModelError::field(
                kv.name,
                "linear_num_value_heads",
                format!("gives a layout that {e}"),
            )
        })?;
    conv.validate().map_err(|e| {
        ModelError::field(
            kv.name,
            "linear_num_key_heads",
            format!("gives a layout that {e}"),
        )
    })?;
    let heads = |total: u64, local: u64| {
        kv.tp.map(|tp| Shard::Heads {
            tp,
            heads_total: total,
            local,
            first: tp.rank * local,
            replicas: 1,
        })
    };
    Ok((
        Built {
            format: format!("gdn_conv_bf16_{kh_local}x{dk}+{vh_local}x{dv}_k{k}"),
            layout: conv,
            shard: heads(kh, kh_local),
        },
        Built {
            format: format!("gdn_state_{}_{vh_local}x{dv}x{dk}", temporal_dtype.name()),
            layout: temporal,
            shard: heads(vh, vh_local),
        },
    ))
}
