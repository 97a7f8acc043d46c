//! Per-token layouts of attention layers (DESIGN-facts.md "Token layouts"):
//! - GQA/MHA: sections `k` and `v` of `[kv heads on this rank, head_dim]`, K plane then V
//!   plane in a page (`section_major`; vLLM `[blocks, 2, block, heads, dim]`), bf16 or e4m3.
//!   `head_dim` = `hidden_size / num_attention_heads` when absent (Llama-3.1). Global
//!   (full-attention) layers of Gemma 4 use `global_head_dim`, and with `attention_k_eq_v` the
//!   `num_global_key_value_heads` (vLLM `gemma4.py` `Gemma4DecoderLayer`).
//!   `attention_k_eq_v` keeps **both** K and V planes: the V projection reuses the K weights,
//!   but the cached values differ (K gets `k_norm` and RoPE, V a scale-free `v_norm` and no
//!   RoPE), and vLLM loads the K weights into both slots of one QKV projection and caches K and
//!   V as usual; so the cache is 2 x heads x `global_head_dim`, as for any other layer.
//! - MLA (`kv_lora_rank`): buffer `kv`, one row per token: bf16 latent + rope (`mla_bf16`,
//!   1152 B for 512 + 64), plain fp8 (`mla_fp8`, 576 B), or for DSA models in fp8 FlashMLA's
//!   sparse row (`dsa_mla_fp8`, 656 B).
//! - DSA (`index_head_dim`): plus buffer `index_k`, `index_k_fp8` 132 B, `index_k_bf16` 256 B
//!   or `index_k_fp4` 68 B for `index_head_dim` 128, values then scales.

use std::borrow::Cow;

use kvlayout_core::{Arrangement, Dtype, ScaleOf, Section, TokenLayout, formats};

use crate::shard::{Shard, Tp, divide_evenly, split_heads};
use crate::{IndexK, KvDtype, ModelConfig, ModelError};

pub(crate) fn section(
    name: &'static str,
    dtype: Dtype,
    shape: Vec<u64>,
    scale: Option<(usize, u64)>,
) -> Section {
    Section {
        name: Cow::Borrowed(name),
        dtype,
        shape: Cow::Owned(shape),
        scale: scale.map(|(target, block_elems)| ScaleOf {
            target,
            block_elems,
        }),
        order: None,
    }
}

pub(crate) fn owned_layout(arrangement: Arrangement, sections: Vec<Section>) -> TokenLayout {
    TokenLayout {
        arrangement,
        sections: Cow::Owned(sections),
        page_align_bytes: None,
        page_stride_bytes: None,
    }
}

/// A layout with its format name and how it is sharded.
pub(crate) struct Built {
    pub format: String,
    pub layout: TokenLayout,
    pub shard: Option<Shard>,
}

pub(crate) struct Kv<'a> {
    pub name: &'a str,
    pub c: &'a ModelConfig,
    pub tp: Option<Tp>,
}

impl Kv<'_> {
    fn err(&self, field: &str, problem: impl Into<String>) -> ModelError {
        ModelError::field(self.name, field, problem)
    }

    pub fn positive(&self, field: &str, v: Option<u64>) -> Result<u64, ModelError> {
        match v {
            Some(0) => Err(self.err(field, "must be at least 1, got 0")),
            Some(v) => Ok(v),
            None => Err(self.err(field, "missing")),
        }
    }

    /// `head_dim`, else `hidden_size / num_attention_heads` (exact).
    pub fn head_dim(&self) -> Result<u64, ModelError> {
        if let Some(d) = self.c.head_dim {
            return self.positive("head_dim", Some(d));
        }
        let hidden = self.positive("hidden_size", self.c.hidden_size)?;
        let heads = self.positive("num_attention_heads", Some(self.c.num_attention_heads))?;
        if hidden % heads != 0 {
            return Err(self.err(
                "hidden_size",
                format!("{hidden} is not a multiple of num_attention_heads {heads}"),
            ));
        }
        Ok(hidden / heads)
    }

    /// K and V of a GQA layer; `global` picks Gemma 4's global-layer head shape.
    pub fn gqa(&self, kv: KvDtype, global: bool) -> Result<Built, ModelError> {
        let c = self.c;
        let q_heads = self.positive("num_attention_heads", Some(c.num_attention_heads))?;
        let k_eq_v = global && c.attention_k_eq_v == Some(true);
        let (heads_field, heads) = if k_eq_v && c.num_global_key_value_heads.is_some() {
            ("num_global_key_value_heads", c.num_global_key_value_heads)
        } else {
            (
                "num_key_value_heads",
                Some(c.num_key_value_heads.unwrap_or(c.num_attention_heads)),
            )
        };
        let heads = self.positive(heads_field, heads)?;
        if q_heads % heads != 0 {
            return Err(self.err(
                heads_field,
                format!(
                    "{heads} does not divide num_attention_heads {q_heads} (each KV head serves a whole group of query heads)"
                ),
            ));
        }
        let dim = match c.global_head_dim {
            Some(d) if global => self.positive("global_head_dim", Some(d))?,
            _ => self.head_dim()?,
        };
        let (local, shard) = match self.tp {
            Some(tp) => {
                divide_evenly(self.name, "num_attention_heads", q_heads, tp)?;
                let shard = split_heads(self.name, heads_field, heads, tp)?;
                let Shard::Heads { local, .. } = shard else {
                    unreachable!("split_heads returns Heads")
                };
                (local, Some(shard))
            }
            None => (heads, None),
        };
        let (dtype, tag, konst) = match kv {
            KvDtype::Bf16 => (Dtype::Bf16, "bf16", formats::MHA_BF16_8X128),
            KvDtype::Fp8 => (Dtype::F8E4M3, "fp8", formats::MHA_FP8_8X128),
        };
        let format = format!("mha_{tag}_{local}x{dim}");
        let layout = if (local, dim) == (8, 128) {
            konst
        } else {
            owned_layout(
                Arrangement::SectionMajor,
                vec![
                    section("k", dtype, vec![local, dim], None),
                    section("v", dtype, vec![local, dim], None),
                ],
            )
        };
        Ok(Built {
            format,
            layout,
            shard,
        })
    }

    /// The MLA latent row (replicated under TP).
    pub fn mla(&self, kv: KvDtype, dsa: bool) -> Result<Built, ModelError> {
        let c = self.c;
        let rank = self.positive("kv_lora_rank", c.kv_lora_rank)?;
        let rope = self.positive("qk_rope_head_dim", c.qk_rope_head_dim)?;
        let standard = (rank, rope) == (512, 64);
        let (format, layout) = match (kv, dsa) {
            (KvDtype::Bf16, _) if standard => ("mla_bf16".to_string(), formats::MLA_BF16),
            (KvDtype::Fp8, false) if standard => ("mla_fp8".to_string(), formats::MLA_FP8),
            (KvDtype::Fp8, true) if standard => ("dsa_mla_fp8".to_string(), formats::DSA_MLA_FP8),
            (KvDtype::Bf16, _) | (KvDtype::Fp8, false) => {
                let (d, tag) = match kv {
                    KvDtype::Bf16 => (Dtype::Bf16, "bf16"),
                    KvDtype::Fp8 => (Dtype::F8E4M3, "fp8"),
                };
                (
                    format!("mla_{tag}_{rank}_{rope}"),
                    owned_layout(
                        Arrangement::TokenMajor,
                        vec![
                            section("latent", d, vec![rank], None),
                            section("rope", d, vec![rope], None),
                        ],
                    ),
                )
            }
            (KvDtype::Fp8, true) => {
                if rank % 128 != 0 {
                    return Err(self.err(
                        "kv_lora_rank",
                        format!("{rank} is not a multiple of the 128-element scale block"),
                    ));
                }
                (
                    format!("dsa_mla_fp8_{rank}_{rope}"),
                    owned_layout(
                        Arrangement::TokenMajor,
                        vec![
                            section("nope", Dtype::F8E4M3, vec![rank], None),
                            section("nope_scale", Dtype::F32, vec![rank / 128], Some((0, 128))),
                            section("rope", Dtype::Bf16, vec![rope], None),
                        ],
                    ),
                )
            }
        };
        Ok(Built {
            format,
            layout,
            shard: self.tp.map(|tp| Shard::Replicated { tp }),
        })
    }

    /// The DSA indexer keys (replicated under TP).
    pub fn index_k(&self, index_k: IndexK) -> Result<Built, ModelError> {
        let dim = self.positive("index_head_dim", self.c.index_head_dim)?;
        let (name, konst, block) = match index_k {
            IndexK::Fp8 => ("index_k_fp8", formats::INDEX_K_FP8, 128),
            IndexK::Bf16 => ("index_k_bf16", formats::INDEX_K_BF16, 1),
            IndexK::Fp4 => ("index_k_fp4", formats::INDEX_K_FP4, 32),
        };
        let shard = self.tp.map(|tp| Shard::Replicated { tp });
        if dim == 128 {
            return Ok(Built {
                format: name.into(),
                layout: konst,
                shard,
            });
        }
        if dim % block != 0 {
            return Err(self.err(
                "index_head_dim",
                format!("{dim} is not a multiple of the {block}-element scale block"),
            ));
        }
        let values = |d| section("values", d, vec![dim], None);
        let sections = match index_k {
            IndexK::Fp8 => vec![
                values(Dtype::F8E4M3),
                section("scale", Dtype::F32, vec![dim / 128], Some((0, 128))),
            ],
            IndexK::Bf16 => vec![values(Dtype::Bf16)],
            IndexK::Fp4 => vec![
                values(Dtype::F4E2M1),
                section("scale", Dtype::Ue8m0, vec![dim / 32], Some((0, 32))),
            ],
        };
        // Not the built-in 128-dim format: the name says the dimension.
        Ok(Built {
            format: format!("{name}_{dim}"),
            layout: owned_layout(Arrangement::SectionMajor, sections),
            shard,
        })
    }
}
