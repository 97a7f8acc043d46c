//! The fingerprints recomputed from the byte streams documented in `src/fingerprint.rs`, with
//! an FNV-1a written here (not the crate's), so the documentation is what another language
//! would implement. (`tests/fingerprint_reference.py` does the pool stream in Python.)

use kvlayout_core::{PoolGeometry, file};

/// FNV-1a 64 over a stream of items, written independently of the crate.
#[derive(Default)]
struct Stream(Vec<u8>);

impl Stream {
    fn u(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn s(self, text: &str) -> Self {
        let mut me = self.u(text.len() as u64);
        me.0.extend_from_slice(text.as_bytes());
        me
    }
    fn all(mut self, vs: &[u64]) -> Self {
        for &v in vs {
            self = self.u(v);
        }
        self
    }
    fn hash(&self) -> u64 {
        let mut h: u64 = 14695981039346656037; // 0xcbf29ce484222325
        for &b in &self.0 {
            h ^= u64::from(b);
            h = h.wrapping_mul(1099511628211); // 0x100000001b3
        }
        h
    }
}

fn case(name: &str, side: &str) -> PoolGeometry {
    let path = format!(
        "{}/../cli/tests/shared-cases/{name}/{side}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    file::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

// Codes from the module docs.
const F32: u64 = 1;
const BF16: u64 = 3;
const F8E4M3: u64 = 4;
const TOKEN_MAJOR: u64 = 1;
const SECTION_MAJOR: u64 = 2;

/// DeepSeek-V3.2, fp8 latent (FlashMLA `fp8_ds_mla`, 656 B/token) + fp8 index-K (132 B/token),
/// 61 layers each, 64-token pages (case 14, side A).
#[test]
fn deepseek_v32_pool_fingerprint_from_the_documented_stream() {
    let kv_core = Stream::default()
        .s("kvlayout.layout/v1")
        .u(TOKEN_MAJOR)
        .u(3)
        .all(&[F8E4M3, 1, 512, 0])
        .all(&[F32, 1, 4, 1, 0, 128])
        .all(&[BF16, 1, 64, 0])
        .hash();
    let idx_core = Stream::default()
        .s("kvlayout.layout/v1")
        .u(SECTION_MAJOR)
        .u(2)
        .all(&[F8E4M3, 1, 128, 0])
        .all(&[F32, 1, 1, 1, 0, 128])
        .hash();
    // Strides: 64 x (512 + 16 + 128) = 41984, 64 x (128 + 4) = 8448.
    let h_kv = Stream::default()
        .s("kvlayout.buffer/v1")
        .s("kv")
        .u(61)
        .u(64 * (512 + 4 * 4 + 64 * 2))
        .u(kv_core)
        .hash();
    let h_idx = Stream::default()
        .s("kvlayout.buffer/v1")
        .s("index_k")
        .u(61)
        .u(64 * (128 + 4))
        .u(idx_core)
        .hash();
    let pool = Stream::default()
        .s("kvlayout.pool/v1")
        .u(64)
        .u(2)
        .u(h_kv.wrapping_add(h_idx))
        .hash();
    let g = case("14-namespace-label-only-same-geometry", "a");
    assert_eq!(g.fingerprint(), Ok(pool));
    // The storage key value published for v1 (README): unchanged by v2.
    assert_eq!(pool, 0xeb01_9e4f_84ee_0658);
    // Storage: the pool fingerprint and layer_first (code 1).
    let storage = Stream::default()
        .s("kvlayout.storage/v1")
        .u(pool)
        .u(1)
        .hash();
    assert_eq!(g.storage_fingerprint(), Ok(storage));
    // Token, index_k: no layer ids (0), section_major page-bound at 64 tokens, no split (0).
    let token_idx = Stream::default()
        .s("kvlayout.token/v1")
        .s("index_k")
        .u(61)
        .all(&[1, 0]) // attention full, W 0
        .u(0) // no layer_ids
        .u(SECTION_MAJOR)
        .u(64)
        .u(0)
        .u(2)
        .all(&[F8E4M3, 1, 128, 0])
        .all(&[F32, 1, 1, 1, 0, 128])
        .all(&[0, 0]) // both sections linear
        .hash();
    assert_eq!(g.token_fingerprints()[1], ("index_k", token_idx));
}

/// gpt-oss-20b's sliding group (case 15 A, buffer `swa`): a v2 buffer stream. 2 sections
/// `[8, 64]` bf16, token_major, 12 layers, window 128, 16-token pages: stride 16 x 2048.
#[test]
fn a_sliding_window_buffer_uses_the_v2_stream() {
    let core = |_: ()| {
        Stream::default()
            .s("kvlayout.layout/v1")
            .u(TOKEN_MAJOR)
            .u(2)
            .all(&[BF16, 2, 8, 64, 0])
            .all(&[BF16, 2, 8, 64, 0])
            .hash()
    };
    let h_full = Stream::default()
        .s("kvlayout.buffer/v1")
        .s("full")
        .u(12)
        .u(16 * 2 * 8 * 64 * 2)
        .u(core(()))
        .hash();
    let h_swa = Stream::default()
        .s("kvlayout.buffer/v2")
        .s("swa")
        .u(12)
        .u(16) // effective page size
        .u(16 * 2 * 8 * 64 * 2)
        .u(core(()))
        .all(&[2, 128]) // sliding window, W
        .u(0) // no layer_ids
        .u(0) // no shard
        .all(&[0, 0]) // orders
        .hash();
    let pool = Stream::default()
        .s("kvlayout.pool/v1")
        .u(16)
        .u(2)
        .u(h_full.wrapping_add(h_swa))
        .hash();
    assert_eq!(
        case("15-gpt-oss-sliding-group-missing", "a").fingerprint(),
        Ok(pool)
    );
}

/// Case 22 B, buffer `fa`: a heads split hashes the shard in the pool stream and, at token
/// level, heads_total and the per-head shapes `[128]`.
#[test]
fn a_heads_split_in_the_pool_and_token_streams() {
    let g = case("22-hetero-tp-1-to-2-token-level", "b");
    let core = Stream::default()
        .s("kvlayout.layout/v1")
        .u(SECTION_MAJOR)
        .u(2)
        .all(&[BF16, 2, 4, 128, 0])
        .all(&[BF16, 2, 4, 128, 0])
        .hash();
    let h_fa = Stream::default()
        .s("kvlayout.buffer/v2")
        .s("fa")
        .u(4)
        .u(16)
        .u(16 * 2 * 4 * 128 * 2)
        .u(core)
        .all(&[1, 0]) // full
        .u(0) // no layer_ids
        .all(&[1, 2, 0, 1, 8]) // shard: tp_size 2, rank 0, heads, heads_total 8
        .all(&[0, 0])
        .hash();
    let mla_core = Stream::default()
        .s("kvlayout.layout/v1")
        .u(TOKEN_MAJOR)
        .u(1)
        .all(&[BF16, 1, 576, 0])
        .hash();
    let h_mla = Stream::default()
        .s("kvlayout.buffer/v2")
        .s("mla")
        .u(20)
        .u(16)
        .u(16 * 576 * 2)
        .u(mla_core)
        .all(&[1, 0])
        .u(0)
        .all(&[1, 2, 0, 2, 0]) // shard: tp_size 2, rank 0, replicated
        .u(0)
        .hash();
    let pool = Stream::default()
        .s("kvlayout.pool/v1")
        .u(16)
        .u(2)
        .u(h_mla.wrapping_add(h_fa))
        .hash();
    assert_eq!(g.fingerprint(), Ok(pool));
    let token_fa = Stream::default()
        .s("kvlayout.token/v1")
        .s("fa")
        .u(4)
        .all(&[1, 0])
        .u(0)
        .u(SECTION_MAJOR)
        .u(16)
        .u(8) // heads_total
        .u(2)
        .all(&[BF16, 1, 128, 0])
        .all(&[BF16, 1, 128, 0])
        .all(&[0, 0])
        .hash();
    assert_eq!(g.token_fingerprints()[1], ("fa", token_fa));
}

/// DeepSeek-V4 C4 indexer K (case 28 A): one 132-B row per 4 tokens, a v3 buffer stream.
/// 64-token pages hold 16 rows: stride 16 x 132 = 2,112 B.
#[test]
fn a_compressed_buffer_uses_the_v3_stream() {
    let core = Stream::default()
        .s("kvlayout.layout/v1")
        .u(SECTION_MAJOR)
        .u(2)
        .all(&[F8E4M3, 1, 128, 0])
        .all(&[F32, 1, 1, 1, 0, 128])
        .hash();
    let h = Stream::default()
        .s("kvlayout.buffer/v3")
        .s("index_k")
        .u(21)
        .u(64) // effective page size in tokens
        .u(4) // compress ratio
        .u(16 * 132) // stride at 64 / 4 rows
        .u(core)
        .all(&[1, 0]) // full, W 0
        .u(0) // no layer_ids
        .u(0) // no shard
        .all(&[0, 0]) // orders: linear
        .all(&[0, 0]) // no split groups
        .hash();
    let pool = Stream::default()
        .s("kvlayout.pool/v1")
        .u(64)
        .u(1)
        .u(h)
        .hash();
    let g = case("28-dsv4-c4-indexer-host-per-token-vs-per-row", "a");
    assert_eq!(g.fingerprint(), Ok(pool));
    // fingerprint_reference.py publishes the same value.
    assert_eq!(pool, 0x4f8f_3963_6bf8_1db6);
    // The host side (R 1, a v1 file) keeps the v1 stream and its own value.
    let host = case("28-dsv4-c4-indexer-host-per-token-vs-per-row", "b");
    let h1 = Stream::default()
        .s("kvlayout.buffer/v1")
        .s("index_k")
        .u(21)
        .u(64 * 132)
        .u(core)
        .hash();
    let pool1 = Stream::default()
        .s("kvlayout.pool/v1")
        .u(64)
        .u(1)
        .u(h1)
        .hash();
    assert_eq!(host.fingerprint(), Ok(pool1));
}

/// Case 29 B: Qwen3.5 full attention at TP 4 rank 2, heads_total 2 (replicas 2, head 1): the
/// v3 pool stream, and the v3 token stream hashing the head held.
#[test]
fn replicated_heads_use_the_v3_streams_and_the_token_stream_hashes_the_head() {
    let core = Stream::default()
        .s("kvlayout.layout/v1")
        .u(SECTION_MAJOR)
        .u(2)
        .all(&[BF16, 2, 1, 256, 0])
        .all(&[BF16, 2, 1, 256, 0])
        .hash();
    let h = Stream::default()
        .s("kvlayout.buffer/v3")
        .s("full_attn")
        .u(10)
        .u(64)
        .u(1) // compress ratio
        .u(64 * 1024) // 64 x (512 + 512)
        .u(core)
        .all(&[1, 0])
        .u(0)
        .all(&[1, 4, 2, 1, 2]) // shard: tp_size 4, rank 2, heads, heads_total 2
        .all(&[0, 0])
        .all(&[0, 0])
        .hash();
    let pool = Stream::default()
        .s("kvlayout.pool/v1")
        .u(64)
        .u(1)
        .u(h)
        .hash();
    let g = case("29-compatible-replicated-heads-tp2-to-tp4-token-level", "b");
    assert_eq!(g.fingerprint(), Ok(pool));
    let token = Stream::default()
        .s("kvlayout.token/v3")
        .s("full_attn")
        .u(10)
        .all(&[1, 0])
        .u(0)
        .u(SECTION_MAJOR)
        .u(64) // section_major is page-bound
        .u(2) // heads_total
        .u(2)
        .all(&[BF16, 1, 256, 0]) // per-head shape
        .all(&[BF16, 1, 256, 0])
        .all(&[0, 0]) // orders
        .u(1) // compress ratio
        .all(&[1, 1]) // replicated: head 2 / 2 = 1
        .all(&[0, 0]) // no split groups
        .hash();
    assert_eq!(g.token_fingerprints(), vec![("full_attn", token)]);
}

/// Case 30: GDN conv state, split groups [2048, 2048, 4096], TP 2 and TP 4: one token
/// fingerprint (per-entry shape [3]), two pool fingerprints.
#[test]
fn split_groups_are_hashed_in_the_v3_streams() {
    let token = Stream::default()
        .s("kvlayout.token/v3")
        .s("conv")
        .u(30)
        .all(&[4, 0]) // state
        .u(0)
        .u(TOKEN_MAJOR)
        .u(0) // not page-bound
        .u(8192) // heads_total: the groups' sum
        .u(1)
        .all(&[BF16, 1, 3, 0])
        .u(0) // order
        .u(1) // compress ratio
        .u(0) // not replicated
        .all(&[1, 3, 2048, 2048, 4096])
        .hash();
    for (side, tp, channels) in [("a", 2u64, 4096u64), ("b", 4, 2048)] {
        let g = case(
            "30-compatible-gdn-conv-split-groups-tp2-vs-tp4-token-level",
            side,
        );
        assert_eq!(g.token_fingerprints(), vec![("conv", token)], "{side}");
        let core = Stream::default()
            .s("kvlayout.layout/v1")
            .u(TOKEN_MAJOR)
            .u(1)
            .all(&[BF16, 2, channels, 3, 0])
            .hash();
        let h = Stream::default()
            .s("kvlayout.buffer/v3")
            .s("conv")
            .u(30)
            .u(1) // a state slot is one "token"
            .u(1)
            .u(channels * 3 * 2) // one slot
            .u(core)
            .all(&[4, 0])
            .u(0)
            .all(&[1, tp, 0, 1, 8192])
            .u(0)
            .all(&[1, 3, 2048, 2048, 4096])
            .hash();
        // State slots only: the pool's page size is hashed as 0.
        let pool = Stream::default()
            .s("kvlayout.pool/v1")
            .u(0)
            .u(1)
            .u(h)
            .hash();
        assert_eq!(g.fingerprint(), Ok(pool), "{side}");
    }
}
