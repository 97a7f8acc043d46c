//! Per-token layouts of attention layers, built by layout-core's parametric format builders
//! (`kvlayout_core::formats::{mha, mla, dsa_mla_fp8, index_k}`, equal to the derived
//! descriptors at the standard sizes):
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

use kvlayout_core::{Arrangement, Dtype, LayoutError, Section, TokenLayout, formats};

use crate::shard::{Shard, Tp, divide_evenly, split_heads};
use crate::{IndexK, KvDtype, ModelConfig, ModelError};

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

    /// A layout the builder refused, blamed on the config field that sized it: the first of
    /// `fields`, or for an overflow the largest (a product overflows through its largest
    /// factor: `head_dim` 2^64 - 1, not `num_key_value_heads` 2); the others are named with it.
    fn layout_err(&self, fields: &[(&str, u64)], e: LayoutError) -> ModelError {
        let at_fault = match e {
            LayoutError::Overflow { .. } => fields.iter().max_by_key(|(_, v)| *v),
            _ => fields.first(),
        };
        let Some(&(field, value)) = at_fault else {
            return self.err("layout", e.to_string());
        };
        let others: Vec<String> = fields
            .iter()
            .filter(|(f, _)| *f != field)
            .map(|(f, v)| format!("{f} {v}"))
            .collect();
        let with = if others.is_empty() {
            String::new()
        } else {
            format!(" (with {})", others.join(", "))
        };
        self.err(field, format!("{value}{with} gives an invalid layout: {e}"))
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

    /// K and V of a GQA layer; `global` picks Gemma 4's global-layer head shape (and MiMo-V2's
    /// full-attention V width), `!global` MiMo-V2's `swa_*` heads and dims when given.
    pub fn gqa(&self, kv: KvDtype, global: bool) -> Result<Built, ModelError> {
        let c = self.c;
        let mimo_local = !global && c.hybrid_layer_pattern.is_some();
        let k_eq_v = global && c.attention_k_eq_v == Some(true);
        let (heads_field, heads) = if mimo_local && c.swa_num_key_value_heads.is_some() {
            ("swa_num_key_value_heads", c.swa_num_key_value_heads)
        } else if k_eq_v && c.num_global_key_value_heads.is_some() {
            ("num_global_key_value_heads", c.num_global_key_value_heads)
        } else {
            (
                "num_key_value_heads",
                Some(c.num_key_value_heads.unwrap_or(c.num_attention_heads)),
            )
        };
        let (q_field, q_heads) = match c.swa_num_attention_heads {
            Some(q) if mimo_local => ("swa_num_attention_heads", q),
            _ => ("num_attention_heads", c.num_attention_heads),
        };
        let heads = self.positive(heads_field, heads)?;
        let dim = match (c.global_head_dim, c.swa_head_dim) {
            (Some(d), _) if global => self.positive("global_head_dim", Some(d))?,
            (_, Some(d)) if mimo_local => self.positive("swa_head_dim", Some(d))?,
            _ => self.head_dim()?,
        };
        // The field that gave `dim`, with its value, for an error.
        let dim_field = match (c.global_head_dim, c.swa_head_dim, c.head_dim, c.hidden_size) {
            (Some(d), _, _, _) if global => ("global_head_dim", d),
            (_, Some(d), _, _) if mimo_local => ("swa_head_dim", d),
            (_, _, None, Some(hidden)) => ("hidden_size", hidden),
            _ => ("head_dim", dim),
        };
        // MiMo-V2 caches V narrower than K (SGLang SWAKVPool `v_head_dim`, `swa_v_head_dim`).
        let v_dim = if c.hybrid_layer_pattern.is_some() {
            let (f, v) = if mimo_local {
                ("swa_v_head_dim", c.swa_v_head_dim)
            } else {
                ("v_head_dim", c.v_head_dim)
            };
            match v {
                Some(v) => self.positive(f, Some(v))?,
                None => dim,
            }
        } else {
            dim
        };
        self.kv_heads(
            kv,
            (heads_field, heads),
            (q_field, q_heads),
            (dim, dim_field),
            v_dim,
        )
    }

    /// K `[heads, dim]` and V `[heads, v_dim]` of `heads` KV heads (named `heads_field` in
    /// errors) serving `q_heads` query heads, split over the TP ranks; `dim_field` is the config
    /// field (and its value) that gave `dim`, for errors.
    pub fn kv_heads(
        &self,
        kv: KvDtype,
        (heads_field, heads): (&str, u64),
        (q_field, q_heads): (&str, u64),
        (dim, dim_field): (u64, (&str, u64)),
        v_dim: u64,
    ) -> Result<Built, ModelError> {
        let q_heads = self.positive(q_field, Some(q_heads))?;
        if !q_heads.is_multiple_of(heads) {
            return Err(self.err(
                heads_field,
                format!(
                    "{heads} does not divide {q_field} {q_heads} (each KV head serves a whole group of query heads)"
                ),
            ));
        }
        let (local, shard) = match self.tp {
            Some(tp) => {
                divide_evenly(self.name, q_field, q_heads, tp)?;
                let shard = split_heads(self.name, heads_field, heads, tp)?;
                let Shard::Heads { local, .. } = shard else {
                    unreachable!("split_heads returns Heads")
                };
                (local, Some(shard))
            }
            None => (heads, None),
        };
        let (dtype, tag) = match kv {
            KvDtype::Bf16 => (Dtype::Bf16, "bf16"),
            KvDtype::Fp8 => (Dtype::F8E4M3, "fp8"),
        };
        let (format, built) = if v_dim == dim {
            (
                format!("mha_{tag}_{local}x{dim}"),
                formats::mha(local, dim, dtype),
            )
        } else {
            // K plane then V plane, as `formats::mha`, V of its own width.
            let layout = TokenLayout {
                arrangement: Arrangement::SectionMajor,
                sections: Cow::Owned(vec![
                    Section::owned("k", dtype, vec![local, dim]),
                    Section::owned("v", dtype, vec![local, v_dim]),
                ]),
                page_align_bytes: None,
                page_stride_bytes: None,
            };
            let checked = layout.validate().map(|()| layout);
            (format!("mha_{tag}_{local}x{dim}_v{v_dim}"), checked)
        };
        let layout = built.map_err(|e| self.layout_err(&[(heads_field, heads), dim_field], e))?;
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
        // The query heads still split over the ranks (SGLang's and vLLM's MLA attention
        // divide `num_attention_heads` by the TP size), though the latent is replicated.
        if let Some(tp) = self.tp {
            divide_evenly(
                self.name,
                "num_attention_heads",
                self.c.num_attention_heads,
                tp,
            )?;
        }
        let standard = (rank, rope) == (512, 64);
        let (name, built) = match (kv, dsa) {
            (KvDtype::Bf16, _) => ("mla_bf16", formats::mla(rank, rope, Dtype::Bf16)),
            (KvDtype::Fp8, false) => ("mla_fp8", formats::mla(rank, rope, Dtype::F8E4M3)),
            (KvDtype::Fp8, true) => ("dsa_mla_fp8", formats::dsa_mla_fp8(rank, rope)),
        };
        let layout = built.map_err(|e| {
            self.layout_err(&[("kv_lora_rank", rank), ("qk_rope_head_dim", rope)], e)
        })?;
        // Not the standard 512 + 64: the name says the dimensions.
        let format = if standard {
            name.to_string()
        } else {
            format!("{name}_{rank}_{rope}")
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
        let (name, built) = match index_k {
            IndexK::Fp8 => (
                "index_k_fp8",
                formats::index_k(Dtype::F8E4M3, dim, Some((Dtype::F32, 128))),
            ),
            IndexK::Bf16 => ("index_k_bf16", formats::index_k(Dtype::Bf16, dim, None)),
            IndexK::Fp4 => (
                "index_k_fp4",
                formats::index_k(Dtype::F4E2M1, dim, Some((Dtype::Ue8m0, 32))),
            ),
        };
        let layout = built.map_err(|e| self.layout_err(&[("index_head_dim", dim)], e))?;
        // Not the built-in 128-dim format: the name says the dimension.
        let format = if dim == 128 {
            name.to_string()
        } else {
            format!("{name}_{dim}")
        };
        Ok(Built {
            format,
            layout,
            shard: self.tp.map(|tp| Shard::Replicated { tp }),
        })
    }
}
