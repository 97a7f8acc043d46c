//! Stable 64-bit layout fingerprints, computable in `const` context: `pool`, `storage`, and
//! `token` per buffer, one per compare level ([`crate::Level`]).
//!
//! Algorithm (reproducible in any language; `layout-core/tests/fingerprint_reference.py` does
//! the pool and token streams of v1, v2 and v3 files in Python's standard library): FNV-1a 64 (offset basis `0xcbf29ce484222325`, prime
//! `0x100000001b3`) over a canonical byte stream. `u64(x)`: `x` as 8 bytes little-endian;
//! `str(s)`: `u64(byte length)` then the UTF-8 bytes; `FNV(...)`: a fresh hash from the offset
//! basis over the items in order. Codes: dtype [`crate::Dtype::code`] (f32 1, f16 2, bf16 3,
//! f8e4m3 4, f8e4m3fnuz 5, f8e5m2 6, f8e5m2fnuz 7, ue8m0 8, u8 9, i8 10, f4e2m1 11, i32 12,
//! i64 13); arrangement 1 token_major, 2 section_major, 3 head_major, 4 planes; attention
//! [`crate::Attention::code`] 1 full, 2 sliding window, 3 chunked, 4 state; split 1 heads,
//! 2 replicated; memory layout 1 layer_first, 2 page_first, 3 page_first_direct, 4 page_head,
//! 5 layer_head, 6 page_unified, 7 page_head_token.
//!
//! - Layout core `core(L)` = `FNV(str("kvlayout.layout/v1"), u64(arrangement code),
//!   [planes only: u64(plane count), per plane u64(length) and u64(each section index)],
//!   u64(section count), per section: u64(dtype code), u64(rank), u64(each dimension), then
//!   u64(0) for a value section or u64(1), u64(scaled section index), u64(block_elems))`.
//!   Section labels and orders are not in it.
//! - [`TokenLayout::fingerprint`] (a layout alone, e.g. a built-in format): `core(L)`
//!   continued with `u64(page_align_bytes)`, `u64(page_stride_bytes)` (0 when absent).
//! - Buffer hash `h_b`, for a buffer with only v1 content (no own page size other than the
//!   pool's, `full` attention, no `layer_ids`, no `shard`, no section `order`):
//!   `FNV(str("kvlayout.buffer/v1"), str(name), u64(layers), u64(page stride bytes),
//!   u64(core(L)))`; the stride at the pool's page size.
//! - `h_b` for a buffer with a v2 field: `FNV(str("kvlayout.buffer/v2"), str(name),
//!   u64(layers), u64(effective page size: own, else the pool's, 1 for state),
//!   u64(page stride bytes at that size), u64(core(L)), u64(attention code), u64(W or C, else 0),
//!   layer ids: u64(0) | u64(1) u64(count) u64(each id), shard: u64(0) | u64(1) u64(tp_size)
//!   u64(rank) u64(split code) u64(heads_total, 0 when replicated), then per section: u64(0) when
//!   linear | u64(1) str(order))`. A file's `"order": "linear"` is linear (read as absent), so
//!   a buffer whose only v2 field it is hashes as v1 content.
//! - `h_b` for a buffer with a v3 field (`compress_ratio` other than 1, a section with
//!   `split_groups`, or heads replicated over ranks: `heads_total < tp_size`):
//!   `FNV(str("kvlayout.buffer/v3"), str(name), u64(layers), u64(effective page size in
//!   tokens), u64(compress_ratio R), u64(page stride bytes at page size / R rows),
//!   u64(core(L)), u64(attention code), u64(W or C, else 0), layer ids as in v2, shard as in
//!   v2, orders as in v2, then per section: u64(0) without split groups | u64(1) u64(group
//!   count) u64(each group's entries))`. Such a buffer was invalid before v3, so no v1/v2
//!   value changes. Example (`layout-core/tests/fingerprint_reference.py` and
//!   `tests/fingerprint_stream.rs` recompute it): DeepSeek-V4's C4 indexer K alone (shared
//!   case 28 A), 21 layers of section-major 128 e4m3 + 1 f32 per 128, R 4, page 64 tokens =
//!   16 rows, stride 16 x 132 = 2,112 B: pool fingerprint `0x4f8f39636bf81db6`.
//! - [`PoolGeometry::fingerprint`] (`pool`; pairs, storage keys, handshakes):
//!   `FNV(str("kvlayout.pool/v1"), u64(page_size_tokens, or 0 when every buffer is `state`:
//!   slots have no token axis, so the pool's page size is no part of them), u64(buffer count),
//!   u64(sum of h_b wrapping mod 2^64))`. The sum makes the buffer set order-free, as the
//!   compatibility check is; `name`, `pages` and `memory_layout` are not hashed. A v1 file's
//!   pool fingerprint is the same under v2 (DeepSeek-V3.2 fp8 + fp8 index-K:
//!   `0xeb019e4f84ee0658`).
//! - [`PoolGeometry::storage_fingerprint`]: `FNV(str("kvlayout.storage/v1"), u64(pool
//!   fingerprint), u64(memory layout code))`, continued with `u64(heads_per_group)` for
//!   `page_unified` (the only layout with a parameter; the others' values are unchanged).
//! - Token fingerprint of one buffer ([`token_hash`]): `FNV(str("kvlayout.token/v1"),
//!   str(name), u64(layers), u64(attention code), u64(W or C), layer ids as above,
//!   u64(arrangement code), [planes as in core(L)], u64(effective page size for section_major
//!   and planes, else 0), u64(heads_total for a heads split, else 0), u64(section count),
//!   per section: u64(dtype code), u64(rank of the per-head shape), u64(each of its dimensions)
//!   — the shape without its first entry on a heads split —, the scale items as in core(L),
//!   then the orders as in the v2 buffer hash)`. A buffer with a v3 field (as above) is hashed
//!   with `str("kvlayout.token/v3")` in place of `str("kvlayout.token/v1")`, the same items,
//!   then `u64(compress_ratio)`, `u64(1) u64(the head held)` when heads are replicated over
//!   ranks (rank / (tp_size / heads_total)) else `u64(0)`, then the split groups as in the v3
//!   buffer hash.
//!
//! Equal fingerprints at a level imply compatible at that level. The converse holds except for
//! `layer_ids`, which the check compares only when both sides give them and the fingerprints
//! hash whenever present (a page of other layers must never be read under a storage key), and
//! at `token` level for a plain heads split against replicated heads (TP 2 rank 1 and TP 4 rank
//! 2 of 2 KV heads both hold head 1: compatible, yet only the replicated side hashes its head).

use crate::buffer::{Attention, BufferGeometry};
use crate::error::{LayoutError, tri};
use crate::geometry::{MemoryLayout, PoolGeometry};
use crate::layout::{Arrangement, TokenLayout};
use crate::section::{Section, cow_slice};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a over `bytes`, continuing from `h`.
pub const fn fnv_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

/// Feeds `v` as 8 little-endian bytes.
pub const fn fnv_u64(h: u64, v: u64) -> u64 {
    fnv_bytes(h, &v.to_le_bytes())
}

/// Feeds a string as its length then its bytes.
pub const fn fnv_str(h: u64, s: &str) -> u64 {
    fnv_bytes(fnv_u64(h, s.len() as u64), s.as_bytes())
}

/// The arrangement's code, then (for planes) the plane count and each plane's length and
/// section indices: the same bytes in the layout, pool and token streams.
const fn fnv_arrangement(mut h: u64, layout: &TokenLayout) -> u64 {
    h = fnv_u64(h, layout.arrangement.code() as u64);
    let planes = layout.arrangement.planes();
    if !planes.is_empty() {
        h = fnv_u64(h, planes.len() as u64);
        let mut p = 0;
        while p < planes.len() {
            let plane = cow_slice(&planes[p]);
            h = fnv_u64(h, plane.len() as u64);
            let mut k = 0;
            while k < plane.len() {
                h = fnv_u64(h, plane[k] as u64);
                k += 1;
            }
            p += 1;
        }
    }
    h
}

/// The layout core hash: arrangement and sections (no labels, no alignment).
pub const fn layout_core_hash(layout: &TokenLayout) -> u64 {
    let mut h = fnv_str(FNV_OFFSET, "kvlayout.layout/v1");
    h = fnv_arrangement(h, layout);
    let sections = layout.sections();
    h = fnv_u64(h, sections.len() as u64);
    let mut i = 0;
    while i < sections.len() {
        let s = &sections[i];
        h = fnv_u64(h, s.dtype.code() as u64);
        let shape = s.shape();
        h = fnv_u64(h, shape.len() as u64);
        let mut d = 0;
        while d < shape.len() {
            h = fnv_u64(h, shape[d]);
            d += 1;
        }
        match s.scale {
            None => h = fnv_u64(h, 0),
            Some(rel) => {
                h = fnv_u64(h, 1);
                h = fnv_u64(h, rel.target as u64);
                h = fnv_u64(h, rel.block_elems);
            }
        }
        i += 1;
    }
    h
}

impl TokenLayout {
    /// Fingerprint of this layout alone: core hash, alignment and explicit stride.
    pub const fn fingerprint(&self) -> u64 {
        let mut h = layout_core_hash(self);
        h = fnv_u64(
            h,
            match self.page_align_bytes {
                Some(a) => a,
                None => 0,
            },
        );
        fnv_u64(
            h,
            match self.page_stride_bytes {
                Some(s) => s,
                None => 0,
            },
        )
    }
}

/// Hash of one v1 buffer of a pool: name, layers, page stride and the layout core hash.
///
/// # Errors
///
/// The layout's errors of [`TokenLayout::page_stride_bytes`]: an invalid layout, a zero page size,
/// or a stride that overflows (`LayoutError::Overflow`).
pub const fn buffer_hash(
    name: &str,
    layers: u64,
    layout: &TokenLayout,
    page_size_tokens: u64,
) -> Result<u64, LayoutError> {
    let stride = tri!(layout.page_stride_bytes(page_size_tokens));
    let mut h = fnv_str(FNV_OFFSET, "kvlayout.buffer/v1");
    h = fnv_str(h, name);
    h = fnv_u64(h, layers);
    h = fnv_u64(h, stride);
    Ok(fnv_u64(h, layout_core_hash(layout)))
}

/// Feeds `attention`: its code and W or C (0 for full and state).
const fn fnv_attention(h: u64, attention: Attention) -> u64 {
    fnv_u64(fnv_u64(h, attention.code() as u64), attention.tokens())
}

/// Feeds `layer_ids`: `0` when absent, else `1`, the count and each id.
const fn fnv_layer_ids(mut h: u64, ids: Option<&[u32]>) -> u64 {
    match ids {
        None => fnv_u64(h, 0),
        Some(ids) => {
            h = fnv_u64(fnv_u64(h, 1), ids.len() as u64);
            let mut i = 0;
            while i < ids.len() {
                h = fnv_u64(h, ids[i] as u64);
                i += 1;
            }
            h
        }
    }
}

/// Feeds each section's order: `0` when linear, else `1` and the name.
const fn fnv_orders(mut h: u64, sections: &[Section]) -> u64 {
    let mut i = 0;
    while i < sections.len() {
        h = match sections[i].order() {
            None => fnv_u64(h, 0),
            Some(o) => fnv_str(fnv_u64(h, 1), o),
        };
        i += 1;
    }
    h
}

/// Hash of a buffer with v2 fields (see the module docs); `pool_page_size_tokens` is the
/// pool's page size.
///
/// # Errors
///
/// As [`buffer_hash`], at the buffer's effective page size.
pub const fn buffer_hash_v2(
    b: &BufferGeometry,
    pool_page_size_tokens: u64,
) -> Result<u64, LayoutError> {
    let page = b.effective_page_size_tokens(pool_page_size_tokens);
    let stride = tri!(b.layout.page_stride_bytes(page));
    let mut h = fnv_str(FNV_OFFSET, "kvlayout.buffer/v2");
    h = fnv_str(h, b.name());
    h = fnv_u64(h, b.layers);
    h = fnv_u64(h, page);
    h = fnv_u64(h, stride);
    h = fnv_u64(h, layout_core_hash(&b.layout));
    h = fnv_attention(h, b.attention);
    h = fnv_layer_ids(h, b.layer_ids());
    h = fnv_shard(h, b.shard);
    Ok(fnv_orders(h, b.layout.sections()))
}

/// Feeds each section's split groups: `0` when absent, else `1`, the group count and each
/// group's whole-model entries.
const fn fnv_split_groups(mut h: u64, sections: &[Section]) -> u64 {
    let mut i = 0;
    while i < sections.len() {
        h = match sections[i].split_groups() {
            None => fnv_u64(h, 0),
            Some(groups) => {
                h = fnv_u64(fnv_u64(h, 1), groups.len() as u64);
                let mut g = 0;
                while g < groups.len() {
                    h = fnv_u64(h, groups[g]);
                    g += 1;
                }
                h
            }
        };
        i += 1;
    }
    h
}

/// Feeds a shard: `0` when absent, else `1`, tp_size, rank, split code, heads_total (0 when
/// replicated).
const fn fnv_shard(h: u64, shard: Option<crate::Shard>) -> u64 {
    match shard {
        None => fnv_u64(h, 0),
        Some(s) => {
            let h = fnv_u64(fnv_u64(fnv_u64(h, 1), s.tp_size), s.rank);
            let h = fnv_u64(h, s.split_code() as u64);
            fnv_u64(
                h,
                match s.heads_total() {
                    Some(t) => t,
                    None => 0,
                },
            )
        }
    }
}

/// Hash of a buffer with v3 fields (see the module docs): every v2 item, the compress ratio,
/// the page stride at `page size / R` rows, and the sections' split groups.
///
/// # Errors
///
/// As [`buffer_hash_v2`], plus a compress ratio that does not divide the page size
/// (`LayoutError::RatioDoesNotDivide`).
pub const fn buffer_hash_v3(
    b: &BufferGeometry,
    pool_page_size_tokens: u64,
) -> Result<u64, LayoutError> {
    let page = b.effective_page_size_tokens(pool_page_size_tokens);
    let pg = tri!(b.layout.page_geometry_compressed(page, b.compress_ratio));
    let mut h = fnv_str(FNV_OFFSET, "kvlayout.buffer/v3");
    h = fnv_str(h, b.name());
    h = fnv_u64(h, b.layers);
    h = fnv_u64(h, page);
    h = fnv_u64(h, b.compress_ratio);
    h = fnv_u64(h, pg.page_stride_bytes);
    h = fnv_u64(h, layout_core_hash(&b.layout));
    h = fnv_attention(h, b.attention);
    h = fnv_layer_ids(h, b.layer_ids());
    h = fnv_shard(h, b.shard);
    h = fnv_orders(h, b.layout.sections());
    Ok(fnv_split_groups(h, b.layout.sections()))
}

/// Combines a page size and the buffer hashes (in any order) into a pool fingerprint.
pub const fn pool_hash(page_size_tokens: u64, buffers: u64, buffer_hash_sum: u64) -> u64 {
    let mut h = fnv_str(FNV_OFFSET, "kvlayout.pool/v1");
    h = fnv_u64(h, page_size_tokens);
    h = fnv_u64(h, buffers);
    fnv_u64(h, buffer_hash_sum)
}

/// The `token`-level fingerprint of buffer `b` (see the module docs).
pub const fn token_hash(b: &BufferGeometry, pool_page_size_tokens: u64) -> u64 {
    let layout = &b.layout;
    let v3 = b.has_v3_fields();
    let mut h = fnv_str(
        FNV_OFFSET,
        if v3 {
            "kvlayout.token/v3"
        } else {
            "kvlayout.token/v1"
        },
    );
    h = fnv_str(h, b.name());
    h = fnv_u64(h, b.layers);
    h = fnv_attention(h, b.attention);
    h = fnv_layer_ids(h, b.layer_ids());
    h = fnv_arrangement(h, layout);
    let page_bound = matches!(
        layout.arrangement,
        Arrangement::SectionMajor | Arrangement::Planes(_)
    );
    h = fnv_u64(
        h,
        if page_bound {
            b.effective_page_size_tokens(pool_page_size_tokens)
        } else {
            0
        },
    );
    let heads_total = match b.shard {
        Some(s) => match s.heads_total() {
            Some(t) => t,
            None => 0,
        },
        None => 0,
    };
    h = fnv_u64(h, heads_total);
    let skip = if heads_total > 0 { 1 } else { 0 };
    let sections = layout.sections();
    h = fnv_u64(h, sections.len() as u64);
    let mut i = 0;
    while i < sections.len() {
        let s = &sections[i];
        h = fnv_u64(h, s.dtype.code() as u64);
        let shape = s.shape();
        let from = if shape.len() >= skip {
            skip
        } else {
            shape.len()
        };
        h = fnv_u64(h, (shape.len() - from) as u64);
        let mut d = from;
        while d < shape.len() {
            h = fnv_u64(h, shape[d]);
            d += 1;
        }
        match s.scale {
            None => h = fnv_u64(h, 0),
            Some(rel) => {
                h = fnv_u64(h, 1);
                h = fnv_u64(h, rel.target as u64);
                h = fnv_u64(h, rel.block_elems);
            }
        }
        i += 1;
    }
    h = fnv_orders(h, sections);
    if !v3 {
        return h;
    }
    h = fnv_u64(h, b.compress_ratio);
    // Replicated heads: the one head this rank holds (the level compares it).
    h = match b.shard {
        Some(s) if s.replicated_heads() => match s.heads_held() {
            Some((first, _)) => fnv_u64(fnv_u64(h, 1), first),
            None => fnv_u64(h, 0),
        },
        _ => fnv_u64(h, 0),
    };
    fnv_split_groups(h, sections)
}

impl PoolGeometry {
    /// The `pool` fingerprint: exactly the fields the `pool` level compares (see the module
    /// docs). For v1 content it is the v1 value.
    ///
    /// # Errors
    ///
    /// A buffer's [`buffer_hash`] / [`buffer_hash_v2`] / [`buffer_hash_v3`] error: an invalid
    /// layout, a zero page size, a compress ratio that does not divide it, or a page stride that
    /// overflows.
    pub const fn fingerprint(&self) -> Result<u64, LayoutError> {
        let buffers = self.buffers.as_slice();
        let mut sum = 0u64;
        let mut i = 0;
        while i < buffers.len() {
            let b = &buffers[i];
            let h = if b.has_v3_fields() {
                tri!(buffer_hash_v3(b, self.page_size_tokens))
            } else if b.has_v2_fields(self.page_size_tokens) {
                tri!(buffer_hash_v2(b, self.page_size_tokens))
            } else {
                tri!(buffer_hash(
                    b.name(),
                    b.layers,
                    &b.layout,
                    self.page_size_tokens
                ))
            };
            sum = sum.wrapping_add(h);
            i += 1;
        }
        let page = if self.has_token_axis() {
            self.page_size_tokens
        } else {
            0
        };
        Ok(pool_hash(page, buffers.len() as u64, sum))
    }

    /// The `storage` fingerprint: the pool fingerprint and the memory layout.
    ///
    /// # Errors
    ///
    /// As [`PoolGeometry::fingerprint`].
    pub const fn storage_fingerprint(&self) -> Result<u64, LayoutError> {
        let pool = tri!(self.fingerprint());
        let h = fnv_str(FNV_OFFSET, "kvlayout.storage/v1");
        let h = fnv_u64(fnv_u64(h, pool), self.memory_layout.code() as u64);
        Ok(match self.memory_layout {
            MemoryLayout::PageUnified { heads_per_group } => fnv_u64(h, heads_per_group),
            _ => h,
        })
    }

    /// The `token`-level fingerprint of every buffer, in buffer order.
    pub fn token_fingerprints(&self) -> Vec<(&str, u64)> {
        self.buffers
            .iter()
            .map(|b| (b.name(), token_hash(b, self.page_size_tokens)))
            .collect()
    }
}

/// Every fingerprint of a pool: `pool`, `storage`, and `token` per buffer (what `check` and
/// `describe` print). Displays as `pool 0x…, storage 0x…, token kv=0x… index_k=0x…`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprints {
    /// [`PoolGeometry::fingerprint`].
    pub pool: u64,
    /// [`PoolGeometry::storage_fingerprint`].
    pub storage: u64,
    /// [`PoolGeometry::token_fingerprints`]: buffer name and its token fingerprint.
    pub token: Vec<(String, u64)>,
}

impl PoolGeometry {
    /// All fingerprints of this pool.
    ///
    /// # Errors
    ///
    /// As [`PoolGeometry::fingerprint`].
    pub fn fingerprints(&self) -> Result<Fingerprints, LayoutError> {
        Ok(Fingerprints {
            pool: self.fingerprint()?,
            storage: self.storage_fingerprint()?,
            token: self
                .token_fingerprints()
                .into_iter()
                .map(|(n, f)| (n.to_string(), f))
                .collect(),
        })
    }
}

impl Fingerprints {
    /// The token fingerprints as `kv=0x… index_k=0x…`.
    pub fn token_text(&self) -> String {
        let parts: Vec<String> = self
            .token
            .iter()
            .map(|(n, f)| format!("{n}={f:#018x}"))
            .collect();
        parts.join(" ")
    }
}

impl std::fmt::Display for Fingerprints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pool {:#018x}, storage {:#018x}, token {}",
            self.pool,
            self.storage,
            self.token_text()
        )
    }
}
