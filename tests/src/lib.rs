//! Shared fixtures of the workspace's integration tests (`tests/tests/*.rs`): the pool
//! geometries, byte patterns and the seed's host geometry that pools.rs, hostile.rs and
//! cuda_pools.rs build on, with their sizes worked once here. (The replay tests' small workload
//! belongs here too once the replay crate settles: `kvlayout_replay::synthetic::Workload`.)
//!
//! Sizes (DeepSeek-V3.2, sglang python/sglang/srt/mem_cache/memory_pool.py and DeepSeek's
//! FlashMLA README, 64-token pages):
//! - `kv`, [`formats::DSA_MLA_FP8`]: 512 fp8 + 4 f32 scales + 64 bf16 = 512 + 16 + 128 =
//!   656 B/token -> 64 x 656 = 41,984 B per page of one layer;
//! - `index_k`, [`formats::INDEX_K_FP8`]: 128 fp8 + one f32 scale = 132 B/token -> 8,448 B per
//!   page; [`formats::INDEX_K_BF16`]: 128 x 2 = 256 B/token -> 16,384 B per page;
//! - MHA [`formats::MHA_BF16_8X128`]: K and V of 8 heads x 128 bf16 = 2 x 8 x 128 x 2 =
//!   4,096 B/token -> 262,144 B per page.

use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, TokenLayout, file, formats};
use kvlayout_pool::{Backend, HiCache, KvPool, PoolError};

/// Tokens per page of every fixture pool.
pub const PAGE_TOKENS: u64 = 64;

/// A `layer_first` pool of `pages` pages whose buffers all have `layers` layers.
pub fn pool(buffers: &[(&'static str, TokenLayout)], layers: u64, pages: u64) -> PoolGeometry {
    PoolGeometry {
        name: "test pool".into(),
        page_size_tokens: PAGE_TOKENS,
        pages,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: buffers
            .iter()
            .map(|(n, l)| BufferGeometry::new(*n, layers, l.clone()))
            .collect(),
    }
}

/// DeepSeek-V3.2's DSA pool: `kv` (656 B/token) then `index_k` in the given format.
pub fn dsa(index_k: TokenLayout, layers: u64, pages: u64) -> PoolGeometry {
    pool(
        &[("kv", formats::DSA_MLA_FP8), ("index_k", index_k)],
        layers,
        pages,
    )
}

/// An MHA pool, one `kv` buffer of K and V, 8 heads x 128 bf16 (4,096 B/token).
pub fn mha_bf16(layers: u64, pages: u64) -> PoolGeometry {
    pool(&[("kv", formats::MHA_BF16_8X128)], layers, pages)
}

/// The seed's host geometry (configs/geometry/host-index-k-fp8-formula.json, shared case 00
/// b.json): DeepSeek-V3.2, 61 layers, index-K sized by the fp8 formula (132 B/token) whatever
/// the device holds, `page_first`, 4096 pages.
pub const FP8_FORMULA_HOST_JSON: &str =
    include_str!("../../configs/geometry/host-index-k-fp8-formula.json");

/// [`FP8_FORMULA_HOST_JSON`] with its page count cut to `pages` (pages are not compared), so a
/// test allocates `pages x 61 x (41,984 + 8,448)` B instead of 4096 pages' 12.6 GB.
pub fn fp8_formula_host(pages: u64) -> PoolGeometry {
    let mut g = file::from_json(FP8_FORMULA_HOST_JSON).expect("the shipped geometry file reads");
    assert_eq!(g.pages, 4096, "the shipped file changed");
    g.pages = pages;
    g
}

/// A byte unique to (tag, buffer, layer, page, byte) modulo 251, never zero.
pub fn pattern(tag: u64, b: usize, l: u64, p: u64, i: usize) -> u8 {
    (((tag * 97 + b as u64 * 131 + l * 31 + p * 7 + i as u64 * 13) % 251) + 1) as u8
}

/// The canonical page payload of (buffer `b`, layer `l`, page `p`) under pattern `tag`.
pub fn page_pattern(tag: u64, g: &PoolGeometry, b: usize, l: u64, p: u64) -> Vec<u8> {
    let n = g
        .page_geometry(b)
        .expect("valid geometry")
        .page_payload_bytes as usize;
    (0..n).map(|i| pattern(tag, b, l, p, i)).collect()
}

/// Calls `write` with every (buffer, layer, page) of `g` and its [`page_pattern`].
pub fn fill_pages(
    g: &PoolGeometry,
    tag: u64,
    mut write: impl FnMut(usize, u64, u64, &[u8]) -> Result<(), PoolError>,
) {
    for (b, buf) in g.buffers.iter().enumerate() {
        for l in 0..buf.layers {
            for p in 0..g.pages {
                write(b, l, p, &page_pattern(tag, g, b, l, p)).expect("page write");
            }
        }
    }
}

/// Every page of an unpaired pool written with pattern `tag`.
pub fn fill_pool(pool: &mut impl KvPool, tag: u64) {
    let g = pool.geometry().clone();
    fill_pages(&g, tag, |b, l, p, d| pool.write_page(b, l, p, d));
}

/// Both pools' whole regions (tests compare them before and after a transfer).
pub fn snapshots<B: Backend>(cache: &HiCache<B>) -> (Vec<u8>, Vec<u8>) {
    (
        cache.device().snapshot().expect("device snapshot"),
        cache.host().snapshot().expect("host snapshot"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture_sizes_are_the_worked_ones() {
        let g = dsa(formats::INDEX_K_FP8, 2, 4);
        assert_eq!(g.page_geometry(0).unwrap().page_payload_bytes, 64 * 656);
        assert_eq!(g.page_geometry(1).unwrap().page_payload_bytes, 64 * 132);
        let g = dsa(formats::INDEX_K_BF16, 2, 4);
        assert_eq!(g.page_geometry(1).unwrap().page_payload_bytes, 64 * 256);
        assert_eq!(
            mha_bf16(1, 1).page_geometry(0).unwrap().page_payload_bytes,
            64 * 2 * 8 * 128 * 2
        );
        let h = fp8_formula_host(4);
        assert_eq!(h.total_bytes().unwrap(), 4 * 61 * (41_984 + 8_448));
        assert_eq!(pattern(0, 0, 0, 0, 0), 1);
    }
}
