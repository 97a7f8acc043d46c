//! Geometry v3: compressed rows (`compress_ratio`), heads replicated over ranks, and
//! `split_groups`. Every figure is worked by hand in the comments from the layout's formula and
//! the engine source it follows.

use kvlayout_core::{
    Arrangement, BufferGeometry, Dtype, Level, MemoryLayout, PoolGeometry, Section, Shard,
    TokenLayout, compare_at, file, sections,
};

/// DeepSeek-V4 C4 lightning-indexer K (SGLang `DeepSeekV4IndexerPool`,
/// `get_dsv4_indexer_bytes_per_token` = 128 + 128 // 128 * 4 = 132 B per compressed row):
/// values then scales inside a page (`section_major`), as the V3.2 indexer.
const INDEX_K_ROW: TokenLayout = TokenLayout::new(
    Arrangement::SectionMajor,
    sections![
        Section::new("values", Dtype::F8E4M3, &[128]),
        Section::scale_of("scale", Dtype::F32, &[1], 0, 128),
    ],
);

fn pool(page_size_tokens: u64, buffers: Vec<BufferGeometry>) -> PoolGeometry {
    PoolGeometry {
        name: "v3".into(),
        page_size_tokens,
        pages: 1024,
        memory_layout: MemoryLayout::LayerFirst,
        buffers,
    }
}

fn c4_indexer(compress_ratio: u64) -> PoolGeometry {
    pool(
        64,
        vec![BufferGeometry::new("index_k", 21, INDEX_K_ROW).with_compress_ratio(compress_ratio)],
    )
}

#[test]
fn a_compressed_page_holds_page_tokens_over_r_rows() {
    let g = c4_indexer(4);
    g.validate().unwrap();
    let pg = g.page_geometry(0).unwrap();
    // 64 tokens / R 4 = 16 rows of 132 B: 16 x 128 = 2,048 B of values + 16 x 4 = 64 B of scales.
    assert_eq!(pg.rows_per_page, 16);
    assert_eq!(pg.compress_ratio, 4);
    assert_eq!(pg.page_size_tokens, 64);
    assert_eq!(pg.bytes_per_token, 132);
    assert_eq!(pg.page_payload_bytes, 2_048 + 64);
    assert_eq!(pg.page_stride_bytes, 2_112);
    assert_eq!(g.buffer_page_rows(0), Ok(16));
    assert_eq!(g.buffer_page_size_tokens(0), Ok(64));
    // layer_first: layer 1 starts after 1,024 pages of 2,112 B.
    assert_eq!(g.page_offset_bytes(0, 1, 0), Ok(1_024 * 2_112));
    // 21 layers x 1,024 pages x 2,112 B.
    assert_eq!(g.total_bytes(), Ok(21 * 1_024 * 2_112));
    // Row 15's scale: after 16 rows of values (2,048 B), 15 x 4 B in.
    assert_eq!(
        g.buffers[0].layout.offset_bytes(1, 15, 0, 16),
        Ok(2_048 + 60)
    );
}

#[test]
fn a_padded_compressed_row_pads_the_page_of_rows() {
    // DeepSeek-V4 FlashMLA record (SGLang DeepSeekV4SingleKVPool.get_bytes_per_token): 448 e4m3
    // + 64 bf16 (128 B) + 7 ue8m0 + 1 pad = 584 B; page padded to a multiple of 576. A C4 page
    // of 256 tokens: 64 rows x 584 = 37,376 B -> 65 x 576 = 37,440 B.
    let g = pool(
        256,
        vec![
            BufferGeometry::new("c4_kv", 21, kvlayout_core::formats::DSV4_MLA_FP8)
                .with_compress_ratio(4),
        ],
    );
    let pg = g.page_geometry(0).unwrap();
    assert_eq!(pg.bytes_per_token, 448 + 128 + 7 + 1);
    assert_eq!(pg.rows_per_page, 64);
    assert_eq!(pg.page_payload_bytes, 64 * 584);
    assert_eq!(pg.page_stride_bytes, 65 * 576);
}

#[test]
fn a_ratio_that_does_not_divide_the_page_is_refused_naming_both_values() {
    let e = c4_indexer(3).validate().unwrap_err();
    assert_eq!(e.field, "buffers[0] (index_k).compress_ratio");
    assert!(
        e.problem.contains("compress_ratio 3") && e.problem.contains("64"),
        "{e}"
    );
    // Own page size: 48 tokens, R 32 does not divide.
    let g = pool(
        64,
        vec![
            BufferGeometry::new("index_k", 21, INDEX_K_ROW)
                .with_page_size_tokens(48)
                .with_compress_ratio(32),
        ],
    );
    let e = g.validate().unwrap_err();
    assert_eq!(e.field, "buffers[0] (index_k).compress_ratio");
    assert!(e.problem.contains("32") && e.problem.contains("48"), "{e}");
    let e = c4_indexer(0).validate().unwrap_err();
    assert_eq!(e.field, "buffers[0] (index_k).compress_ratio");
    assert!(e.problem.contains("got 0"), "{e}");
    // A state slot has no token axis to compress.
    let g = pool(
        64,
        vec![
            BufferGeometry::new("ring", 1, INDEX_K_ROW)
                .with_attention(kvlayout_core::Attention::State)
                .with_compress_ratio(32),
        ],
    );
    let e = g.validate().unwrap_err();
    assert_eq!(e.field, "buffers[0] (ring).compress_ratio");
    assert!(
        e.problem.contains("state") && e.problem.contains("32"),
        "{e}"
    );
}

#[test]
fn compress_ratio_is_compared_at_every_level_with_row_bytes_and_r() {
    let (device, host) = (c4_indexer(4), c4_indexer(1));
    for level in Level::ALL {
        let m = compare_at(&device, &host, level).unwrap_err();
        let lines = m.lines();
        assert!(
            lines.contains(&"index_k.compress_ratio: 4, 1".to_string()),
            "{level}: {lines:?}"
        );
        // 132 B per row on both sides; one row per 4 tokens vs one per token.
        assert!(
            lines.contains(
                &"index_k.bytes_per_token: 132 B per 4 tokens, 132 B per token".to_string()
            ),
            "{level}: {lines:?}"
        );
        // 16 rows x 132 = 2,112 B vs 64 rows x 132 = 8,448 B.
        assert!(
            lines.contains(&"index_k.bytes_per_page: 2112, 8448".to_string()),
            "{level}: {lines:?}"
        );
    }
    let m = compare_at(&device, &host, Level::Pool).unwrap_err();
    assert_eq!(
        m.lines(),
        [
            "index_k.compress_ratio: 4, 1",
            "index_k.page_stride_bytes: 2112, 8448",
            "index_k.bytes_per_token: 132 B per 4 tokens, 132 B per token",
            "index_k.bytes_per_page: 2112, 8448",
        ]
    );
    // Equal R and rows: compatible, and the pool fingerprints agree.
    assert_eq!(compare_at(&device, &c4_indexer(4), Level::Pool), Ok(()));
    assert_eq!(device.fingerprint(), c4_indexer(4).fingerprint());
    assert_ne!(device.fingerprint(), host.fingerprint());
    assert_ne!(device.token_fingerprints(), host.token_fingerprints());
}

#[test]
fn a_buffer_on_one_side_prints_its_row_bytes_and_r() {
    let a = pool(
        256,
        vec![
            BufferGeometry::new("swa", 2, kvlayout_core::formats::DSV4_MLA_FP8),
            BufferGeometry::new("c4_kv", 21, kvlayout_core::formats::DSV4_MLA_FP8)
                .with_compress_ratio(4),
        ],
    );
    let b = pool(
        256,
        vec![BufferGeometry::new(
            "swa",
            2,
            kvlayout_core::formats::DSV4_MLA_FP8,
        )],
    );
    let m = compare_at(&a, &b, Level::Pool).unwrap_err();
    // 256 / 4 = 64 rows x 584 = 37,376 -> 37,440 (a multiple of 576).
    assert_eq!(
        m.lines(),
        ["c4_kv: present (584 B per 4 tokens, 37440 B/page of 256 tokens, 21 layers), missing"]
    );
}

#[test]
fn compressed_tokens_add_row_bytes_times_layers_over_r_to_the_totals() {
    let g = pool(
        256,
        vec![
            BufferGeometry::new("swa", 43, kvlayout_core::formats::DSV4_MLA_FP8),
            BufferGeometry::new("c4_index_k", 21, INDEX_K_ROW).with_compress_ratio(4),
            BufferGeometry::new("c128_kv", 20, kvlayout_core::formats::DSV4_MLA_FP8)
                .with_compress_ratio(128),
        ],
    );
    let t = g.totals().unwrap();
    // Full, R = 1: 43 x 584 = 25,112.
    assert_eq!(t.full_bytes_per_token, 43 * 584);
    // 132 x 21 / 4 = 693, plus 584 x 20 / 128 = 91.25.
    assert_eq!(t.compressed_bytes_per_token, 693.0 + 91.25);
    let e = g.bytes_per_token_all_layers().unwrap_err();
    assert_eq!(e.field, "buffers[1] (c4_index_k).compress_ratio");
}

/// Qwen3.5 full attention, one rank's shard: `heads` KV heads of 256 bf16 for K and V, values
/// then... K then V per page (`section_major`, SGLang's per-layer k_buffer / v_buffer).
fn qwen35(tp_size: u64, rank: u64, local_heads: u64) -> PoolGeometry {
    let sections = vec![
        Section::owned("k", Dtype::Bf16, vec![local_heads, 256]),
        Section::owned("v", Dtype::Bf16, vec![local_heads, 256]),
    ];
    let layout = TokenLayout {
        arrangement: Arrangement::SectionMajor,
        sections: sections.into(),
        page_align_bytes: None,
        page_stride_bytes: None,
    };
    pool(
        64,
        vec![
            BufferGeometry::new("full_attn", 10, layout).with_shard(Shard::heads(tp_size, rank, 2)),
        ],
    )
}

#[test]
fn fewer_heads_than_ranks_replicate_each_head_and_rank_r_holds_r_over_replicas() {
    // 2 KV heads on 4 ranks: replicas 4 / 2 = 2; rank r holds head r / 2 (vLLM
    // QKVParallelLinear: tp_rank // num_kv_head_replicas), never r % 2 (SGLang #23746).
    for (rank, head) in [(0, 0), (1, 0), (2, 1), (3, 1)] {
        let g = qwen35(4, rank, 1);
        g.validate().unwrap();
        let s = g.buffers[0].shard.unwrap();
        assert_eq!(s.replicas(), 2);
        assert_eq!(s.heads_held(), Some((head, head + 1)), "rank {rank}");
        assert_eq!(s.heads_total(), Some(2));
        // 1 head x 256 x 2 B = 512 B for K and for V; page 64 x 1,024 = 65,536 B.
        assert_eq!(g.page_geometry(0).unwrap().page_payload_bytes, 65_536);
    }
    // A plain split is unchanged: 2 heads on 2 ranks, rank 1 holds head 1.
    let s = qwen35(2, 1, 1).buffers[0].shard.unwrap();
    assert_eq!((s.replicas(), s.heads_held()), (1, Some((1, 2))));
}

#[test]
fn replicated_heads_need_one_head_axis_and_tp_size_a_multiple_of_heads() {
    let e = qwen35(4, 0, 2).validate().unwrap_err();
    assert_eq!(e.field, "buffers[0] (full_attn).sections[0] (k).shape");
    assert!(
        e.problem.contains("heads_total 2 < tp_size 4") && e.problem.contains("got 2"),
        "{e}"
    );
    // 3 heads on 4 ranks: 4 is no multiple of 3.
    let mut g = qwen35(4, 0, 1);
    g.buffers[0].shard = Some(Shard::heads(4, 0, 3));
    let e = g.validate().unwrap_err();
    assert_eq!(e.field, "buffers[0] (full_attn).shard.heads_total");
    assert!(
        e.problem.contains("heads_total 3") && e.problem.contains("tp_size 4"),
        "{e}"
    );
    // 6 heads on 4 ranks: above, not divisible.
    g.buffers[0].shard = Some(Shard::heads(4, 0, 6));
    let e = g.validate().unwrap_err();
    assert!(
        e.problem.contains("heads_total 6") && e.problem.contains("tp_size 4"),
        "{e}"
    );
}

#[test]
fn token_level_compares_which_head_a_replicated_rank_holds() {
    // Shared case 29: TP 2 rank 1 (head 1) and TP 4 rank 2 (head 2 / 2 = 1): compatible.
    assert_eq!(
        compare_at(&qwen35(2, 1, 1), &qwen35(4, 2, 1), Level::Token),
        Ok(())
    );
    // TP 1 holds both heads: every TP 4 rank's head is among them.
    for rank in 0..4 {
        assert_eq!(
            compare_at(&qwen35(1, 0, 2), &qwen35(4, rank, 1), Level::Token),
            Ok(())
        );
    }
    // TP 2 rank 0 (head 0) and TP 4 rank 2 (head 1): no head in common.
    let m = compare_at(&qwen35(2, 0, 1), &qwen35(4, 2, 1), Level::Token).unwrap_err();
    assert_eq!(
        m.lines(),
        [
            "full_attn.shard.heads_held: head 0 of 2 (tp_size 2 rank 0, 1 replicas), \
             head 1 of 2 (tp_size 4 rank 2, 2 replicas)"
        ]
    );
    // Two replicas of one head: equal token fingerprints; other heads: different ones.
    let fp = |tp, rank| qwen35(tp, rank, 1).token_fingerprints()[0].1;
    assert_eq!(fp(4, 2), fp(4, 3));
    assert_ne!(fp(4, 0), fp(4, 2));
    assert_eq!(
        compare_at(&qwen35(4, 0, 1), &qwen35(4, 2, 1), Level::Token)
            .unwrap_err()
            .lines()
            .len(),
        1
    );
    // Pool level: the shards differ (tp_size, rank).
    let m = compare_at(&qwen35(2, 1, 1), &qwen35(4, 2, 1), Level::Pool).unwrap_err();
    assert_eq!(
        m.lines()[0],
        "full_attn.shard: tp_size 2 rank 1 split heads of 2, \
         tp_size 4 rank 2 split heads of 2, head 1 on 2 replicas"
    );
}

/// Qwen3.5 gated-delta-net conv state (shared case 30): q 16 x 128 = 2,048, k 2,048, v 32 x 128
/// = 4,096 channels over the whole model, 3 state positions (kernel 4 - 1), bf16, one slot per
/// request; a rank of `tp` holds 8,192 / tp channels.
fn gdn_conv(tp_size: u64, rank: u64, groups: Vec<u64>) -> PoolGeometry {
    let section =
        Section::owned("conv", Dtype::Bf16, vec![8_192 / tp_size, 3]).with_split_groups(groups);
    let layout = TokenLayout {
        arrangement: Arrangement::TokenMajor,
        sections: vec![section].into(),
        page_align_bytes: None,
        page_stride_bytes: None,
    };
    pool(
        64,
        vec![
            BufferGeometry::new("conv", 30, layout)
                .with_attention(kvlayout_core::Attention::State)
                .with_shard(Shard::heads(tp_size, rank, 8_192)),
        ],
    )
}

#[test]
fn split_groups_are_checked_against_tp_size_and_heads_total() {
    let g = gdn_conv(2, 0, vec![2_048, 2_048, 4_096]);
    g.validate().unwrap();
    // 4,096 channels x 3 x 2 B = 24,576 B per slot per layer.
    assert_eq!(g.page_geometry(0).unwrap().page_payload_bytes, 24_576);
    // A group of 2,050 does not split over 4 ranks (2,050 / 4 = 512.5).
    let e = gdn_conv(4, 0, vec![2_050, 2_046, 4_096])
        .validate()
        .unwrap_err();
    assert_eq!(
        e.field,
        "buffers[0] (conv).sections[0] (conv).split_groups[0]"
    );
    assert!(
        e.problem.contains("2050") && e.problem.contains("tp_size 4"),
        "{e}"
    );
    // Groups summing to 8,000, not heads_total 8,192.
    let e = gdn_conv(2, 0, vec![2_048, 2_048, 3_904])
        .validate()
        .unwrap_err();
    assert_eq!(e.field, "buffers[0] (conv).sections[0] (conv).split_groups");
    assert!(
        e.problem.contains("8000") && e.problem.contains("8192"),
        "{e}"
    );
    // Only under a heads split.
    let mut g = gdn_conv(2, 0, vec![2_048, 2_048, 4_096]);
    g.buffers[0].shard = Some(Shard::replicated(2, 0));
    let e = g.validate().unwrap_err();
    assert_eq!(e.field, "buffers[0] (conv).sections[0] (conv).split_groups");
    assert!(e.problem.contains("split \"heads\""), "{e}");
    g.buffers[0].shard = None;
    assert!(g.validate().unwrap_err().problem.contains("absent"));
}

#[test]
fn split_groups_are_compared_and_map_between_tp_sizes_at_token_level() {
    let groups = vec![2_048, 2_048, 4_096];
    // Shared case 30: TP 2 rank 0 and TP 4 rank 0, same groups: compatible at token level.
    assert_eq!(
        compare_at(
            &gdn_conv(2, 0, groups.clone()),
            &gdn_conv(4, 0, groups.clone()),
            Level::Token
        ),
        Ok(())
    );
    // The same channels in another grouping (k|q|v as v|q|k): a differing field.
    let other = vec![4_096, 2_048, 2_048];
    let m = compare_at(
        &gdn_conv(2, 0, groups.clone()),
        &gdn_conv(2, 0, other),
        Level::Token,
    )
    .unwrap_err();
    assert_eq!(
        m.lines(),
        ["conv.sections[0].split_groups: [2048, 2048, 4096], [4096, 2048, 2048]"]
    );
    assert_ne!(
        gdn_conv(2, 0, groups.clone()).fingerprint(),
        gdn_conv(2, 0, vec![4_096, 2_048, 2_048]).fingerprint()
    );
}

#[test]
fn v3_files_round_trip_and_the_writer_keeps_v1_and_v2_schemas_when_no_v3_field_is_used() {
    for g in [
        c4_indexer(4),
        qwen35(4, 2, 1),
        gdn_conv(4, 1, vec![2_048, 2_048, 4_096]),
    ] {
        let text = file::to_json(&g);
        assert!(text.contains("kvlayout.geometry/v3"), "{text}");
        assert_eq!(file::from_json(&text).unwrap(), g);
    }
    // No v3 field: v1 (R = 1 is not written) or v2 (a plain heads split).
    let text = file::to_json(&c4_indexer(1));
    assert!(
        text.contains("kvlayout.geometry/v1") && !text.contains("compress_ratio"),
        "{text}"
    );
    assert!(file::to_json(&qwen35(2, 1, 1)).contains("kvlayout.geometry/v2"));
}

#[test]
fn v3_fields_in_a_v1_or_v2_file_are_refused_naming_the_field_and_schema() {
    let v3 = file::to_json(&c4_indexer(4));
    let e = file::from_json(&v3.replace("geometry/v3", "geometry/v2")).unwrap_err();
    assert_eq!(e.field, "buffers[0] (index_k).compress_ratio");
    assert!(e.problem.contains("kvlayout.geometry/v3"), "{e}");
    let v3 = file::to_json(&gdn_conv(2, 0, vec![2_048, 2_048, 4_096]));
    let e = file::from_json(&v3.replace("geometry/v3", "geometry/v2")).unwrap_err();
    assert_eq!(e.field, "buffers[0] (conv).sections[0] (conv).split_groups");
    let v3 = file::to_json(&qwen35(4, 2, 1));
    let e = file::from_json(&v3.replace("geometry/v3", "geometry/v2")).unwrap_err();
    assert!(e.field.contains("heads_total 2 below tp_size 4"), "{e}");
    // Explicit R = 1 in a v3 file is the default.
    let text =
        file::to_json(&c4_indexer(4)).replace("\"compress_ratio\": 4", "\"compress_ratio\": 1");
    assert_eq!(file::from_json(&text).unwrap(), c4_indexer(1));
}
