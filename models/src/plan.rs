//! The pool plan: model layers grouped into buffers (one per attention kind and layout), each
//! with the layers it serves, its token (or slot) layout and its shard; then the pool geometry.
//!
//! Buffer names: a model whose layers are all full attention keeps v1's names (`kv`, plus
//! `index_k` for DSA), so its geometry and fingerprint are unchanged; a hybrid names its groups
//! `full`, `swa` (sliding window), `chunked`, and `conv` + `temporal` (linear-attention state).

use kvlayout_core::{
    Attention, BufferGeometry, Dtype, GeometryError, MemoryLayout, PoolGeometry, TokenLayout,
};

use crate::kv::{Built, Kv};
use crate::layers::LayerKind;
use crate::shard::Shard;
use crate::state::{gated_delta_net, mamba2};
use crate::{KvDtype, Model, ModelError, Options};

/// One buffer of a model's pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferPlan {
    /// Buffer name.
    pub name: String,
    /// Format name (`dsa_mla_fp8`, `mha_bf16_8x64`, `gdn_state_f32_32x128x128`, ...).
    pub format: String,
    /// What it keeps per request.
    pub attention: Attention,
    /// The model layers it serves (ascending).
    pub layer_ids: Vec<u64>,
    /// Token layout (for `State`: the slot's contents).
    pub layout: TokenLayout,
    /// The rank's part, when `--tp` was given.
    pub shard: Option<Shard>,
    /// Tokens per page when not the pool's (`Options::equal_page_bytes`).
    pub page_size_tokens: Option<u64>,
    /// Tokens per stored row (geometry v3 `compress_ratio`; 1: a row per token). The layout
    /// describes one row; a page of P tokens holds P / R rows.
    pub compress_ratio: u64,
}

impl BufferPlan {
    /// Layers holding the buffer.
    pub fn layers(&self) -> u64 {
        self.layer_ids.len() as u64
    }
}

fn attention_of(kind: LayerKind) -> Attention {
    match kind {
        LayerKind::Full => Attention::Full,
        LayerKind::Sliding { window_tokens } => Attention::SlidingWindow { window_tokens },
        LayerKind::Chunked { chunk_tokens } => Attention::Chunked { chunk_tokens },
        LayerKind::Linear | LayerKind::Mamba | LayerKind::Kda | LayerKind::RgLru => {
            Attention::State
        }
        // Never asked: a layer without cache gets no buffer; V4 layers are planned in dsv4.
        LayerKind::NoCache | LayerKind::Compressed { .. } => Attention::Full,
    }
}

fn push(plans: &mut Vec<BufferPlan>, name: &str, attention: Attention, layer: u64, b: Built) {
    if let Some(p) = plans
        .iter_mut()
        .find(|p| p.attention == attention && p.layout == b.layout && p.shard == b.shard)
    {
        p.layer_ids.push(layer);
        return;
    }
    // A second group of the same kind (another shape) gets a numbered name.
    let taken = plans.iter().filter(|p| p.name.starts_with(name)).count();
    let name = if taken == 0 {
        name.to_string()
    } else {
        format!("{name}_{}", taken + 1)
    };
    plans.push(BufferPlan {
        name,
        format: b.format,
        attention,
        layer_ids: vec![layer],
        layout: b.layout,
        shard: b.shard,
        page_size_tokens: None,
        compress_ratio: 1,
    });
}

/// Groups the layers of `model` into buffers under `opts`.
pub(crate) fn plan(
    model: &Model,
    kinds: &[LayerKind],
    opts: &Options,
) -> Result<Vec<BufferPlan>, ModelError> {
    let c = &model.config;
    if c.compress_ratios.is_some() {
        return crate::dsv4::plan(model, kinds, opts);
    }
    let kv = Kv {
        name: &model.name,
        c,
        tp: opts.tp,
    };
    let mla = c.kv_lora_rank.is_some();
    if !mla && (model.declares_mla() || c.index_head_dim.is_some()) {
        return Err(ModelError::field(
            &model.name,
            "kv_lora_rank",
            "missing: the config declares an MLA model (DeepSeek / Kimi-K2 model_type or architectures, or an index_head_dim), whose KV cache is the compressed latent",
        ));
    }
    let dsa = mla && c.index_head_dim.is_some();
    let kv_dtype = opts
        .kv_dtype
        .unwrap_or(if dsa { KvDtype::Fp8 } else { KvDtype::Bf16 });
    if opts.kv_dtype.is_none() && !dsa {
        check_model_dtype(model)?;
    }
    let hybrid = kinds.iter().any(|k| *k != LayerKind::Full);
    // MLA layers beside Kimi Delta Attention (Kimi-Linear) are modelled; any other kind is not.
    if mla
        && let Some(i) = kinds
            .iter()
            .position(|k| !matches!(k, LayerKind::Full | LayerKind::Kda))
    {
        return Err(ModelError::field(
            &model.name,
            kind_field(c, kinds[i], i),
            format!(
                "{} attention in an MLA model is not modelled",
                kinds[i].key()
            ),
        ));
    }
    let owner = kv_owners(model, kinds)?;
    let mut plans = Vec::new();
    // Layouts are built once per kind (every layer of a kind has the same shape).
    let kda = kinds
        .contains(&LayerKind::Kda)
        .then(|| crate::state::kda(&kv, opts.state_dtype))
        .transpose()?;
    let rglru = kinds
        .contains(&LayerKind::RgLru)
        .then(|| crate::state::rg_lru(&kv, opts.state_dtype))
        .transpose()?;
    if mla {
        let latent = kv.mla(kv_dtype, dsa)?;
        let index = if dsa {
            Some(kv.index_k(opts.index_k)?)
        } else {
            None
        };
        let full_name = if hybrid { "full" } else { "kv" };
        for (i, &kind) in kinds.iter().enumerate() {
            let layer = i as u64;
            if kind == LayerKind::Kda {
                let (conv, temporal) = kda.as_ref().expect("built above for KDA layers");
                push(&mut plans, "conv", Attention::State, layer, clone(conv));
                push(
                    &mut plans,
                    "temporal",
                    Attention::State,
                    layer,
                    clone(temporal),
                );
                continue;
            }
            push(
                &mut plans,
                full_name,
                Attention::Full,
                layer,
                clone(&latent),
            );
            if let Some(ix) = &index {
                push(&mut plans, "index_k", Attention::Full, layer, clone(ix));
            }
        }
        return Ok(plans);
    }
    let full = kinds
        .contains(&LayerKind::Full)
        .then(|| kv.gqa(kv_dtype, true))
        .transpose()?;
    let local = kinds
        .iter()
        .any(|k| matches!(k, LayerKind::Sliding { .. } | LayerKind::Chunked { .. }))
        .then(|| kv.gqa(kv_dtype, false))
        .transpose()?;
    let state = kinds
        .contains(&LayerKind::Linear)
        .then(|| gated_delta_net(&kv, opts.state_dtype))
        .transpose()?;
    let mamba = kinds
        .contains(&LayerKind::Mamba)
        .then(|| mamba2(&kv, opts.state_dtype))
        .transpose()?;
    // DeciLM / Nemotron-NAS: KV heads per layer (`block_configs`).
    let decilm = match c.block_configs.as_ref().filter(|v| !v.is_null()) {
        Some(_) => Some(crate::decilm::kv_heads(
            &model.name,
            c,
            c.num_hidden_layers,
        )?),
        None => None,
    };
    let dim_field = || -> Result<(&'static str, u64), ModelError> {
        Ok(match (c.head_dim, c.hidden_size) {
            (None, Some(hidden)) => ("hidden_size", hidden),
            _ => ("head_dim", kv.head_dim()?),
        })
    };
    for (i, &kind) in kinds.iter().enumerate() {
        let layer = i as u64;
        // Gemma 3n / 4 KV sharing: a shared layer reads an earlier layer's cache.
        if owner[i] != i {
            continue;
        }
        let attention = attention_of(kind);
        let per_layer;
        let (name, built) = match kind {
            LayerKind::Full if decilm.is_some() => {
                let heads = decilm
                    .as_ref()
                    .and_then(|h| h[i])
                    .expect("an attention layer");
                let field = format!("block_configs[{i}].attention.n_heads_in_group");
                per_layer = kv.kv_heads(
                    kv_dtype,
                    (&field, heads),
                    ("num_attention_heads", c.num_attention_heads),
                    (kv.head_dim()?, dim_field()?),
                    kv.head_dim()?,
                )?;
                (if hybrid { "full" } else { "kv" }, Some(&per_layer))
            }
            LayerKind::Full if !hybrid => ("kv", full.as_ref()),
            LayerKind::Full => ("full", full.as_ref()),
            LayerKind::Sliding { .. } => ("swa", local.as_ref()),
            LayerKind::Chunked { .. } => ("chunked", local.as_ref()),
            // Compressed layers are DeepSeek-V4's, planned in dsv4 (returned above).
            LayerKind::NoCache | LayerKind::Compressed { .. } => continue,
            LayerKind::Linear | LayerKind::Mamba | LayerKind::Kda | LayerKind::RgLru => {
                let built = match kind {
                    LayerKind::Linear => state.as_ref(),
                    LayerKind::Mamba => mamba.as_ref(),
                    LayerKind::Kda => kda.as_ref(),
                    _ => rglru.as_ref(),
                };
                let (conv, temporal) = built.expect("built above for state layers");
                push(&mut plans, "conv", attention, layer, clone(conv));
                push(&mut plans, "temporal", attention, layer, clone(temporal));
                continue;
            }
        };
        let built = built.expect("built above for this kind");
        push(&mut plans, name, attention, layer, clone(built));
    }
    if opts.equal_page_bytes {
        equal_page_bytes(&model.name, &mut plans, opts.page_size_tokens)?;
    }
    Ok(plans)
}

/// The layer whose cache each layer reads: itself, or under Gemma 3n / 4 KV sharing
/// (`num_kv_shared_layers` S of L layers; vLLM `gemma3n.py` / `gemma4.py`,
/// `first_kv_shared_layer_idx = L - S`) the last layer before `L - S` of the same kind. Shared
/// layers own no buffer. Gemma-4-E2B: 35 layers, S 20: layers 15..35 own nothing, layers 0..15
/// (12 sliding, 3 full) own the cache.
fn kv_owners(model: &Model, kinds: &[LayerKind]) -> Result<Vec<usize>, ModelError> {
    let layers = kinds.len();
    let shared = match model.config.num_kv_shared_layers {
        None | Some(0) => return Ok((0..layers).collect()),
        Some(s) => s,
    };
    let first = match (layers as u64).checked_sub(shared) {
        Some(f) if f > 0 => f as usize,
        _ => {
            return Err(ModelError::field(
                &model.name,
                "num_kv_shared_layers",
                format!(
                    "{shared} is not below num_hidden_layers {layers} (some layer must own the cache)"
                ),
            ));
        }
    };
    (0..layers)
        .map(|i| {
            if i < first {
                return Ok(i);
            }
            (0..first)
                .rev()
                .find(|&j| kinds[j] == kinds[i])
                .ok_or_else(|| {
                    ModelError::field(
                        &model.name,
                        "num_kv_shared_layers",
                        format!(
                            "layer {i} ({} attention) shares the cache of an earlier {} layer, but layers 0..{first} have none",
                            kinds[i].key(),
                            kinds[i].key()
                        ),
                    )
                })
        })
        .collect()
}

/// Without `--kv-dtype` the engines cache in the model dtype; only bf16 is that default here.
fn check_model_dtype(model: &Model) -> Result<(), ModelError> {
    let c = &model.config;
    match c.model_dtype() {
        Some(d) if Dtype::from_name(d) != Some(Dtype::Bf16) => Err(ModelError::Unmodelled {
            name: model.name.clone(),
            field: if c.torch_dtype.is_some() { "torch_dtype" } else { "dtype" }.into(),
            value: format!("\"{d}\""),
            why: "the engines' default KV dtype is the model dtype; kvlayout models bf16 and fp8: pass --kv-dtype".into(),
        }),
        _ => Ok(()),
    }
}

/// The config field that made layer `i` of kind `kind`.
fn kind_field(c: &crate::ModelConfig, kind: LayerKind, i: usize) -> String {
    if c.layer_types.is_some() {
        return format!("layer_types[{i}]");
    }
    match kind {
        LayerKind::Sliding { .. } => "sliding_window",
        LayerKind::Chunked { .. } => "attention_chunk_size",
        LayerKind::Linear => "full_attention_interval",
        LayerKind::Kda => "linear_attn_config",
        LayerKind::RgLru => "block_types",
        LayerKind::Mamba | LayerKind::NoCache => "hybrid_override_pattern",
        LayerKind::Full => "num_hidden_layers",
        LayerKind::Compressed { .. } => "compress_ratios",
    }
    .to_string()
}

/// vLLM's hybrid allocator (`vllm/v1/core/kv_cache_utils.py` `unify_kv_cache_spec_page_size`):
/// every token buffer's page gets the bytes of the largest one by multiplying its tokens per
/// page; a page that does not divide the largest is refused (vLLM's padding for backends that
/// index by block stride is not modelled). State buffers keep their slot.
fn equal_page_bytes(
    name: &str,
    plans: &mut [BufferPlan],
    page_size_tokens: u64,
) -> Result<(), ModelError> {
    let page_bytes = |p: &BufferPlan| -> Result<u64, ModelError> {
        p.layout
            .page_payload_bytes(page_size_tokens)
            .map_err(|e| ModelError::field(name, format!("buffer {}", p.name), e.message()))
    };
    let mut max = 0;
    for p in plans.iter().filter(|p| p.attention != Attention::State) {
        max = max.max(page_bytes(p)?);
    }
    for p in plans.iter_mut().filter(|p| p.attention != Attention::State) {
        let own = page_bytes(p)?;
        if own == max {
            continue;
        }
        if !max.is_multiple_of(own) {
            return Err(ModelError::field(
                name,
                format!("buffer {}", p.name),
                format!(
                    "a {own}-byte page does not divide the largest page, {max} bytes, so vLLM cannot give it equal bytes by page size alone"
                ),
            ));
        }
        let tokens = page_size_tokens.checked_mul(max / own).ok_or_else(|| {
            ModelError::field(name, format!("buffer {}", p.name), "overflow: page tokens")
        })?;
        p.page_size_tokens = Some(tokens);
    }
    Ok(())
}

fn clone(b: &Built) -> Built {
    Built {
        format: b.format.clone(),
        layout: b.layout.clone(),
        shard: b.shard,
    }
}

/// The geometry of `plans`: v1 fields only for a model whose layers are all full attention
/// and no `--tp` (the same file and fingerprint as before v2); otherwise each buffer carries
/// its `attention`, `layer_ids` and `shard` (`kvlayout.geometry/v2`).
pub(crate) fn geometry(
    name: &str,
    model_layers: u64,
    title: String,
    plans: &[BufferPlan],
    opts: &Options,
) -> Result<PoolGeometry, ModelError> {
    // Layer ids are written for a hybrid, and for any pool where a buffer does not serve every
    // layer (DeciLM no-op layers, Gemma KV sharing, per-layer head counts).
    let hybrid = plans.iter().any(|p| p.attention != Attention::Full)
        || plans
            .iter()
            .any(|p| p.layer_ids.iter().copied().ne(0..model_layers));
    let mut buffers = Vec::with_capacity(plans.len());
    for p in plans {
        let mut b = BufferGeometry::new(p.name.clone(), p.layers(), p.layout.clone())
            .with_attention(p.attention);
        if hybrid {
            let ids = p
                .layer_ids
                .iter()
                .map(|&i| u32::try_from(i))
                .collect::<Result<Vec<u32>, _>>()
                .map_err(|_| ModelError::field(name, "num_hidden_layers", "a layer id over u32"))?;
            b = b.with_layer_ids(ids);
        }
        if let Some(s) = p.shard {
            b = b.with_shard(s.geometry());
        }
        if let Some(t) = p.page_size_tokens {
            b = b.with_page_size_tokens(t);
        }
        if p.compress_ratio != 1 {
            b = b.with_compress_ratio(p.compress_ratio);
        }
        buffers.push(b);
    }
    let geometry = PoolGeometry {
        name: title,
        page_size_tokens: opts.page_size_tokens,
        pages: opts.pages,
        memory_layout: MemoryLayout::LayerFirst,
        buffers,
    };
    if let Err(source) = geometry.validate() {
        return Err(
            page_size_at_fault(name, &geometry, &source).unwrap_or(ModelError::Geometry {
                name: name.to_string(),
                source,
            }),
        );
    }
    Ok(geometry)
}

/// The error of a geometry refused for its page size alone (one page of that size is refused,
/// one page of 1 token is not: `page_size_tokens` 2^64 - 1 overflows a page's bytes), blamed
/// on `page_size_tokens` with its value, so a caller can name its flag; `None` otherwise (a
/// page count that overflows the pool's bytes stays the geometry's error).
fn page_size_at_fault(
    name: &str,
    geometry: &PoolGeometry,
    source: &GeometryError,
) -> Option<ModelError> {
    let one_page = |page_size_tokens| PoolGeometry {
        page_size_tokens,
        pages: 1,
        ..geometry.clone()
    };
    let page_size = geometry.page_size_tokens;
    if page_size <= 1 || one_page(page_size).validate().is_ok() || one_page(1).validate().is_err() {
        return None;
    }
    Some(ModelError::field(
        name,
        "page_size_tokens",
        format!(
            "{page_size} gives an invalid pool: {}: {}",
            source.field, source.problem
        ),
    ))
}
