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
use crate::section::{Section, cow_str};

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
    /// `heads_total / tp_size` heads, `[rank * H / N, (rank + 1) * H / N)`. With fewer heads
    /// than ranks (`H < N`, `N` a multiple of `H`: Qwen3.5's 2 KV heads at TP 4) each head is
    /// replicated on `N / H` ranks and rank `r` holds the one head `r / (N / H)` (vLLM's
    /// `QKVParallelLinear`, `tp_rank // num_kv_head_replicas`; SGLang the same): the head axis
    /// is then 1.
    Heads {
        /// Heads of the whole (unsharded) buffer, H: the model's KV head count (never heads
        /// x replicas); with `split_groups`, the sum of the groups.
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

    /// Ranks holding the same heads: `tp_size / heads_total` when a heads split has fewer
    /// heads than ranks, else 1 (also for a replicated buffer, whose every rank holds all).
    pub const fn replicas(self) -> u64 {
        match self.split {
            ShardSplit::Heads { heads_total } if heads_total > 0 && heads_total < self.tp_size => {
                self.tp_size / heads_total
            }
            _ => 1,
        }
    }

    /// Whether heads are split with fewer heads than ranks (each head on
    /// [`Shard::replicas`] ranks).
    pub const fn replicated_heads(self) -> bool {
        self.replicas() > 1
    }

    /// Heads `[first, first + count)` of `heads_total` this rank holds, for a heads split:
    /// `[r * H / N, (r + 1) * H / N)`, or the one head `r / replicas` when heads are
    /// replicated. `None` for a replicated buffer or a `tp_size` of 0.
    pub const fn heads_held(self) -> Option<(u64, u64)> {
        match self.split {
            ShardSplit::Heads { heads_total } => {
                if self.tp_size == 0 {
                    return None;
                }
                let replicas = self.replicas();
                if replicas > 1 {
                    let first = self.rank / replicas;
                    Some((first, first + 1))
                } else {
                    let local = heads_total / self.tp_size;
                    Some((self.rank * local, (self.rank + 1) * local))
                }
            }
            ShardSplit::Replicated => None,
        }
    }

    /// Heads on this rank: 1 when heads are replicated, else `heads_total / tp_size`; `None`
    /// for a replicated buffer.
    pub const fn local_heads(self) -> Option<u64> {
        match self.heads_held() {
            Some((lo, hi)) => Some(hi - lo),
            None => None,
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
            ShardSplit::Heads { heads_total } if self.replicated_heads() => write!(
                f,
                "split heads of {heads_total}, head {} on {} replicas",
                self.rank / self.replicas(),
                self.replicas()
            ),
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
    /// v3: the buffer stores one row per `compress_ratio` tokens (R, at least 1; 1 is every
    /// token, the v1/v2 meaning). Its sections describe one row; a page of `P` tokens holds
    /// `P / R` rows (R must divide P) and its payload is `(P / R) x row bytes`. DeepSeek-V4's
    /// C4 / C128 compressed KV and C4 indexer (SGLang `deepseek_v4_memory_pool.py`: "page =
    /// page_size // ratio rows").
    pub compress_ratio: u64,
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
            compress_ratio: 1,
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

    /// Storing one row per `compress_ratio` tokens (v3).
    pub fn with_compress_ratio(mut self, compress_ratio: u64) -> Self {
        self.compress_ratio = compress_ratio;
        self
    }

    /// Rows in a page of this buffer in a pool of `pool_page_size_tokens`: the effective page
    /// size divided by `compress_ratio` (the page size itself when R is 1; 1 for a `state`
    /// slot). 0 when R is 0, which validation refuses.
    pub const fn rows_per_page(&self, pool_page_size_tokens: u64) -> u64 {
        let tokens = self.effective_page_size_tokens(pool_page_size_tokens);
        match tokens.checked_div(self.compress_ratio) {
            Some(rows) => rows,
            None => 0,
        }
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

    /// Whether any v3 field differs from the v1/v2 meaning: a `compress_ratio` other than 1, a
    /// section with `split_groups`, or heads replicated over ranks (`heads_total < tp_size`,
    /// invalid before v3). Such a buffer is hashed with the v3 buffer stream (see
    /// [`crate::fingerprint`]).
    pub const fn has_v3_fields(&self) -> bool {
        if self.compress_ratio != 1 {
            return true;
        }
        if let Some(s) = self.shard
            && s.replicated_heads()
        {
            return true;
        }
        let sections = self.layout.sections();
        let mut i = 0;
        while i < sections.len() {
            if sections[i].split_groups.is_some() {
                return true;
            }
            i += 1;
        }
        false
    }

    /// Whether writing this buffer needs `kvlayout.geometry/v3`: a v3 field is used
    /// ([`BufferGeometry::has_v3_fields`]). A `compress_ratio` of 1 is the default and is not
    /// written.
    pub fn needs_v3_file(&self) -> bool {
        self.has_v3_fields()
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
    ///
    /// The checks run in this order and the first failing one is returned: page size,
    /// `compress_ratio`, `split_groups` without a heads split, attention tokens, layer ids,
    /// shard.
    pub(crate) fn check_v2(&self, index: usize) -> Result<(), GeometryError> {
        let path = buffer_path(index, self);
        self.check_page_size_tokens(&path)?;
        self.check_compress_ratio(&path)?;
        self.check_split_groups_need_heads_split(&path)?;
        self.check_attention_tokens(&path)?;
        self.check_layer_ids(&path)?;
        self.check_shard(&path)
    }

    /// A buffer's own page size: at least 1 token, and none on a `state` buffer (a page is one
    /// slot there).
    fn check_page_size_tokens(&self, path: &str) -> Result<(), GeometryError> {
        let Some(page_size_tokens) = self.page_size_tokens else {
            return Ok(());
        };
        if page_size_tokens == 0 {
            return Err(GeometryError::new(
                format!("{path}.page_size_tokens"),
                "must be at least 1, got 0",
            ));
        }
        if self.attention == Attention::State {
            return Err(GeometryError::new(
                format!("{path}.page_size_tokens"),
                format!(
                    "a state buffer has no token axis (a page is one slot), got {page_size_tokens}"
                ),
            ));
        }
        Ok(())
    }

    /// `split_groups` on a section only with a shard that splits heads: the first section
    /// that has them, when the shard is absent or replicated, is refused.
    fn check_split_groups_need_heads_split(&self, path: &str) -> Result<(), GeometryError> {
        if let Some(Shard {
            split: ShardSplit::Heads { .. },
            ..
        }) = self.shard
        {
            return Ok(());
        }
        for (k, section) in self.layout.sections().iter().enumerate() {
            if let Some(groups) = section.split_groups() {
                let shard = match self.shard {
                    Some(shard) => shard.to_string(),
                    None => "absent".to_string(),
                };
                return Err(GeometryError::new(
                    format!("{path}.sections[{k}] ({}).split_groups", section.name()),
                    format!(
                        "split_groups {groups:?} need a shard with split \"heads\" (the buffer's shard is {shard})"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A sliding window or an attention chunk holds at least 1 token.
    fn check_attention_tokens(&self, path: &str) -> Result<(), GeometryError> {
        let field = match self.attention {
            Attention::SlidingWindow { window_tokens: 0 } => "sliding_window_tokens",
            Attention::Chunked { chunk_tokens: 0 } => "chunk_tokens",
            _ => return Ok(()),
        };
        Err(GeometryError::new(
            format!("{path}.attention.{field}"),
            "must be at least 1, got 0",
        ))
    }

    /// `layer_ids`: one id per layer of the buffer, no layer listed twice.
    fn check_layer_ids(&self, path: &str) -> Result<(), GeometryError> {
        let Some(layer_ids) = &self.layer_ids else {
            return Ok(());
        };
        if layer_ids.len() as u64 != self.layers {
            return Err(GeometryError::new(
                format!("{path}.layer_ids"),
                format!("{} ids for {} layers", layer_ids.len(), self.layers),
            ));
        }
        let mut seen = std::collections::HashSet::with_capacity(layer_ids.len());
        for &layer_id in layer_ids {
            if !seen.insert(layer_id) {
                return Err(GeometryError::new(
                    format!("{path}.layer_ids"),
                    format!("layer {layer_id} listed twice"),
                ));
            }
        }
        Ok(())
    }

    /// The shard: `tp_size` at least 1, `rank < tp_size`, and for a heads split a valid
    /// `heads_total` ([`check_heads_total`]) that every section's heads match
    /// ([`BufferGeometry::check_section_heads`]).
    fn check_shard(&self, path: &str) -> Result<(), GeometryError> {
        let Some(shard) = self.shard else {
            return Ok(());
        };
        let shard_path = format!("{path}.shard");
        if shard.tp_size == 0 {
            return Err(GeometryError::new(
                format!("{shard_path}.tp_size"),
                "must be at least 1, got 0",
            ));
        }
        if shard.rank >= shard.tp_size {
            return Err(GeometryError::new(
                format!("{shard_path}.rank"),
                format!(
                    "rank {} out of range for tp_size {}",
                    shard.rank, shard.tp_size
                ),
            ));
        }
        if let ShardSplit::Heads { heads_total } = shard.split {
            check_heads_total(&shard_path, heads_total, shard.tp_size)?;
            self.check_section_heads(path, shard, heads_total)?;
        }
        Ok(())
    }

    /// For a heads split of a valid `heads_total`: every section, in order, leads with this
    /// rank's heads, has valid `split_groups` when it has them ([`check_split_groups`]), and
    /// one head of it fills whole bytes ([`check_head_whole_bytes`]).
    fn check_section_heads(
        &self,
        path: &str,
        shard: Shard,
        heads_total: u64,
    ) -> Result<(), GeometryError> {
        let tp_size = shard.tp_size;
        let local_heads = shard.local_heads().unwrap_or(0);
        let rule = if shard.replicated_heads() {
            format!(
                "heads_total {heads_total} < tp_size {tp_size}: {} replicas per head, one head per rank",
                shard.replicas()
            )
        } else {
            format!("heads_total {heads_total} / tp_size {tp_size} = {local_heads}")
        };
        for (k, section) in self.layout.sections().iter().enumerate() {
            let first_entry_heads = section.shape().first().copied().unwrap_or(0);
            if first_entry_heads != local_heads {
                return Err(GeometryError::new(
                    format!("{path}.sections[{k}] ({}).shape", section.name()),
                    format!(
                        "split heads: the first entry is this rank's heads, {rule}, got {first_entry_heads}"
                    ),
                ));
            }
            if let Some(groups) = section.split_groups() {
                check_split_groups(path, k, section.name(), groups, heads_total, tp_size)?;
            }
            check_head_whole_bytes(path, k, section)?;
        }
        Ok(())
    }
}

/// A heads split's `heads_total` (at `shard_path.heads_total`): at least 1, and either
/// divisible by `tp_size` or, when below it, dividing it (each head on the same number of
/// ranks: replicated heads).
fn check_heads_total(
    shard_path: &str,
    heads_total: u64,
    tp_size: u64,
) -> Result<(), GeometryError> {
    if heads_total == 0 {
        return Err(GeometryError::new(
            format!("{shard_path}.heads_total"),
            format!("must be at least 1, got 0 (tp_size {tp_size})"),
        ));
    }
    if heads_total >= tp_size && !heads_total.is_multiple_of(tp_size) {
        return Err(GeometryError::new(
            format!("{shard_path}.heads_total"),
            format!(
                "heads_total {heads_total} must be divisible by tp_size {tp_size} \
                 (or smaller than it, with tp_size a multiple: replicated heads)"
            ),
        ));
    }
    if heads_total < tp_size && !tp_size.is_multiple_of(heads_total) {
        return Err(GeometryError::new(
            format!("{shard_path}.heads_total"),
            format!(
                "heads_total {heads_total} is below tp_size {tp_size}, which is not a multiple of it: \
                 each head must sit on the same number of ranks"
            ),
        ));
    }
    Ok(())
}

/// One head of section `k` (its shape after the first entry, in its dtype) fills whole bytes:
/// a rank's heads are a byte range only then. 3 e2m1 per head is 12 bits, and a copy planned
/// in bytes would floor it. Overflow is left to the layout's own check, which names it.
fn check_head_whole_bytes(path: &str, k: usize, section: &Section) -> Result<(), GeometryError> {
    let per_head_elems = section
        .shape()
        .iter()
        .skip(1)
        .try_fold(1u64, |a, &d| a.checked_mul(d));
    let elem_bits = section.dtype.bits();
    if let Some(per_head_elems) = per_head_elems
        && let Some(head_bits) = per_head_elems.checked_mul(elem_bits)
        && head_bits % 8 != 0
    {
        return Err(GeometryError::new(
            format!("{path}.sections[{k}] ({}).shape", section.name()),
            format!(
                "split heads: one head is {per_head_elems} elems x {elem_bits} bits ({}) = {head_bits} bits, \
                 not whole bytes, so a rank's heads are no byte range",
                section.dtype.name()
            ),
        ));
    }
    Ok(())
}

impl BufferGeometry {
    /// `compress_ratio` at least 1, dividing the effective page size, and 1 on a `state`
    /// buffer (a slot has no token axis).
    fn check_compress_ratio(&self, path: &str) -> Result<(), GeometryError> {
        let r = self.compress_ratio;
        let field = format!("{path}.compress_ratio");
        if r == 0 {
            return Err(GeometryError::new(field, "must be at least 1, got 0"));
        }
        if r == 1 {
            return Ok(());
        }
        if self.attention == Attention::State {
            return Err(GeometryError::new(
                field,
                format!(
                    "a state buffer has no token axis (a page is one slot), got compress_ratio {r}"
                ),
            ));
        }
        // The pool's page size is checked by the pool; here only a buffer's own one is known.
        if let Some(p) = self.page_size_tokens
            && p % r != 0
        {
            return Err(GeometryError::new(
                field,
                format!(
                    "compress_ratio {r} does not divide page_size_tokens {p}: a page holds whole rows"
                ),
            ));
        }
        Ok(())
    }
}

/// `split_groups` of section `k`: every group at least 1 and divisible by `tp_size`, summing
/// to `heads_total` (the section's whole-model leading axis).
fn check_split_groups(
    path: &str,
    k: usize,
    name: &str,
    groups: &[u64],
    heads_total: u64,
    tp_size: u64,
) -> Result<(), GeometryError> {
    let field = format!("{path}.sections[{k}] ({name}).split_groups");
    if groups.is_empty() {
        return Err(GeometryError::new(
            field,
            "must hold at least one group, got []",
        ));
    }
    let mut sum = 0u64;
    for (g, &size) in groups.iter().enumerate() {
        if size == 0 || size % tp_size != 0 {
            return Err(GeometryError::new(
                format!("{field}[{g}]"),
                format!(
                    "group {g} of {size} entries must be at least 1 and divisible by tp_size {tp_size}"
                ),
            ));
        }
        sum = sum.checked_add(size).ok_or_else(|| {
            GeometryError::new(
                field.clone(),
                "overflow: the groups' sum does not fit in 64 bits",
            )
        })?;
    }
    if sum != heads_total {
        return Err(GeometryError::new(
            field,
            format!(
                "groups {groups:?} sum to {sum}, the shard's heads_total is {heads_total} \
                 (with split_groups, heads_total is the whole-model leading axis)"
            ),
        ));
    }
    Ok(())
}
