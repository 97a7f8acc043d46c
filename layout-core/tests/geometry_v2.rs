//! `kvlayout.geometry/v2`: reading, validation, writing, compare levels, totals, and checked
//! offsets on unvalidated geometries. Expected sizes are written as their formulas.

use kvlayout_core::formats::{INDEX_K_FP8, MHA_BF16_8X128};
use kvlayout_core::{
    Attention, BufferGeometry, Level, MemoryLayout, PoolGeometry, Shard, ShardSplit, compare,
    compare_at, file,
};

fn case(name: &str, side: &str) -> PoolGeometry {
    let path = format!(
        "{}/../cli/tests/shared-cases/{name}/{side}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    file::from_json(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn case_text(name: &str, side: &str) -> String {
    let path = format!(
        "{}/../cli/tests/shared-cases/{name}/{side}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn pool(page_size_tokens: u64, buffers: Vec<BufferGeometry>) -> PoolGeometry {
    PoolGeometry {
        name: "t".into(),
        page_size_tokens,
        pages: 8,
        memory_layout: MemoryLayout::LayerFirst,
        buffers,
    }
}

#[test]
fn v2_fields_are_read() {
    let g = case("15-gpt-oss-sliding-group-missing", "a");
    assert_eq!(g.buffers[0].attention, Attention::Full);
    assert_eq!(
        g.buffers[1].attention,
        Attention::SlidingWindow { window_tokens: 128 }
    );
    let g = case("21-mamba-side-states-missing-on-host", "a");
    assert!(g.buffers.iter().all(|b| b.attention == Attention::State));
    // A state page is one slot: ple_conv holds 10240 x 9 bf16 = 184,320 B per slot per layer.
    assert_eq!(g.buffer_page_size_tokens(2), Ok(1));
    assert_eq!(g.page_geometry(2).unwrap().page_stride_bytes, 10240 * 9 * 2);
    let g = case("22-hetero-tp-1-to-2-token-level", "b");
    assert_eq!(g.buffers[0].shard, Some(Shard::replicated(2, 0)));
    assert_eq!(g.buffers[1].shard, Some(Shard::heads(2, 0, 8)));
}

#[test]
fn v1_files_read_as_before_with_the_same_pool_fingerprint() {
    // DeepSeek-V3.2 fp8 latent + fp8 index-K: the fingerprint in storage keys built on v1.
    let v1 = case("14-namespace-label-only-same-geometry", "a");
    assert_eq!(v1.fingerprint(), Ok(0xeb01_9e4f_84ee_0658));
    // The same content declared as v2 has the same fingerprint and writes back as v1.
    let text = case_text("14-namespace-label-only-same-geometry", "a")
        .replace("kvlayout.geometry/v1", "kvlayout.geometry/v2");
    let v2 = file::from_json(&text).unwrap();
    assert_eq!(v2.fingerprint(), v1.fingerprint());
    assert!(file::to_json(&v2).contains("\"kvlayout.geometry/v1\""));
    // Explicitly "full" and a page size equal to the pool's are the v1 meaning.
    let mut g = v1.clone();
    g.buffers[0].page_size_tokens = Some(g.page_size_tokens);
    assert_eq!(g.fingerprint(), v1.fingerprint());
    assert_eq!(compare(&g, &v1), Ok(()));
}

#[test]
fn the_writer_emits_v2_only_when_needed_and_round_trips_every_field() {
    let mut kv = BufferGeometry::new("kv", 2, MHA_BF16_8X128)
        .with_page_size_tokens(32)
        .with_attention(Attention::Chunked { chunk_tokens: 8192 })
        .with_layer_ids(vec![1, 3])
        .with_shard(Shard::heads(2, 1, 16));
    let mut sections = kv.layout.sections().to_vec();
    sections[1] = sections[1].clone().with_order("swizzle_4x");
    kv.layout.sections = sections.into();
    let g = pool(16, vec![kv, BufferGeometry::new("index_k", 2, INDEX_K_FP8)]);
    g.validate().unwrap();
    let text = file::to_json(&g);
    assert!(text.contains("\"kvlayout.geometry/v2\""), "{text}");
    assert!(text.contains("\"chunk_tokens\": 8192"), "{text}");
    assert!(text.contains("\"order\": \"swizzle_4x\""), "{text}");
    assert_eq!(file::from_json(&text).unwrap(), g);
    let v1 = pool(16, vec![BufferGeometry::new("index_k", 2, INDEX_K_FP8)]);
    assert!(file::to_json(&v1).contains("\"kvlayout.geometry/v1\""));
}

#[test]
fn a_v1_file_with_a_v2_field_names_the_field_and_the_schema() {
    let base = case_text("14-namespace-label-only-same-geometry", "a");
    let err = |from: &str, to: &str| {
        let text = base.replacen(from, to, 1);
        assert_ne!(text, base, "{from}");
        file::from_json(&text).unwrap_err().to_string()
    };
    let e = err(
        "\"layers\": 61,",
        "\"layers\": 61, \"attention\": \"state\",",
    );
    assert!(
        e.contains("attention") && e.contains("kvlayout.geometry/v2"),
        "{e}"
    );
    let e = err("\"dtype\": \"bf16\"", "\"dtype\": \"i64\"");
    assert!(e.contains("dtype i64") && e.contains("geometry/v2"), "{e}");
}

/// Case 22 B with `edit` applied to buffer `fa` (index 1), read back: the error text.
fn fa_error(edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut v: serde_json::Value =
        serde_json::from_str(&case_text("22-hetero-tp-1-to-2-token-level", "b")).unwrap();
    edit(&mut v["buffers"][1]);
    file::from_json(&v.to_string()).unwrap_err().to_string()
}

#[test]
fn v2_rules_are_refused_naming_the_field() {
    use serde_json::json;
    let e = fa_error(|b| b["shard"]["rank"] = json!(2));
    assert!(e.contains("shard.rank") && e.contains("tp_size 2"), "{e}");
    let e = fa_error(|b| b["shard"]["heads_total"] = json!(7));
    assert!(e.contains("heads_total 7"), "{e}");
    // heads_total 16 / tp_size 2 = 8 heads per rank; the shapes say [4, 128].
    let e = fa_error(|b| b["shard"]["heads_total"] = json!(16));
    assert!(
        e.contains("sections[0] (k).shape") && e.contains("= 8, got 4"),
        "{e}"
    );
    let e = fa_error(|b| {
        b["shard"].as_object_mut().unwrap().remove("heads_total");
    });
    assert!(e.contains("heads_total") && e.contains("missing"), "{e}");
    let e = fa_error(|b| b["shard"]["split"] = json!("replicated"));
    assert!(e.contains("heads_total 8 given with split"), "{e}");
    let e = fa_error(|b| b["shard"]["split"] = json!("rows"));
    assert!(e.contains("shard.split") && e.contains("rows"), "{e}");
    let e = fa_error(|b| b["shard"]["ranks"] = json!(1));
    assert!(e.contains("ranks"), "{e}");
    let e = fa_error(|b| b["attention"] = json!({"sliding_window_tokens": 0}));
    assert!(
        e.contains("sliding_window_tokens: must be at least 1"),
        "{e}"
    );
    let e = fa_error(|b| b["attention"] = json!({"chunk_tokens": -1}));
    assert!(e.contains("chunk_tokens") && e.contains("-1"), "{e}");
    let e = fa_error(|b| b["attention"] = json!("global"));
    assert!(e.contains("attention") && e.contains("global"), "{e}");
    let e = fa_error(|b| b["layer_ids"] = json!([0, 1]));
    assert!(
        e.contains("layer_ids") && e.contains("2 ids for 4 layers"),
        "{e}"
    );
    let e = fa_error(|b| b["layer_ids"] = json!([0, 1, 2, 2]));
    assert!(e.contains("layer 2 listed twice"), "{e}");
    let e = fa_error(|b| b["page_size_tokens"] = json!(0));
    assert!(e.contains("page_size_tokens: must be at least 1"), "{e}");
    let e = fa_error(|b| b["sections"][0]["order"] = json!(""));
    assert!(e.contains("order: must not be empty"), "{e}");
    // A state buffer has no token axis: no page size of its own.
    let e = fa_error(|b| {
        b["attention"] = json!("state");
        b["page_size_tokens"] = json!(16);
    });
    assert!(e.contains("no token axis"), "{e}");
}

/// Regression: a heads split of a section whose one head is not whole bytes was accepted
/// (head_major and page_head refuse the same shape), so a per-rank copy was planned short:
/// `[4, 3]` f4e2m1 is 4 heads x 3 x 4 bits = 12 bits = 1.5 B per head.
#[test]
fn a_heads_split_of_sub_byte_heads_is_refused() {
    use serde_json::json;
    let e = fa_error(|b| {
        for s in 0..2 {
            b["sections"][s]["dtype"] = json!("f4e2m1");
            b["sections"][s]["shape"] = json!([4, 3]);
        }
    });
    let head_bits = 3 * 4;
    assert!(
        e.contains("buffers[1] (fa).sections[0] (k).shape")
            && e.contains(&format!("= {head_bits} bits"))
            && e.contains("not whole bytes"),
        "{e}"
    );
    // 4 e2m1 per head = 16 bits = 2 B: whole bytes, accepted (4 heads x 2 B x 2 sections).
    let mut v: serde_json::Value =
        serde_json::from_str(&case_text("22-hetero-tp-1-to-2-token-level", "b")).unwrap();
    for s in 0..2 {
        v["buffers"][1]["sections"][s]["dtype"] = json!("f4e2m1");
        v["buffers"][1]["sections"][s]["shape"] = json!([4, 4]);
    }
    let g = file::from_json(&v.to_string()).unwrap();
    assert_eq!(
        g.buffers[1].layout.bytes_per_token(),
        Ok(2 * 4 * (4 * 4 / 8))
    );
    // Without a shard the same [4, 3] f4e2m1 section is 12 x 4 bits = 6 B: no head split asked.
    v["buffers"][1]["sections"][0]["shape"] = json!([4, 3]);
    v["buffers"][1]["sections"][1]["shape"] = json!([4, 3]);
    v["buffers"][1].as_object_mut().unwrap().remove("shard");
    let g = file::from_json(&v.to_string()).unwrap();
    assert_eq!(
        g.buffers[1].layout.bytes_per_token(),
        Ok(2 * (4 * 3 * 4 / 8))
    );
}

/// Regression: two pools of state buffers only (slots, no token axis) differing only in the
/// pool's page size were reported as `page_size_tokens: 16, 64` at pool and storage level.
#[test]
fn a_state_only_pool_has_no_page_size_to_compare() {
    use kvlayout_core::{Arrangement, Dtype, Section, TokenLayout};
    const H: &[Section] = &[Section::new("h", Dtype::F32, &[8, 128, 128])];
    let state = |name: &'static str| {
        BufferGeometry::new(name, 30, TokenLayout::new(Arrangement::TokenMajor, H))
            .with_attention(Attention::State)
    };
    let a = pool(16, vec![state("temporal")]);
    let b = pool(64, vec![state("temporal")]);
    assert!(!a.has_token_axis());
    assert_eq!(compare_at(&a, &b, Level::Pool), Ok(()));
    assert_eq!(compare_at(&a, &b, Level::Storage), Ok(()));
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_eq!(a.storage_fingerprint(), b.storage_fingerprint());
    // With a token buffer beside the state one, the pool's page size matters again.
    let full = || BufferGeometry::new("kv", 10, MHA_BF16_8X128);
    let c = pool(16, vec![state("temporal"), full()]);
    let d = pool(64, vec![state("temporal"), full()]);
    assert!(c.has_token_axis());
    let m = compare_at(&c, &d, Level::Pool).unwrap_err();
    assert!(
        m.lines().contains(&"page_size_tokens: 16, 64".to_string()),
        "{m}"
    );
    assert_ne!(c.fingerprint(), d.fingerprint());
}

#[test]
fn each_level_compares_what_it_says() {
    // Case 19/20: memory layouts differ; compatible as pools, not as stored objects.
    let (a, b) = (
        case("19-storage-cross-layer-vs-per-layer", "a"),
        case("19-storage-cross-layer-vs-per-layer", "b"),
    );
    assert_eq!(compare_at(&a, &b, Level::Pool), Ok(()));
    assert_eq!(compare_at(&a, &b, Level::Token), Ok(()));
    let m = compare_at(&a, &b, Level::Storage).unwrap_err();
    assert_eq!(m.lines(), ["memory_layout: page_first_direct, layer_first"]);
    assert_eq!(a.fingerprint(), b.fingerprint());
    assert_ne!(a.storage_fingerprint(), b.storage_fingerprint());
    // Case 22: TP1 vs TP2 rank 0. Per head equal: token-compatible with equal token
    // fingerprints; as pools the shards and page bytes differ.
    let (a, b) = (
        case("22-hetero-tp-1-to-2-token-level", "a"),
        case("22-hetero-tp-1-to-2-token-level", "b"),
    );
    assert_eq!(compare_at(&a, &b, Level::Token), Ok(()));
    assert_eq!(a.token_fingerprints(), b.token_fingerprints());
    let m = compare(&a, &b).unwrap_err();
    assert!(m.names("mla.shard") && m.names("fa.shard"), "{m}");
    // fa: 2 x 8 heads x 128 x 2 B = 4096 B/token at TP1, 2 x 4 x 128 x 2 = 2048 at TP2.
    assert!(
        m.lines().contains(&format!(
            "fa.bytes_per_token: {}, {}",
            2 * 8 * 128 * 2,
            2 * 4 * 128 * 2
        )),
        "{m}"
    );
    // Token level still needs equal heads_total and equal page sizes for section_major.
    let mut c = b.clone();
    c.buffers[1].shard = Some(Shard::heads(2, 0, 8));
    c.page_size_tokens = 32;
    let m = compare_at(&a, &c, Level::Token).unwrap_err();
    // The criterion, then the sizes as context (per rank: 4096 vs 2048 B/token; pages of 16
    // and 32 tokens: 16 x 4096 = 32 x 2048).
    assert_eq!(
        m.lines(),
        [
            "fa.page_size_tokens: 16, 32".to_string(),
            format!(
                "fa.bytes_per_token: {}, {}",
                2 * 8 * 128 * 2,
                2 * 4 * 128 * 2
            ),
        ]
    );
    let mut d = b.clone();
    d.buffers[1].shard = Some(Shard {
        tp_size: 2,
        rank: 0,
        split: ShardSplit::Replicated,
    });
    let m = compare_at(&a, &d, Level::Token).unwrap_err();
    assert!(m.names("fa.shard.split"), "{m}");
}

#[test]
fn attention_layer_ids_and_order_at_the_pool_level() {
    let a = case("15-gpt-oss-sliding-group-missing", "a");
    let mut b = a.clone();
    b.buffers[1].attention = Attention::SlidingWindow { window_tokens: 256 };
    let m = compare(&a, &b).unwrap_err();
    assert!(
        m.lines().contains(
            &"swa.attention: sliding_window_tokens 128, sliding_window_tokens 256".into()
        ),
        "{m}"
    );
    assert_ne!(a.fingerprint(), b.fingerprint());
    // layer_ids: compared only when both sides give them.
    let mut c = a.clone();
    c.buffers[1].layer_ids = Some((0..12).map(|i| 2 * i).collect());
    assert_eq!(compare(&a, &c), Ok(()));
    let mut d = c.clone();
    d.buffers[1].layer_ids = Some((0..12).map(|i| 2 * i + 1).collect());
    assert!(compare(&c, &d).unwrap_err().names("swa.layer_ids"));
    assert_ne!(c.fingerprint(), d.fingerprint());
    // A section order is compared as a name.
    let mut e = a.clone();
    let mut s = e.buffers[0].layout.sections().to_vec();
    s[0] = s[0].clone().with_order("swizzle");
    e.buffers[0].layout.sections = s.into();
    let m = compare(&a, &e).unwrap_err();
    assert_eq!(m.lines(), ["full.sections[0].order: linear, swizzle"]);
}

/// An explicit `"order": "linear"` is the default order (diff prints absent as `linear`), so it
/// must not change a fingerprint (hostile review: every fingerprint changed while `check` found
/// the files compatible). The file without it is the v1 content of llama-3.1-8b's pool.
#[test]
fn an_explicit_linear_order_is_absent_at_every_level() {
    let text = |order: &str| {
        format!(
            r#"{{"schema": "kvlayout.geometry/v2", "name": "n", "page_size_tokens": 64, "pages": 1024,
                "memory_layout": "layer_first", "buffers": [{{"name": "kv", "layers": 32,
                "arrangement": "section_major", "sections": [
                {{"name": "k", "dtype": "bf16", "shape": [8, 128]{order}}},
                {{"name": "v", "dtype": "bf16", "shape": [8, 128]}}]}}]}}"#
        )
    };
    let plain = file::from_json(&text("")).unwrap();
    let linear = file::from_json(&text(r#", "order": "linear""#)).unwrap();
    assert_eq!(linear.buffers[0].layout.sections()[0].order(), None);
    for level in [Level::Pool, Level::Storage, Level::Token] {
        assert_eq!(compare_at(&plain, &linear, level), Ok(()));
    }
    assert_eq!(plain.fingerprints(), linear.fingerprints());
    // The same content as a v1 file (no v2 field): the same pool fingerprint.
    let v1 = file::from_json(&text("").replace("geometry/v2", "geometry/v1")).unwrap();
    assert_eq!(v1.fingerprints(), linear.fingerprints());
    // Written back, the order is absent; another name still counts.
    assert!(!file::to_json(&linear).contains("order"));
    let swizzled = file::from_json(&text(r#", "order": "swizzle""#)).unwrap();
    assert_ne!(swizzled.fingerprint(), linear.fingerprint());
    let token = |g: &PoolGeometry| g.token_fingerprints()[0].1;
    assert_ne!(token(&swizzled), token(&linear));
    // The builder reads "linear" the same way.
    let s = linear.buffers[0].layout.sections()[1].clone();
    assert_eq!(s.with_order("linear").order(), None);
    // Regression (hostile review, session 8): "linear" set on the public field (not through the
    // reader or the builder) still changed every fingerprint while comparing equal.
    let mut by_field = plain.clone();
    let mut sections = by_field.buffers[0].layout.sections().to_vec();
    sections[0].order = Some("linear".into());
    by_field.buffers[0].layout.sections = std::borrow::Cow::Owned(sections);
    assert_eq!(by_field.buffers[0].layout.sections()[0].order(), None);
    assert_eq!(by_field.fingerprints(), plain.fingerprints());
    assert_eq!(compare_at(&plain, &by_field, Level::Pool), Ok(()));
}

/// The `--totals` figures (docs/DESIGN.md), by hand. gpt-oss-20b (case 15 A): 12 full + 12 sliding layers
/// of 2 (K, V) x 8 KV heads x 64 x 2 B (bf16) = 2,048 B/token/layer; window 128.
#[test]
fn totals_of_a_hybrid_pool() {
    let g = case("15-gpt-oss-sliding-group-missing", "a");
    let t = g.totals().unwrap();
    assert_eq!(t.full_bytes_per_token, 12 * (2 * 8 * 64 * 2));
    assert_eq!(t.window_bytes_per_request_max, 12 * (2 * 8 * 64 * 2) * 128);
    assert_eq!(t.state_bytes_per_request, 0);
    // Case 21 A: per layer conv 8192 x 3 bf16 + ssm 32 x 128 x 128 f32 + ple_conv 10240 x 9
    // bf16 + ple_ngram 2 i64; 36 layers each.
    let g = case("21-mamba-side-states-missing-on-host", "a");
    let per_layer = 8192 * 3 * 2 + 32 * 128 * 128 * 4 + 10240 * 9 * 2 + 2 * 8;
    assert_eq!(g.totals().unwrap().state_bytes_per_request, 36 * per_layer);
    assert_eq!(g.totals().unwrap().full_bytes_per_token, 0);
}

/// Public offset methods on a never-validated geometry with layers = 2^61 used
/// unchecked `*`/`+` (a debug panic, a wrapped offset in release). Every one is an error now.
#[test]
fn overflowing_unvalidated_geometry_is_an_error_not_a_wrap() {
    for memory_layout in MemoryLayout::ALL {
        let g = PoolGeometry {
            name: "probe".into(),
            page_size_tokens: 64,
            pages: 4,
            memory_layout,
            buffers: vec![BufferGeometry::new("kv", 1 << 61, MHA_BF16_8X128)],
        };
        assert!(g.validate().is_err(), "{memory_layout}");
        assert!(g.total_bytes().is_err(), "{memory_layout}");
        assert!(g.buffer_bytes(0).is_err(), "{memory_layout}");
        assert!(g.page_group_bytes().is_err(), "{memory_layout}");
        assert!(g.bytes_per_token_all_layers().is_err(), "{memory_layout}");
        // Even a small offset: the pool's bytes do not fit in 64 bits, so no offset into it
        // (nor offset + length) is trusted.
        let e = g.page_segments(0, 0, 1).unwrap_err();
        assert!(e.to_string().contains("overflow"), "{memory_layout}: {e}");
        let last = (1u64 << 61) - 1;
        assert!(g.page_offset_bytes(0, last, 3).is_err(), "{memory_layout}");
        assert!(g.page_segments(0, last, 3).is_err(), "{memory_layout}");
    }
    // A zero head count under page_head is an error, not a division by zero.
    let mut g = pool(16, vec![BufferGeometry::new("kv", 1, MHA_BF16_8X128)]);
    g.memory_layout = MemoryLayout::PageHead;
    let mut s = g.buffers[0].layout.sections().to_vec();
    s[0].shape = vec![0, 128].into();
    s[1].shape = vec![0, 128].into();
    g.buffers[0].layout.sections = s.into();
    assert!(g.page_head_heads(0).is_err());
    assert!(g.page_segments(0, 0, 0).is_err());
}

/// A buffer's own page size drives its page geometry and offsets (vLLM hybrid groups).
#[test]
fn a_buffer_page_size_overrides_the_pool() {
    let g = pool(
        16,
        vec![
            BufferGeometry::new("kv", 2, MHA_BF16_8X128),
            BufferGeometry::new("idx", 2, INDEX_K_FP8).with_page_size_tokens(64),
        ],
    );
    g.validate().unwrap();
    // kv: 16 x 4096; idx: 64 x 132.
    assert_eq!(g.page_geometry(0).unwrap().page_stride_bytes, 16 * 4096);
    assert_eq!(g.page_geometry(1).unwrap().page_stride_bytes, 64 * 132);
    // layer_first: idx starts after kv's 2 layers x 8 pages; its page 1 of layer 1 is slot 9.
    assert_eq!(
        g.page_offset_bytes(1, 1, 1),
        Ok(2 * 8 * 16 * 4096 + 9 * 64 * 132)
    );
}
