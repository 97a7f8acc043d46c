//! Pool offsets per memory layout, fingerprint and geometry-file behaviour, with expected
//! values worked by hand.

use kvlayout_core::fingerprint::{fnv_bytes, fnv_str, fnv_u64};
use kvlayout_core::formats::{INDEX_K_FP8, MHA_BF16_8X128};
use kvlayout_core::{
    Arrangement, BufferGeometry, Cow, Dtype, MemoryLayout, PoolGeometry, Section, TokenLayout,
    compare, file,
};

fn small_pool(memory_layout: MemoryLayout) -> PoolGeometry {
    // Buffer "kv": 2 layers, token_major 8 x u8 = 8 B/token, 4-token page = 32 B.
    // Buffer "idx": 1 layer, section_major 4 x bf16 = 8 B/token, page 32 B. 3 pages.
    let kv = TokenLayout {
        arrangement: Arrangement::TokenMajor,
        sections: Cow::Owned(vec![Section::new("row", Dtype::U8, &[8])]),
        page_align_bytes: None,
        page_stride_bytes: None,
    };
    let idx = TokenLayout {
        arrangement: Arrangement::SectionMajor,
        sections: Cow::Owned(vec![Section::new("values", Dtype::Bf16, &[4])]),
        page_align_bytes: None,
        page_stride_bytes: None,
    };
    PoolGeometry {
        name: "small".into(),
        page_size_tokens: 4,
        pages: 3,
        memory_layout,
        buffers: vec![
            BufferGeometry::new("kv", 2, kv),
            BufferGeometry::new("idx", 1, idx),
        ],
    }
}

#[test]
fn layer_first_offsets() {
    let g = small_pool(MemoryLayout::LayerFirst);
    g.validate().unwrap();
    // kv region: 2 layers x 3 pages x 32 B = 192 B; idx region 1 x 3 x 32 = 96 B.
    assert_eq!(g.total_bytes(), Ok(288));
    // kv layer 1 page 1: (1 x 3 + 1) x 32 = 128.
    assert_eq!(g.page_offset_bytes(0, 1, 1), Ok(128));
    // idx layer 0 page 2: 192 + 2 x 32 = 256.
    assert_eq!(g.page_offset_bytes(1, 0, 2), Ok(256));
}

#[test]
fn page_first_offsets() {
    let g = small_pool(MemoryLayout::PageFirst);
    // kv layer 1 page 1: (1 x 2 + 1) x 32 = 96.
    assert_eq!(g.page_offset_bytes(0, 1, 1), Ok(96));
    assert_eq!(g.page_offset_bytes(1, 0, 2), Ok(192 + 64));
}

#[test]
fn page_first_direct_offsets() {
    let g = small_pool(MemoryLayout::PageFirstDirect);
    // One page of everything: kv 2 x 32 + idx 1 x 32 = 96 B.
    assert_eq!(g.page_group_bytes(), Ok(96));
    // kv layer 1 page 1: 96 + 0 + 32 = 128; idx page 2: 2 x 96 + 64 = 256.
    assert_eq!(g.page_offset_bytes(0, 1, 1), Ok(128));
    assert_eq!(g.page_offset_bytes(1, 0, 2), Ok(256));
    assert_eq!(g.total_bytes(), Ok(288));
}

#[test]
fn out_of_range_layer_and_page_are_errors() {
    let g = small_pool(MemoryLayout::LayerFirst);
    let e = g.page_offset_bytes(1, 1, 0).unwrap_err();
    assert!(
        e.to_string().contains("layer 1 out of range (1 layers)"),
        "{e}"
    );
    let e = g.page_offset_bytes(0, 0, 3).unwrap_err();
    assert!(
        e.to_string().contains("page 3 out of range (3 pages)"),
        "{e}"
    );
}

#[test]
fn page_head_segments_transpose_heads() {
    // MHA bf16 8 x 128, K plane then V plane, page of 2 tokens, 3 layers, 2 pages.
    // Head row: K 128 x 2 = 256 B + V 256 B = 512 B; head chunk = 2 tokens x 512 = 1024 B.
    let g = PoolGeometry {
        name: "mha".into(),
        page_size_tokens: 2,
        pages: 2,
        memory_layout: MemoryLayout::PageHead,
        buffers: vec![BufferGeometry::new("kv", 3, MHA_BF16_8X128)],
    };
    g.validate().unwrap();
    let segs = g.page_segments(0, 1, 1).unwrap();
    // 8 heads x 2 tokens x 2 sections, none contiguous on both sides: 32 segments of 256 B.
    assert_eq!(segs.len(), 32);
    assert!(segs.iter().all(|s| s.len_bytes == 256));
    // Page 1 layer 1 head 0 starts at ((1 x 8 + 0) x 3 + 1) x 1024 = 25600.
    // First segment: K head 0 token 0 (page offset 0).
    assert_eq!(segs[0].page_offset_bytes, 0);
    assert_eq!(segs[0].pool_offset_bytes, 25600);
    // Second: V head 0 token 0, page offset = K plane (2 x 2048) = 4096, host + 256.
    assert_eq!(segs[1].page_offset_bytes, 4096);
    assert_eq!(segs[1].pool_offset_bytes, 25600 + 256);
    // Head 1 token 0 K: page offset 256 (NHD inside the K plane), host + 3 layers x 1024.
    assert_eq!(segs[4].page_offset_bytes, 256);
    assert_eq!(segs[4].pool_offset_bytes, 25600 + 3 * 1024);
    // Every byte of the 8192-B page covered exactly once.
    let mut covered = vec![0u8; 8192];
    for s in &segs {
        for b in s.page_offset_bytes..s.page_offset_bytes + s.len_bytes {
            covered[b as usize] += 1;
        }
    }
    assert!(covered.iter().all(|&c| c == 1));
}

#[test]
fn page_head_refuses_mla_shapes() {
    let mut g = small_pool(MemoryLayout::PageHead);
    g.buffers.truncate(1);
    let e = g.validate().unwrap_err();
    assert_eq!(e.field, "memory_layout");
    assert!(e.problem.contains("[heads, ...]"), "{e}");
}

#[test]
fn fnv_matches_the_published_test_vectors() {
    // FNV-1a 64 test vectors (Fowler/Noll/Vo reference): "" -> cbf29ce484222325,
    // "a" -> af63dc4c8601ec8c, "foobar" -> 85944171f73967e8.
    let basis = 0xcbf2_9ce4_8422_2325;
    assert_eq!(fnv_bytes(basis, b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv_bytes(basis, b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv_bytes(basis, b"foobar"), 0x8594_4171_f739_67e8);
    // Integers feed 8 little-endian bytes, strings their length first.
    assert_eq!(
        fnv_u64(basis, 0x61),
        fnv_bytes(basis, &[0x61, 0, 0, 0, 0, 0, 0, 0])
    );
    assert_eq!(
        fnv_str(basis, "a"),
        fnv_bytes(basis, &[1, 0, 0, 0, 0, 0, 0, 0, b'a'])
    );
}

fn case(name: &str, side: &str) -> PoolGeometry {
    let path = format!(
        "{}/../cli/tests/shared-cases/{name}/{side}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    file::from_json(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn fingerprint_covers_exactly_the_compared_fields() {
    let a = case("08-compatible-layer-first-vs-page-first", "a");
    let b = case("08-compatible-layer-first-vs-page-first", "b");
    // Different pages (2048 vs 8192) and memory layout: same fingerprint.
    assert_eq!(a.fingerprint(), b.fingerprint());
    // Section labels differ: same fingerprint.
    let a = case("09-compatible-section-names-differ", "a");
    let b = case("09-compatible-section-names-differ", "b");
    assert_eq!(a.fingerprint(), b.fingerprint());
    // Buffer order does not matter (the buffer set is compared).
    let mut c = case("08-compatible-layer-first-vs-page-first", "a");
    let fp = c.fingerprint();
    c.buffers.reverse();
    assert_eq!(c.fingerprint(), fp);
    // The seed bug: bf16 device vs fp8-formula host differ.
    let a = case("00-dsa-index-k-bf16-vs-fp8-host", "a");
    let b = case("00-dsa-index-k-bf16-vs-fp8-host", "b");
    assert_ne!(a.fingerprint(), b.fingerprint());
    // Layer count is compared: 61 vs 60 differ.
    let mut d = a.clone();
    d.buffers[1].layers = 60;
    assert_ne!(d.fingerprint(), a.fingerprint());
}

#[test]
fn explicit_stride_equal_to_aligned_stride_is_compatible() {
    // 64 x 132 = 8448 rounded to 1024: 9 x 1024 = 9216, stated either way.
    let mut a = case("09-compatible-section-names-differ", "a");
    let mut b = a.clone();
    a.buffers[0].layout.page_align_bytes = Some(1024);
    b.buffers[0].layout.page_stride_bytes = Some(9216);
    assert_eq!(compare(&a, &b), Ok(()));
    assert_eq!(a.fingerprint(), b.fingerprint());
    b.buffers[0].layout.page_stride_bytes = Some(9216 + 1024);
    let m = compare(&a, &b).unwrap_err();
    assert_eq!(m.to_string(), "index_k.page_stride_bytes: 9216, 10240");
}

#[test]
fn every_shared_case_round_trips_through_the_file_format() {
    let dir = format!("{}/../cli/tests/shared-cases", env!("CARGO_MANIFEST_DIR"));
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        for side in ["a.json", "b.json"] {
            let text = std::fs::read_to_string(path.join(side)).unwrap();
            let Ok(g) = file::from_json(&text) else {
                continue; // the invalid cases: checked by the CLI case tests
            };
            let again = file::from_json(&file::to_json(&g)).unwrap();
            assert_eq!(again, g, "{}", path.display());
            read += 1;
        }
    }
    // 31 cases x 2 sides, minus the 4 invalid a.json files (cases 10, 11, 12, 27).
    assert_eq!(read, 31 * 2 - 4);
}

#[test]
fn file_errors_name_the_field_and_value() {
    let base = file::to_json(&case("09-compatible-section-names-differ", "a"));
    let bad = |from: &str, to: &str| {
        let text = base.replacen(from, to, 1);
        assert_ne!(text, base, "{from}");
        file::from_json(&text).unwrap_err().to_string()
    };
    let e = bad("\"section_major\"", "\"sectionmajor\"");
    assert!(
        e.contains("arrangement") && e.contains("sectionmajor"),
        "{e}"
    );
    let e = bad("\"layer_first\"", "\"layers_first\"");
    assert!(
        e.contains("memory_layout") && e.contains("layers_first"),
        "{e}"
    );
    // v3 is a schema since geometry v3; v4 is not.
    let e = bad("kvlayout.geometry/v1", "kvlayout.geometry/v4");
    assert!(e.contains("schema") && e.contains("v4"), "{e}");
    let e = bad("\"scales\": \"values\"", "\"scales\": \"valuez\"");
    assert!(e.contains("scales") && e.contains("valuez"), "{e}");
    let e = bad("\"layers\": 61", "\"layers\": 0");
    assert!(e.contains("layers") && e.contains("got 0"), "{e}");
    let e = bad("\"pages\": 1024", "\"pages\": 1152921504606846976");
    // 2^60 pages x 61 layers x 8448 B: an overflow, reported, nothing allocated.
    assert!(e.contains("overflow"), "{e}");
    let e = bad("\"layers\": 61", "\"layers\": 61, \"colour\": 1");
    assert!(e.contains("colour"), "{e}");
    let odd_fp4 = r#"{"schema": "kvlayout.geometry/v1", "name": "x", "page_size_tokens": 64,
        "pages": 4, "memory_layout": "layer_first", "buffers": [{"name": "index_k",
        "layers": 1, "arrangement": "section_major",
        "sections": [{"name": "values", "dtype": "f4e2m1", "shape": [127]}]}]}"#;
    let e = file::from_json(odd_fp4).unwrap_err().to_string();
    // 127 x 4 bits = 508 bits: not whole bytes.
    assert!(
        e.contains("sections[0] (values).shape") && e.contains("508 bits"),
        "{e}"
    );
}

#[test]
fn planes_round_trip_by_section_name() {
    let g = PoolGeometry {
        name: "v4".into(),
        page_size_tokens: 64,
        pages: 2,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![
            BufferGeometry::new("kv", 61, kvlayout_core::formats::DSV4_MLA_FP8),
            BufferGeometry::new("index_k", 61, INDEX_K_FP8),
        ],
    };
    let text = file::to_json(&g);
    assert!(text.contains("\"planes\""), "{text}");
    assert!(text.contains("\"page_align_bytes\": 576"), "{text}");
    assert!(text.contains("\"section_major\""), "{text}");
    assert!(text.contains("kvlayout.geometry/v1"), "{text}");
    let back = file::from_json(&text).unwrap();
    assert_eq!(back, g);
    // 64 x 584 = 37376 rounded up to a multiple of 576 = 65 x 576 = 37440.
    assert_eq!(back.page_geometry(0).unwrap().page_stride_bytes, 65 * 576);
    // The plain neighbour is untouched by the planes: 64 x (128 + 4) = 8448.
    assert_eq!(
        back.page_geometry(1).unwrap().page_stride_bytes,
        64 * (128 + 4)
    );
}

/// Regression (found by the property tests): plane arrangements were compared by their text,
/// which shows section labels, so relabelled sections made two equal DeepSeek-V4 layouts
/// "incompatible".
#[test]
fn planes_with_other_section_labels_are_compatible() {
    let a = PoolGeometry {
        name: "a".into(),
        page_size_tokens: 64,
        pages: 2,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![BufferGeometry::new(
            "kv",
            61,
            kvlayout_core::formats::DSV4_MLA_FP8,
        )],
    };
    let mut b = a.clone();
    let mut sections = b.buffers[0].layout.sections().to_vec();
    sections[0].name = Cow::Borrowed("k_nope");
    b.buffers[0].layout.sections = Cow::Owned(sections);
    assert_eq!(compare(&a, &b), Ok(()));
    assert_eq!(a.fingerprint(), b.fingerprint());
}

/// Regressions from the new-user review (notes F5, F6, F9, F10, F15).
#[test]
fn hostile_geometry_files_are_refused_with_the_field_named() {
    let base = file::to_json(&case("09-compatible-section-names-differ", "a"));
    let err = |text: &str| file::from_json(text).unwrap_err().to_string();
    // A UTF-8 byte-order mark is accepted.
    assert!(file::from_json(&format!("\u{feff}{base}")).is_ok());
    // A positional array is not a geometry file.
    let e = err("[\"kvlayout.geometry/v1\"]");
    assert!(
        e.starts_with("json: invalid type: sequence, expected a geometry file: an object"),
        "{e}"
    );
    // JSON type errors name the field path.
    let e = err(&base.replacen("\"pages\": 1024", "\"pages\": -1", 1));
    assert!(e.starts_with("pages: invalid value: integer `-1`"), "{e}");
    let e = err(&base.replacen("\"layers\": 61", "\"layers\": 6.5", 1));
    // The path carries the buffer's name, as every later check's does.
    assert!(
        e.starts_with("buffers[0] (index_k).layers: invalid type"),
        "{e}"
    );
    // Overflow names the buffer and the three factors: 8448 B x 61 x 2^63.
    let e = err(&base.replacen("\"pages\": 1024", "\"pages\": 9223372036854775808", 1));
    assert!(
        e.contains("buffers[0] (index_k): overflow: 8448 B per page x 61 layers x 9223372036854775808 pages"),
        "{e}"
    );
    // Names that would forge output lines, and empty section names.
    let e = err(&base.replacen("\"name\": \"index_k\"", "\"name\": \"kv\\nFAKE: 1, 2\"", 1));
    assert!(
        e.contains("buffers[0].name") && e.contains("control characters"),
        "{e}"
    );
    let e = err(&base.replacen("\"name\": \"values\"", "\"name\": \"\"", 1));
    assert!(e.contains("sections[0].name: must not be empty"), "{e}");
    // Counts past the limits are refused before any quadratic check runs.
    let many: Vec<String> = (0..1025)
        .map(|i| format!("{{\"name\": \"b{i}\", \"layers\": 1, \"arrangement\": \"token_major\", \"sections\": [{{\"name\": \"v\", \"dtype\": \"u8\", \"shape\": [2]}}]}}"))
        .collect();
    let text = format!(
        "{{\"schema\": \"kvlayout.geometry/v1\", \"page_size_tokens\": 1, \"pages\": 1, \"memory_layout\": \"layer_first\", \"buffers\": [{}]}}",
        many.join(",")
    );
    assert!(err(&text).contains("1025 buffers, more than the limit of 1024"));
}

#[test]
fn files_past_the_size_limit_are_not_read_whole() {
    let e = file::read_path(std::path::Path::new("/dev/zero")).unwrap_err();
    assert_eq!(e.field, "file");
    assert!(e.problem.contains("16777216-byte limit"), "{e}");
    let e = file::read_path(std::path::Path::new("/nonexistent/kvlayout.json")).unwrap_err();
    assert!(e.problem.starts_with("cannot read"), "{e}");
}

/// Pool offset of byte `canonical` of the canonical page (the arrangement's byte order) of
/// `page` of `layer` of buffer `b`, through the layout's segments.
fn pool_offset_of(g: &PoolGeometry, b: usize, layer: u64, page: u64, canonical: u64) -> u64 {
    let segs = g.page_segments(b, layer, page).unwrap();
    let s = segs
        .iter()
        .find(|s| (s.page_offset_bytes..s.page_offset_bytes + s.len_bytes).contains(&canonical))
        .unwrap_or_else(|| panic!("byte {canonical} in no segment: {segs:?}"));
    s.pool_offset_bytes + canonical - s.page_offset_bytes
}

/// One MHA buffer of `heads` x `dim` bf16 per K and V, token_major.
fn mha_side(name: &'static str, heads: u64, dim: u64) -> BufferGeometry {
    BufferGeometry::new(
        name,
        3,
        TokenLayout {
            arrangement: Arrangement::TokenMajor,
            sections: Cow::Owned(vec![Section::owned(name, Dtype::Bf16, vec![heads, dim])]),
            page_align_bytes: None,
            page_stride_bytes: None,
        },
    )
}

/// SGLang 0.5.23 `page_unified` (`python/sglang/srt/mem_cache/pool_host/page_unified.py`,
/// `PageUnifiedLayout.page_dims`): `kv_buffer` of shape `(page_num, head_group_num, layer_num,
/// 2, page_size, heads_per_group, head_dim)`, C-contiguous. With 4 heads in 2 groups
/// (`heads_per_group` 2), head_dim 2 bf16, 3 layers, 2-token pages, 5 pages, the byte strides
/// are, innermost first: dim 2, head in group 2 x 2 = 4, token 2 x 4 = 8, K/V 2 x 8 = 16,
/// layer 2 x 16 = 32, group 3 x 32 = 96, page 2 x 96 = 192 (= `bytes_per_page`:
/// 2 groups x 3 layers x 2 x 2 tokens x `group_bytes` 8). So K[page p, head h, layer l, token t,
/// dim d] sits at 192 p + 96 (h / 2) + 32 l + 8 t + 4 (h % 2) + 2 d, and V 16 B further.
#[test]
fn page_unified_offsets_are_sglangs_page_dims() {
    let g = PoolGeometry {
        name: "sglang page_unified".into(),
        page_size_tokens: 2,
        pages: 5,
        memory_layout: MemoryLayout::PageUnified { heads_per_group: 2 },
        buffers: vec![mha_side("k", 4, 2), mha_side("v", 4, 2)],
    };
    g.validate().unwrap();
    assert_eq!(g.total_bytes(), Ok(5 * 192));
    let regions = g.regions().unwrap();
    assert_eq!(regions.len(), 1, "one region: the kv_buffer");
    for (b, kv) in [(0usize, 0u64), (1, 16)] {
        for p in 0..5 {
            for l in 0..3 {
                for t in 0..2 {
                    for h in 0..4 {
                        for d in 0..2 {
                            // token_major canonical page: [token][head][dim], 4 x 2 x 2 = 16 B a row
                            let canonical = 16 * t + 4 * h + 2 * d;
                            let sglang =
                                192 * p + 96 * (h / 2) + 32 * l + kv + 8 * t + 4 * (h % 2) + 2 * d;
                            assert_eq!(pool_offset_of(&g, b, l, p, canonical), sglang);
                        }
                    }
                }
            }
        }
    }
    // V's pieces: 2 groups of 2 tokens x `group_bytes` 8 = 16 B; group 1 of layer 1 of page 0
    // at 96 + 32 + 16 (SGLang's `chunk_span((1, 2), head_group=1)` starts at 96 + 32).
    let p = g.placement(1).unwrap();
    assert_eq!((p.heads, p.run_bytes), (2, 16));
    assert_eq!(p.offset(1, 0, 1).unwrap(), 96 + 32 + 16);
    // Refusals: a group size that does not divide the heads; 0; K and V with other layer counts.
    let mut bad = g.clone();
    bad.memory_layout = MemoryLayout::PageUnified { heads_per_group: 3 };
    let e = bad.validate().unwrap_err();
    assert_eq!(e.field, "memory_layout.page_unified.heads_per_group");
    assert!(e.problem.contains("3 does not divide the 4 heads"), "{e}");
    bad.memory_layout = MemoryLayout::PageUnified { heads_per_group: 0 };
    assert!(bad.validate().unwrap_err().problem.contains("got 0"));
    let mut bad = g.clone();
    bad.buffers[1].layers = 2;
    let e = bad.validate().unwrap_err();
    assert!(e.problem.contains("2 layers"), "{e}");
}

/// vLLM 0.33 `KVCacheLayout` (`vllm/v1/kv_cache_layout.py`): the logical cache is
/// `[L, B, H, N, C]`, each member a stride permutation. With L 3 layers, B 5 blocks, H 2 heads,
/// N 4 tokens, C = K 2 + V 2 bf16 (8 B):
/// - LHBNC, physical `[L, H, B, N, C]`: strides C 2, N 8, B 32, H 5 x 32 = 160, L 2 x 160 = 320;
/// - BHLNC, physical `[B, H, L, N, C]`: strides C 2, N 8, L 32, H 3 x 32 = 96, B 2 x 96 = 192.
///
/// kvlayout reads the `kv` buffer as one section `[H, C]` in `head_major` pages (`[h][n][c]`,
/// canonical offset 32 h + 8 n + 2 c): LHBNC is `layer_head`, BHLNC is `page_head`.
#[test]
fn vllm_lhbnc_and_bhlnc_offsets() {
    let pool = |m| PoolGeometry {
        name: "vllm".into(),
        page_size_tokens: 4,
        pages: 5,
        memory_layout: m,
        buffers: vec![BufferGeometry::new(
            "kv",
            3,
            TokenLayout {
                arrangement: Arrangement::HeadMajor,
                sections: Cow::Owned(vec![Section::owned("kv", Dtype::Bf16, vec![2, 4])]),
                page_align_bytes: None,
                page_stride_bytes: None,
            },
        )],
    };
    let (lhbnc, bhlnc) = (pool(MemoryLayout::LayerHead), pool(MemoryLayout::PageHead));
    lhbnc.validate().unwrap();
    bhlnc.validate().unwrap();
    assert_eq!(lhbnc.total_bytes(), Ok(3 * 5 * 2 * 4 * 8));
    for l in 0..3 {
        for b in 0..5 {
            for h in 0..2 {
                for n in 0..4 {
                    for c in 0..4 {
                        let canonical = 32 * h + 8 * n + 2 * c;
                        assert_eq!(
                            pool_offset_of(&lhbnc, 0, l, b, canonical),
                            320 * l + 160 * h + 32 * b + 8 * n + 2 * c
                        );
                        assert_eq!(
                            pool_offset_of(&bhlnc, 0, l, b, canonical),
                            192 * b + 96 * h + 32 * l + 8 * n + 2 * c
                        );
                    }
                }
            }
        }
    }
    // layer_head's placement: head h of block b of layer l at 320 l + 160 h + 32 b.
    let p = lhbnc.placement(0).unwrap();
    assert_eq!(
        (p.page_step_bytes, p.head_step_bytes, p.layer_step_bytes),
        (32, 160, 320)
    );
}

/// The new layouts in geometry files: `layer_head` is a name every schema reads;
/// `page_unified` carries `heads_per_group`, which only v3 can write, and a bare name is refused
/// naming the parameter. Written files read back equal, and the storage fingerprint tells the
/// group sizes apart while v1's layouts keep theirs.
#[test]
fn new_memory_layouts_in_geometry_files() {
    let text = |schema: &str, layout: &str| {
        format!(
            r#"{{"schema": "kvlayout.geometry/{schema}", "page_size_tokens": 2, "pages": 5,
            "memory_layout": {layout}, "buffers": [
            {{"name": "k", "layers": 3, "arrangement": "token_major",
              "sections": [{{"name": "k", "dtype": "bf16", "shape": [4, 2]}}]}},
            {{"name": "v", "layers": 3, "arrangement": "token_major",
              "sections": [{{"name": "v", "dtype": "bf16", "shape": [4, 2]}}]}}]}}"#
        )
    };
    for schema in ["v1", "v2", "v3"] {
        let g = file::from_json(&text(schema, r#""layer_head""#)).unwrap();
        assert_eq!(g.memory_layout, MemoryLayout::LayerHead);
    }
    let unified = r#"{"page_unified": {"heads_per_group": 2}}"#;
    let g = file::from_json(&text("v3", unified)).unwrap();
    assert_eq!(
        g.memory_layout,
        MemoryLayout::PageUnified { heads_per_group: 2 }
    );
    let written = file::to_json(&g);
    assert!(written.contains("kvlayout.geometry/v3"), "{written}");
    assert_eq!(file::from_json(&written).unwrap(), g);
    for schema in ["v1", "v2"] {
        let e = file::from_json(&text(schema, unified)).unwrap_err();
        assert!(
            e.to_string()
                .contains("memory_layout page_unified: needs \"schema\": \"kvlayout.geometry/v3\""),
            "{e}"
        );
    }
    let e = file::from_json(&text("v3", r#""page_unified""#)).unwrap_err();
    assert!(
        e.to_string()
            .contains("page_unified needs its heads_per_group"),
        "{e}"
    );
    let e = file::from_json(&text("v3", r#"{"page_unified": {"heads": 2}}"#)).unwrap_err();
    assert!(e.to_string().contains("heads"), "{e}");
    // Storage fingerprints: FNV(str("kvlayout.storage/v1"), u64(pool), u64(6), u64(2)).
    let storage = fnv_u64(
        fnv_u64(
            fnv_u64(
                fnv_str(0xcbf2_9ce4_8422_2325, "kvlayout.storage/v1"),
                g.fingerprint().unwrap(),
            ),
            6,
        ),
        2,
    );
    assert_eq!(g.storage_fingerprint(), Ok(storage));
    // The value layout-core/tests/fingerprint_reference.py recomputes in Python.
    assert_eq!(storage, 0x4a87_4bbd_0034_75ad);
    let mut one_group = g.clone();
    one_group.memory_layout = MemoryLayout::PageUnified { heads_per_group: 4 };
    assert_ne!(one_group.storage_fingerprint(), g.storage_fingerprint());
    assert_eq!(
        one_group.fingerprint(),
        g.fingerprint(),
        "pool level ignores the layout"
    );
    let lines = kvlayout_core::compare_at(&g, &one_group, kvlayout_core::Level::Storage)
        .unwrap_err()
        .lines();
    assert_eq!(
        lines,
        vec!["memory_layout: page_unified (2 heads per group), page_unified (4 heads per group)"]
    );
}

/// SGLang 0.5.23's MHA `page_head` host (`python/sglang/srt/mem_cache/pool_host/mha.py`,
/// `init_kv_buffer`): `kv_buffer` of shape `(2, page_num, head_num, page_size, layer_num,
/// head_dim)`, C-contiguous: per K or V, `[page][head][token][layer][dim]`. With 4 heads, head_dim
/// 2 bf16, 3 layers, 2-token pages, 5 pages the byte strides are, innermost first: dim 2, layer
/// 4, token 3 x 4 = 12, head 2 x 12 = 24, page 4 x 24 = 96, K/V 5 x 96 = 480. kvlayout's
/// `page_head` (`[page][head][layer][token]`, vLLM's BHLNC) is another order; this is
/// `page_head_token`.
#[test]
fn page_head_token_offsets_are_sglangs_page_head() {
    let g = PoolGeometry {
        name: "sglang page_head".into(),
        page_size_tokens: 2,
        pages: 5,
        memory_layout: MemoryLayout::PageHeadToken,
        buffers: vec![mha_side("k", 4, 2), mha_side("v", 4, 2)],
    };
    g.validate().unwrap();
    assert_eq!(g.total_bytes(), Ok(2 * 480));
    for (b, kv) in [(0usize, 0u64), (1, 480)] {
        for p in 0..5 {
            for l in 0..3 {
                for t in 0..2 {
                    for h in 0..4 {
                        for d in 0..2 {
                            let canonical = 16 * t + 4 * h + 2 * d;
                            let sglang = kv + 96 * p + 24 * h + 12 * t + 4 * l + 2 * d;
                            assert_eq!(pool_offset_of(&g, b, l, p, canonical), sglang);
                        }
                    }
                }
            }
        }
    }
    // A head's page of one layer: 2 runs (tokens) of one head row (4 B), 12 B apart.
    let p = g.placement(0).unwrap();
    assert_eq!(
        (p.heads, p.runs, p.run_bytes, p.run_step_bytes),
        (4, 2, 4, 12)
    );
    assert_eq!(
        (p.page_step_bytes, p.head_step_bytes, p.layer_step_bytes),
        (96, 24, 4)
    );
    // kvlayout's page_head places layer 1 of head 0 after head 0's 2 tokens of layer 0.
    let mut ph = g.clone();
    ph.memory_layout = MemoryLayout::PageHead;
    assert_eq!(pool_offset_of(&ph, 0, 1, 0, 0), 2 * 4);
    assert_eq!(pool_offset_of(&g, 0, 1, 0, 0), 4);
}
