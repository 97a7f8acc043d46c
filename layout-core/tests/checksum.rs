//! The page checksum (`kvlayout.checksum/v1`): the vectors the Python reference recomputes
//! (`checksum_reference.py`), its key taken from the geometry, and detection properties: any
//! single changed byte, and any two swapped (unequal) 8-byte words.

use kvlayout_core::checksum::{ChecksumStream, page_checksum};
use kvlayout_core::fingerprint::token_hash;
use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};
use proptest::prelude::*;

fn payload(len: usize, mul: usize, add: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * mul + add) % 256) as u8).collect()
}

#[test]
fn the_vectors_the_python_reference_recomputes() {
    let text = include_str!("checksum_vectors.txt");
    let mut n = 0;
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let f: Vec<&str> = line.split_whitespace().collect();
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        let num = |s: &str| s.parse::<usize>().unwrap();
        let data = payload(num(f[2]), num(f[3]), num(f[4]));
        assert_eq!(
            page_checksum(hex(f[0]), num(f[1]) as u64, &data),
            hex(f[5]),
            "vector {line}"
        );
        n += 1;
    }
    assert_eq!(n, 11);
}

fn dsv32() -> PoolGeometry {
    PoolGeometry {
        name: "dsv32".into(),
        page_size_tokens: 64,
        pages: 4,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![
            BufferGeometry::new("kv", 4, formats::DSA_MLA_FP8),
            BufferGeometry::new("index_k", 2, formats::INDEX_K_BF16).with_layer_ids(vec![1, 3]),
        ],
    }
}

#[test]
fn the_key_is_the_token_fingerprint_the_model_layer_and_the_payload() {
    let g = dsv32();
    let key = g.page_checksum_key(1, 1).unwrap();
    // index_k: 128 bf16 = 256 B per token, 64 tokens: 16,384 B; layer index 1 serves model
    // layer 3 (layer_ids [1, 3]).
    assert_eq!(key.payload_bytes, 64 * 128 * 2);
    assert_eq!(key.layer_id, 3);
    assert_eq!(key.token_fingerprint, token_hash(&g.buffers[1], 64));
    // kv: DeepSeek MLA fp8, 656 B per token (512 e4m3 + 4 f32 scales + 64 bf16 rope).
    let kv = g.page_checksum_key(0, 2).unwrap();
    assert_eq!((kv.payload_bytes, kv.layer_id), (64 * (512 + 16 + 128), 2));
    let page = payload(16_384, 131, 7);
    assert_eq!(
        key.checksum(&page).unwrap(),
        page_checksum(token_hash(&g.buffers[1], 64), 3, &page)
    );
    let e = key.checksum(&page[..8448]).unwrap_err();
    assert!(
        e.to_string().contains("8448") && e.to_string().contains("16384"),
        "{e}"
    );
    let e = g.page_checksum_key(1, 2).unwrap_err();
    assert!(
        e.to_string().contains("index_k") && e.to_string().contains("layer 2"),
        "{e}"
    );
}

#[test]
fn the_seed_bug_host_page_does_not_verify_under_the_device_key() {
    // The seed: the device's bf16 index-K page (256 B/token) checksummed at backup; a load that
    // moved 132 of the 256 bytes per token (the fp8 formula) leaves the rest stale.
    let g = dsv32();
    let key = g.page_checksum_key(1, 0).unwrap();
    let fresh = payload(16_384, 13, 200);
    let mut torn = vec![0u8; 16_384];
    for t in 0..64 {
        torn[t * 256..t * 256 + 132].copy_from_slice(&fresh[t * 256..t * 256 + 132]);
    }
    assert_ne!(key.checksum(&torn).unwrap(), key.checksum(&fresh).unwrap());
    // The same bytes under the fp8 layout's key (another token fingerprint) do not verify.
    let mut fp8 = g.clone();
    fp8.buffers[1] =
        BufferGeometry::new("index_k", 2, formats::INDEX_K_FP8).with_layer_ids(vec![1, 3]);
    let other = fp8.page_checksum_key(1, 0).unwrap();
    assert_ne!(other.token_fingerprint, key.token_fingerprint);
    assert_ne!(
        page_checksum(other.token_fingerprint, 1, &fresh),
        key.checksum(&fresh).unwrap()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn any_single_changed_byte_is_detected(
        data in proptest::collection::vec(any::<u8>(), 1..10_000),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        t in any::<u64>(),
        layer in 0u64..100,
    ) {
        let i = at.index(data.len());
        let mut changed = data.clone();
        changed[i] ^= flip;
        prop_assert_ne!(page_checksum(t, layer, &data), page_checksum(t, layer, &changed));
    }

    #[test]
    fn any_two_swapped_unequal_words_are_detected(
        data in proptest::collection::vec(any::<u8>(), 16..10_000),
        a in any::<prop::sample::Index>(),
        b in any::<prop::sample::Index>(),
        t in any::<u64>(),
    ) {
        let words = data.len() / 8;
        let (i, j) = (a.index(words), b.index(words));
        prop_assume!(data[8 * i..8 * i + 8] != data[8 * j..8 * j + 8]);
        let mut swapped = data.clone();
        for k in 0..8 {
            swapped.swap(8 * i + k, 8 * j + k);
        }
        prop_assert_ne!(page_checksum(t, 0, &data), page_checksum(t, 0, &swapped));
    }

    #[test]
    fn swapped_words_of_structured_pages_are_detected(
        stride in 2usize..64,
        set in any::<prop::sample::Index>(),
        j in 0usize..2048,
        hi in any::<bool>(),
    ) {
        // Pages of few distinct values (a zero page with a few set words, words differing only
        // in their top or bottom bit): where a weak mixer lets terms cancel.
        let mut data = vec![0u8; 16_384];
        for w in (0..2048).step_by(stride) {
            data[8 * w + if hi { 7 } else { 0 }] = if hi { 0x80 } else { 1 };
        }
        // Word i is set (a multiple of the stride), word j is not.
        let i = set.index(2048usize.div_ceil(stride)) * stride;
        prop_assume!(j % stride != 0);
        let mut swapped = data.clone();
        for k in 0..8 {
            swapped.swap(8 * i + k, 8 * j + k);
        }
        prop_assert_ne!(page_checksum(1, 0, &data), page_checksum(1, 0, &swapped));
    }

    #[test]
    fn a_stream_in_any_pieces_equals_one_call(
        data in proptest::collection::vec(any::<u8>(), 0..12_000),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(data.len() + 1)).collect();
        at.sort_unstable();
        let mut s = ChecksumStream::new(9, 4, data.len() as u64);
        let mut from = 0;
        for cut in at.into_iter().chain([data.len()]) {
            s.update(&data[from..cut]);
            from = cut;
        }
        prop_assert_eq!(s.finish().unwrap(), page_checksum(9, 4, &data));
    }
}
