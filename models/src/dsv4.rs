//! DeepSeek-V4 as SGLang allocates it on CUDA (`python/sglang/srt/mem_cache/
//! deepseek_v4_memory_pool.py` `DeepSeekV4TokenToKVPool`, `deepseek_v4_compress_state.py`
//! `CompressStatePool`, built in `model_executor/model_runner_kv_cache_mixin.py`, sized in
//! `DSV4PoolConfigurator`; sgl-project/sglang, index commit 007bddd4).
//!
//! The config gives one `compress_ratios` entry per layer (the first `num_hidden_layers`
//! entries; later ones belong to draft layers, which the pool of the target model does not
//! hold): 0 (a sliding-window layer only), 4 or 128 (a compressed layer); any other value is
//! refused as SGLang refuses it (`Unsupported compression ratio`). DeepSeek-V4-Flash: 43 layers,
//! 2 x 0, 21 x 4, 20 x 128.
//!
//! Page size: SGLang asserts `page_size == 256` on CUDA ("In paged swa mode, page_size must be
//! 256") and uses it as the SWA page size; another `page_size_tokens` is refused. The buffers,
//! in SGLang's order (`get_contiguous_buf_infos`: C4 KV, C4 indexer, C128 KV; then the states),
//! with P = 256:
//! - `swa`: every layer, the last `sliding_window` (128) tokens: `DeepSeekV4SingleKVPool`,
//!   584 B/token (448 e4m3 NoPE + 64 bf16 RoPE in plane 1, 7 ue8m0 scales + 1 pad in plane 2),
//!   page 256 x 584 = 149,504 B padded to a multiple of 576 = 260 x 576 = 149,760 B.
//!   `--kv-layout trtllm` (`DeepSeekV4UniformFP8KVPool`, `--dsv4-attn-backend trtllm`):
//!   448 + 64 e4m3 = 512 B/token, token-major, no padding: 131,072 B.
//! - `c4_kv`: ratio-4 layers, one 584-B row per 4 tokens (`page_size // 4` = 64 rows per
//!   page): 64 x 584 = 37,376 -> 65 x 576 = 37,440 B (trtllm: 64 x 512 = 32,768 B).
//! - `c4_index_k`: ratio-4 layers, the lightning indexer's keys, one row per 4 tokens
//!   (`DeepSeekV4IndexerPool`, `get_dsv4_indexer_bytes_per_token`): fp8 128 + 128 / 128 x 4 =
//!   132 B (values then scales, as DeepSeek-V3.2's), 64 x 132 = 8,448 B per page; `--index-k
//!   fp4` 64 + 4 = 68 B; `--index-k bf16` 256 B (the seed's device variant).
//! - `c128_kv`: ratio-128 layers, one 584-B row per 128 tokens (2 rows per page): 1,168 B ->
//!   3 x 576 = 1,728 B (trtllm 1,024 B).
//! - `c4_state`: ratio-4 layers, the compressor's state ring kept per SWA page
//!   (`translate_from_swa_loc_to_state_loc`: `swa_page * ring_size + swa_loc % ring_size`),
//!   8 rows per 256-token page (`get_compress_state_ring_size(4)`, no speculative decoding),
//!   written as DESIGN's paged ring: `compress_ratio` 256 / 8 = 32, with the SWA pages'
//!   window; a row is `2 x (1 + overlap 1) x 512` f32 (kv then score) = 2,048 x 4 = 8,192 B,
//!   a page 8 x 8,192 = 65,536 B.
//! - `c4_index_state`: the indexer compressor's ring, the same with head dim 128: a row of
//!   512 f32 = 2,048 B, a page 16,384 B.
//! - `c128_state`: ratio-128 layers, the compressor's raw state ring kept per request (offline
//!   C128, `SGLANG_OPT_USE_ONLINE_COMPRESS` off by default): 128 rows of `2 x 512` f32 = a
//!   `[128, 1024]` f32 slot = 524,288 B per request per layer.
//!
//! State dtype: f32 (`SGLANG_DSV4_COMPRESS_STATE_DTYPE` "float32", "a DSV4 architectural
//! constant"); `--state-dtype` overrides it. The KV dtype is fp8 (`--kv-dtype bf16` is the ROCm
//! unified pool, `DeepSeekV4UnifiedKVPool`, not modelled: refused).
//!
//! Tensor parallelism: DeepSeek-V4 has one KV head (`num_key_value_heads` 1: a single latent
//! row shared by all query heads, as MLA) and one indexer key, so every rank holds every
//! buffer whole (replicated).

use kvlayout_core::{Arrangement, Attention, Dtype, Section, TokenLayout, formats};

use crate::kv::{Built, Kv};
use crate::layers::LayerKind;
use crate::plan::BufferPlan;
use crate::shard::{Shard, divide_evenly};
use crate::{KvDtype, KvLayout, Model, ModelError, Options, StateDtype};

/// SGLang's DeepSeek-V4 page on CUDA, tokens (also the SWA page).
pub const PAGE_TOKENS: u64 = 256;
/// C4 compressor state rows per SWA page (`get_compress_state_ring_size(4)`).
pub const C4_RING_ROWS: u64 = 8;
/// C128 compressor state rows per request (`get_compress_state_ring_size(128)`, offline).
pub const C128_RING_ROWS: u64 = 128;

/// The compress ratio of each of the first `num_hidden_layers` layers (0, 4 or 128).
///
/// # Errors
/// `compress_ratios` shorter than `num_hidden_layers`, or an entry other than 0, 4, 128.
pub fn ratios(name: &str, c: &crate::ModelConfig) -> Result<Vec<u64>, ModelError> {
    let list = c.compress_ratios.as_deref().unwrap_or(&[]);
    let layers = c.num_hidden_layers;
    if (list.len() as u64) < layers {
        return Err(ModelError::field(
            name,
            "compress_ratios",
            format!(
                "{} entries, but num_hidden_layers is {layers} (one entry per layer)",
                list.len()
            ),
        ));
    }
    list[..layers as usize]
        .iter()
        .enumerate()
        .map(|(i, &r)| match r {
            0 | 4 | 128 => Ok(r),
            r => Err(ModelError::field(
                name,
                format!("compress_ratios[{i}]"),
                format!("{r}: SGLang's DeepSeek-V4 pool has ratios 0, 4 and 128 only"),
            )),
        })
        .collect()
}

/// The layer kinds: ratio 0 a sliding-window layer, 4 and 128 compressed layers.
pub(crate) fn kinds(name: &str, c: &crate::ModelConfig) -> Result<Vec<LayerKind>, ModelError> {
    let window = match c.sliding_window {
        Some(w) if w > 0 => w,
        Some(w) => {
            return Err(ModelError::field(
                name,
                "sliding_window",
                format!(
                    "must be at least 1, got {w} (every DeepSeek-V4 layer keeps a sliding window)"
                ),
            ));
        }
        None => {
            return Err(ModelError::field(
                name,
                "sliding_window",
                "missing (every DeepSeek-V4 layer keeps a sliding window)",
            ));
        }
    };
    Ok(ratios(name, c)?
        .into_iter()
        .map(|r| match r {
            0 => LayerKind::Sliding {
                window_tokens: window,
            },
            r => LayerKind::Compressed { ratio: r },
        })
        .collect())
}

fn layout_err(name: &str, field: &str, e: kvlayout_core::LayoutError) -> ModelError {
    ModelError::field(name, field, format!("gives an invalid layout: {e}"))
}

/// The 584-B FlashMLA record (or trtllm's 512-B e4m3 row) of NoPE `nope` + RoPE `rope`.
fn record(name: &str, layout: KvLayout, nope: u64, rope: u64) -> Result<Built, ModelError> {
    let (format, built) = match layout {
        KvLayout::FlashMla => (
            "dsv4_mla_fp8".to_string(),
            formats::dsv4_mla_fp8(nope, rope),
        ),
        KvLayout::Trtllm => {
            let l = TokenLayout {
                arrangement: Arrangement::TokenMajor,
                sections: kvlayout_core::Cow::Owned(vec![
                    Section::owned("nope", Dtype::F8E4M3, vec![nope]),
                    Section::owned("rope", Dtype::F8E4M3, vec![rope]),
                ]),
                page_align_bytes: None,
                page_stride_bytes: None,
            };
            let checked = l.validate().map(|()| l);
            ("dsv4_fp8_uniform".to_string(), checked)
        }
    };
    let layout = built.map_err(|e| layout_err(name, "head_dim", e))?;
    Ok(Built {
        format,
        layout,
        shard: None,
    })
}

/// The buffers of SGLang's DeepSeek-V4 pool (module docs).
pub(crate) fn plan(
    model: &Model,
    kinds: &[LayerKind],
    opts: &Options,
) -> Result<Vec<BufferPlan>, ModelError> {
    let name = &model.name;
    let c = &model.config;
    if opts.page_size_tokens != PAGE_TOKENS {
        return Err(ModelError::field(
            name,
            "page_size_tokens",
            format!(
                "{}: SGLang's DeepSeek-V4 pool on CUDA uses {PAGE_TOKENS}-token pages (model_runner_kv_cache_mixin.py asserts page_size == 256): use {PAGE_TOKENS}",
                opts.page_size_tokens
            ),
        ));
    }
    if opts.equal_page_bytes {
        return Err(ModelError::field(
            name,
            "--equal-page-bytes",
            "vLLM's hybrid allocator; SGLang's DeepSeek-V4 pool gives each buffer its own rows per 256-token page (not modelled for vLLM)",
        ));
    }
    if opts.kv_dtype == Some(KvDtype::Bf16) {
        return Err(ModelError::field(
            name,
            "--kv-dtype",
            "bf16: SGLang's DeepSeek-V4 CUDA pool is fp8 (the bf16 cache is the ROCm unified pool, DeepSeekV4UnifiedKVPool, not modelled)",
        ));
    }
    let kv = Kv {
        name,
        c,
        tp: opts.tp,
    };
    // One latent row per token shared by all query heads: a config with more KV heads is
    // no pool this module lays out (it was ignored).
    if let Some(h) = c.num_key_value_heads.filter(|&h| h != 1) {
        return Err(ModelError::field(
            name,
            "num_key_value_heads",
            format!(
                "{h}: SGLang's DeepSeek-V4 pool stores one KV head (a single latent row per token), expected 1"
            ),
        ));
    }
    let head_dim = kv.positive("head_dim", c.head_dim)?;
    let rope = kv.positive("qk_rope_head_dim", c.qk_rope_head_dim)?;
    let nope = head_dim
        .checked_sub(rope)
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            ModelError::field(
                name,
                "qk_rope_head_dim",
                format!("{rope} is not below head_dim {head_dim} (NoPE = head_dim - rope)"),
            )
        })?;
    let index_dim = kv.positive("index_head_dim", c.index_head_dim)?;
    let state_dtype = opts.state_dtype.unwrap_or(StateDtype::F32);
    // Every buffer is replicated, but the 64 query heads split over the ranks as in MLA.
    if let Some(tp) = opts.tp {
        divide_evenly(name, "num_attention_heads", c.num_attention_heads, tp)?;
    }
    let shard = opts.tp.map(|tp| Shard::Replicated { tp });
    let kv_record = record(name, opts.kv_layout, nope, rope)?;
    let index = kv.index_k(opts.index_k)?;
    let state = |head: u64, rows: Option<u64>, field: &str| -> Result<TokenLayout, ModelError> {
        // kv then score; C4 overlaps two windows: 2 x (1 + 1) x head.
        let width = match rows {
            None => 2 * 2 * head,
            Some(_) => 2 * head,
        };
        let shape = match rows {
            None => vec![width],
            Some(r) => vec![r, width],
        };
        formats::single("kv_score", state_dtype.dtype(), shape)
            .map_err(|e| layout_err(name, field, e))
    };
    let ids = |ratio: u64| -> Vec<u64> {
        kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| match k {
                LayerKind::Compressed { ratio: r } => *r == ratio,
                _ => false,
            })
            .map(|(i, _)| i as u64)
            .collect()
    };
    let window = c.sliding_window.unwrap_or(0);
    let swa = Attention::SlidingWindow {
        window_tokens: window,
    };
    let sd = state_dtype.name();
    let plan = |name: &str, format: String, attention, layer_ids, layout, ratio| BufferPlan {
        name: name.into(),
        format,
        attention,
        layer_ids,
        layout,
        shard,
        page_size_tokens: None,
        compress_ratio: ratio,
    };
    let mut plans = vec![plan(
        "swa",
        kv_record.format.clone(),
        swa,
        (0..c.num_hidden_layers).collect(),
        kv_record.layout.clone(),
        1,
    )];
    let (c4, c128) = (ids(4), ids(128));
    if !c4.is_empty() {
        plans.push(plan(
            "c4_kv",
            kv_record.format.clone(),
            Attention::Full,
            c4.clone(),
            kv_record.layout.clone(),
            4,
        ));
        plans.push(plan(
            "c4_index_k",
            index.format.clone(),
            Attention::Full,
            c4.clone(),
            index.layout.clone(),
            4,
        ));
    }
    if !c128.is_empty() {
        plans.push(plan(
            "c128_kv",
            kv_record.format.clone(),
            Attention::Full,
            c128.clone(),
            kv_record.layout.clone(),
            128,
        ));
    }
    if !c4.is_empty() {
        plans.push(plan(
            "c4_state",
            format!("dsv4_c4_state_{sd}_{}", 4 * head_dim),
            swa,
            c4.clone(),
            state(head_dim, None, "head_dim")?,
            PAGE_TOKENS / C4_RING_ROWS,
        ));
        plans.push(plan(
            "c4_index_state",
            format!("dsv4_c4_state_{sd}_{}", 4 * index_dim),
            swa,
            c4,
            state(index_dim, None, "index_head_dim")?,
            PAGE_TOKENS / C4_RING_ROWS,
        ));
    }
    if !c128.is_empty() {
        plans.push(plan(
            "c128_state",
            format!("dsv4_c128_state_{sd}_{C128_RING_ROWS}x{}", 2 * head_dim),
            Attention::State,
            c128,
            state(head_dim, Some(C128_RING_ROWS), "head_dim")?,
            1,
        ));
    }
    Ok(plans)
}
