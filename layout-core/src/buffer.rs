//! One component buffer of a pool, and what `kvlayout.geometry/v2` says about it: its own page
//! size, what it keeps of a request (every token, a sliding window, a local chunk, or a
//! fixed-size state slot), the model layers it serves, and the tensor-parallel shard it holds.
//!
//! Sources of the v2 kinds: vLLM's hybrid KV-cache manager gives each KV-cache group its own
//! spec and block size (`vllm/v1/kv_cache_interface.py`: `FullAttentionSpec`,
//! `SlidingWindowSpec`, `ChunkedLocalAttentionSpec`, `MambaSpec`); SGLang keeps sliding-window
//! layers in a separate pool (`python/sglang/srt/mem_cache/swa_memory_pool.py`) and recurrent
//! state per request (`python/sglang/srt/mem_cache/memory_pool.py`, `MambaPool`).

use std::borrow::Cow;
use std::fmt;

use crate::geometry::{GeometryError, buffer_path};
use crate::layout::TokenLayout;
use crate::section::cow_str;

/// What a buffer keeps of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Attention {
    /// Every token (the v1 meaning; the default).
    #[default]
    Full,
    /// At most the last `window_tokens` tokens of a request (gpt-oss, Gemma 3 local layers).
    SlidingWindow {
        /// Window length W in tokens (at least 1).
        window_tokens: u64,
    },
    /// Chunked local attention: at most `chunk_tokens` tokens (Llama 4 local layers).
    Chunked {
        /// Chunk length C in tokens (at least 1).
        chunk_tokens: u64,
    },
    /// Recurrent / linear-attention / Mamba state: one fixed-size slot per request, no token
    /// axis. The pool's `pages` counts slots; the sections give one slot's contents.
    State,
}

impl Attention {
    /// Stable code hashed by the fingerprints (never renumber): 1 full, 2 sliding window,
    /// 3 chunked, 4 state.
    pub const fn code(self) -> u8 {
        match self {
            Attention::Full => 1,
            Attention::SlidingWindow { .. } => 2,
            Attention::Chunked { .. } => 3,
            Attention::State => 4,
        }
    }

    /// W or C; 0 for `full` and `state`.
    pub const fn tokens(self) -> u64 {
        match self {
            Attention::SlidingWindow { window_tokens } => window_tokens,
            Attention::Chunked { chunk_tokens } => chunk_tokens,
            Attention::Full | Attention::State => 0,
        }
    }

    /// Short name: `full`, `sliding`, `chunked`, `state` (the `--totals` keys use these).
    pub const fn kind(self) -> &'static str {
        match self {
            Attention::Full => "full",
            Attention::SlidingWindow { .. } => "sliding",
            Attention::Chunked { .. } => "chunked",
            Attention::State => "state",
        }
    }
}

impl fmt::Display for Attention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Attention::Full => f.write_str("full"),
            Attention::SlidingWindow { window_tokens } => {
                write!(f, "sliding_window_tokens {window_tokens}")
            }
            Attention::Chunked { chunk_tokens } => write!(f, "chunk_tokens {chunk_tokens}"),
            Attention::State => f.write_str("state"),
        }
    }
}

/// How a tensor-parallel rank holds a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShardSplit {
    /// KV heads split across ranks: every section's first shape entry holds this rank's
    /// `heads_total / tp_size` heads, `[rank * H / N, (rank + 1) * H / N)`.
    Heads {
        /// Heads of the whole (unsharded) buffer, H.
        heads_total: u64,
    },
    /// Every rank holds the whole buffer (an MLA latent).
    Replicated,
}

/// A tensor-parallel rank's part of a buffer (`"shard"` in a v2 file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Shard {
    /// Tensor-parallel size N (at least 1).
    pub tp_size: u64,
    /// This rank, `0..tp_size`.
    pub rank: u64,
    /// Heads split or replicated.
    pub split: ShardSplit,
}

impl Shard {
    /// Rank `rank` of `tp_size` holding `heads_total / tp_size` of the heads.
    pub const fn heads(tp_size: u64, rank: u64, heads_total: u64) -> Shard {
        Shard {
            tp_size,
            rank,
            split: ShardSplit::Heads { heads_total },
        }
    }

    /// Rank `rank` of `tp_size` holding the whole buffer.
    pub const fn replicated(tp_size: u64, rank: u64) -> Shard {
        Shard {
            tp_size,
            rank,
            split: ShardSplit::Replicated,
        }
    }

    /// `heads_total` for a heads split, else `None`.
    pub const fn heads_total(self) -> Option<u64> {
        match self.split {
            ShardSplit::Heads { heads_total } => Some(heads_total),
            ShardSplit::Replicated => None,
        }
    }

    /// Stable split code hashed by the fingerprints: 1 heads, 2 replicated.
    pub const fn split_code(self) -> u8 {
        match self.split {
            ShardSplit::Heads { .. } => 1,
            ShardSplit::Replicated => 2,
        }
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tp_size {} rank {} ", self.tp_size, self.rank)?;
        match self.split {
            ShardSplit::Heads { heads_total } => write!(f, "split heads of {heads_total}"),
            ShardSplit::Replicated => f.write_str("replicated"),
        }
    }
}

/// One component buffer of a pool (MLA latent, index-K, K, V, a state slot, ...).
///
/// Build one with [`BufferGeometry::new`] and the `with_*` methods; the v2 fields default to
/// the v1 meaning (pool page size, every token kept, layers `0..layers`, unsharded).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BufferGeometry {
    /// Buffer name; compared between geometries (the set of names must match).
    pub name: Cow<'static, str>,
    /// Layers holding this buffer (index-K may live in only some layers).
    pub layers: u64,
    /// Token layout and page arrangement.
    pub layout: TokenLayout,
    /// v2: tokens per page of this buffer, overriding the pool's (vLLM gives hybrid groups
    /// different block sizes so their pages have equal bytes). Not allowed on a `state` buffer.
    pub page_size_tokens: Option<u64>,
    /// v2: what the buffer keeps of a request; [`Attention::Full`] by default.
    pub attention: Attention,
    /// v2: the model layers this buffer serves (length = `layers`, no repeats).
    pub layer_ids: Option<Vec<u32>>,
    /// v2: the tensor-parallel shard this pool holds.
    pub shard: Option<Shard>,
}

impl BufferGeometry {
    /// A v1 buffer: `layers` layers of `layout`, every v2 field at its default.
    pub fn new(name: impl Into<Cow<'static, str>>, layers: u64, layout: TokenLayout) -> Self {
        BufferGeometry {
            name: name.into(),
            layers,
            layout,
            page_size_tokens: None,
            attention: Attention::Full,
            layer_ids: None,
            shard: None,
        }
    }

    /// With its own page size in tokens.
    pub fn with_page_size_tokens(mut self, page_size_tokens: u64) -> Self {
        self.page_size_tokens = Some(page_size_tokens);
        self
    }

    /// With what it keeps of a request.
    pub fn with_attention(mut self, attention: Attention) -> Self {
        self.attention = attention;
        self
    }

    /// With the model layers it serves.
    pub fn with_layer_ids(mut self, layer_ids: Vec<u32>) -> Self {
        self.layer_ids = Some(layer_ids);
        self
    }

    /// With a tensor-parallel shard.
    pub fn with_shard(mut self, shard: Shard) -> Self {
        self.shard = Some(shard);
        self
    }

    /// The name as `&str`.
    pub const fn name(&self) -> &str {
        cow_str(&self.name)
    }

    /// Tokens per page of this buffer in a pool of `pool_page_size_tokens`: 1 for a `state`
    /// buffer (a page is one slot), else the buffer's own page size or the pool's.
    pub const fn effective_page_size_tokens(&self, pool_page_size_tokens: u64) -> u64 {
        if let Attention::State = self.attention {
            return 1;
        }
        match self.page_size_tokens {
            Some(p) => p,
            None => pool_page_size_tokens,
        }
    }

    /// The layer ids as a slice (`None` when not given).
    pub const fn layer_ids(&self) -> Option<&[u32]> {
        match &self.layer_ids {
            Some(v) => Some(v.as_slice()),
            None => None,
        }
    }

    /// Whether any v2 field differs from the v1 meaning in a pool of `pool_page_size_tokens`
    /// (a page size equal to the pool's and `full` attention are the v1 meaning). Such a
    /// buffer is hashed with the v2 buffer stream (see [`crate::fingerprint`]).
    pub const fn has_v2_fields(&self, pool_page_size_tokens: u64) -> bool {
        let page = match self.page_size_tokens {
            Some(p) => p != pool_page_size_tokens,
            None => false,
        };
        let attention = !matches!(self.attention, Attention::Full);
        let sections = self.layout.sections();
        let mut order = false;
        let mut i = 0;
        while i < sections.len() {
            if sections[i].order().is_some() {
                order = true;
            }
            i += 1;
        }
        page || attention || self.layer_ids.is_some() || self.shard.is_some() || order
    }

    /// Whether writing this buffer needs `kvlayout.geometry/v2`: a v2 field is set (even to a
    /// value equal to the default) or a section uses a v2 dtype.
    pub fn needs_v2_file(&self) -> bool {
        self.page_size_tokens.is_some()
            || self.attention != Attention::Full
            || self.layer_ids.is_some()
            || self.shard.is_some()
            || self
                .layout
                .sections()
                .iter()
                .any(|s| s.order().is_some() || s.dtype.is_v2())
    }
}

impl BufferGeometry {
    /// The v2 rules of buffer `index`: a page size of at least 1 and none on a `state` buffer;
    /// a window or chunk of at least 1 token; `layer_ids` of length `layers` without repeats;
    /// a shard with `tp_size` at least 1, `rank < tp_size`, and for a heads split
    /// `heads_total` divisible by `tp_size` with every section's first shape entry equal to
    /// `heads_total / tp_size` and one head of every section filling whole bytes.
    pub(crate) fn check_v2(&self, index: usize) -> Result<(), GeometryError> {
        let path = buffer_path(index, self);
        if let Some(p) = self.page_size_tokens {
            if p == 0 {
                return Err(GeometryError::new(
                    format!("{path}.page_size_tokens"),
                    "must be at least 1, got 0",
                ));
            }
            if self.attention == Attention::State {
                return Err(GeometryError::new(
                    format!("{path}.page_size_tokens"),
                    format!("a state buffer has no token axis (a page is one slot), got {p}"),
                ));
            }
        }
        match self.attention {
            Attention::SlidingWindow { window_tokens: 0 } => {
                return Err(GeometryError::new(
                    format!("{path}.attention.sliding_window_tokens"),
                    "must be at least 1, got 0",
                ));
            }
            Attention::Chunked { chunk_tokens: 0 } => {
                return Err(GeometryError::new(
                    format!("{path}.attention.chunk_tokens"),
                    "must be at least 1, got 0",
                ));
            }
            _ => {}
        }
        if let Some(ids) = &self.layer_ids {
            if ids.len() as u64 != self.layers {
                return Err(GeometryError::new(
                    format!("{path}.layer_ids"),
                    format!("{} ids for {} layers", ids.len(), self.layers),
                ));
            }
            let mut seen = std::collections::HashSet::with_capacity(ids.len());
            for &id in ids {
                if !seen.insert(id) {
                    return Err(GeometryError::new(
                        format!("{path}.layer_ids"),
                        format!("layer {id} listed twice"),
                    ));
                }
            }
        }
        if let Some(shard) = self.shard {
            let f = format!("{path}.shard");
            if shard.tp_size == 0 {
                return Err(GeometryError::new(
                    format!("{f}.tp_size"),
                    "must be at least 1, got 0",
                ));
            }
            if shard.rank >= shard.tp_size {
                return Err(GeometryError::new(
                    format!("{f}.rank"),
                    format!(
                        "rank {} out of range for tp_size {}",
                        shard.rank, shard.tp_size
                    ),
                ));
            }
            if let ShardSplit::Heads { heads_total } = shard.split {
                if heads_total == 0 || heads_total % shard.tp_size != 0 {
                    return Err(GeometryError::new(
                        format!("{f}.heads_total"),
                        format!(
                            "heads_total {heads_total} must be at least 1 and divisible by tp_size {}",
                            shard.tp_size
                        ),
                    ));
                }
                let local = heads_total / shard.tp_size;
                for (k, s) in self.layout.sections().iter().enumerate() {
                    let first = s.shape().first().copied().unwrap_or(0);
                    if first != local {
                        return Err(GeometryError::new(
                            format!("{path}.sections[{k}] ({}).shape", s.name()),
                            format!(
                                "split heads: the first entry is this rank's heads, heads_total {heads_total} / tp_size {} = {local}, got {first}",
                                shard.tp_size
                            ),
                        ));
                    }
                    // A rank's heads are a byte range only when one head fills whole bytes:
                    // 3 e2m1 per head is 12 bits, and a copy planned in bytes would floor it.
                    // Overflow is left to the layout's own check, which names it.
                    let per_head_elems = s
                        .shape()
                        .iter()
                        .skip(1)
                        .try_fold(1u64, |a, &d| a.checked_mul(d));
                    let bits = s.dtype.bits();
                    if let Some(per_head_elems) = per_head_elems
                        && let Some(head_bits) = per_head_elems.checked_mul(bits)
                        && head_bits % 8 != 0
                    {
                        return Err(GeometryError::new(
                            format!("{path}.sections[{k}] ({}).shape", s.name()),
                            format!(
                                "split heads: one head is {per_head_elems} elems x {bits} bits ({}) = {head_bits} bits, \
                                 not whole bytes, so a rank's heads are no byte range",
                                s.dtype.name()
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}
