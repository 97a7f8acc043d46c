//! Plans checked against offsets worked by hand from the memory-layout and arrangement
//! formulas (crate::regions, crate::layout docs), each written as arithmetic.

use super::*;
use crate::formats::{dsa_mla_fp8, index_k, mha, mla};
use crate::{BufferGeometry, Dtype, MemoryLayout, Shard};

const KV_TOKEN: u64 = 512 + 4 * 4 + 64 * 2; // 656: DeepSeek-V3.2 fp8 NoPE, 4 f32 scales, bf16 RoPE
const IK_TOKEN: u64 = 128 + 4; // 132: 128 e4m3 values + 1 f32 scale

/// DeepSeek-V3.2 at tensor-parallel rank `rank` of `tp`: MLA and index-K replicated, 61
/// layers each, 64-token pages.
fn dsv32(tp: u64, rank: u64, pages: u64, memory_layout: MemoryLayout) -> PoolGeometry {
    let shard = Shard::replicated(tp, rank);
    PoolGeometry {
        name: format!("dsv32 tp{tp}"),
        page_size_tokens: 64,
        pages,
        memory_layout,
        buffers: vec![
            BufferGeometry::new("kv", 61, dsa_mla_fp8(512, 64).unwrap()).with_shard(shard),
            BufferGeometry::new(
                "index_k",
                61,
                index_k(Dtype::F8E4M3, 128, Some((Dtype::F32, 128))).unwrap(),
            )
            .with_shard(shard),
        ],
    }
}

fn run(src: u64, dst: u64, len: u64) -> Run {
    Run {
        src_offset_bytes: src,
        dst_offset_bytes: dst,
        len_bytes: len,
    }
}

#[test]
fn a_deepseek_page_tp1_to_tp2_is_one_run_per_layer_and_buffer() {
    let (a, b) = (
        dsv32(1, 0, 8, MemoryLayout::LayerFirst),
        dsv32(2, 1, 8, MemoryLayout::LayerFirst),
    );
    let plan = token_plan(&a, &b, &[3], &[5]).unwrap();
    assert_eq!(plan.level, Level::Token);
    let kv = &plan.buffers[0];
    assert_eq!(kv.runs.len(), 61);
    // layer_first: (layer * pages + page) * stride; a page's payload is 64 x 656 B
    let kv_page = 64 * KV_TOKEN;
    assert_eq!(
        kv.runs[7],
        run((7 * 8 + 3) * kv_page, (7 * 8 + 5) * kv_page, kv_page)
    );
    // index-K: [64 x 128 B values][64 x 4 B scales] whole, so one run too
    let ik = &plan.buffers[1];
    assert_eq!(ik.runs.len(), 61);
    let ik_page = 64 * IK_TOKEN;
    assert_eq!(
        ik.runs[60],
        run((60 * 8 + 3) * ik_page, (60 * 8 + 5) * ik_page, ik_page)
    );
    assert_eq!(plan.bytes_total(), 61 * (kv_page + ik_page));
}

#[test]
fn consecutive_pages_merge_into_one_run_per_layer() {
    let a = dsv32(1, 0, 8, MemoryLayout::LayerFirst);
    let plan = page_plan(&a, &a, &[1, 2, 3], &[4, 5, 6]).unwrap();
    assert_eq!(plan.level, Level::Pool);
    assert_eq!(plan.buffers[0].runs.len(), 61);
    let s = 64 * KV_TOKEN;
    assert_eq!(
        plan.buffers[0].runs[1],
        run((8 + 1) * s, (8 + 4) * s, 3 * s)
    );
    // page_first: (page * layers + layer) * stride, pages outermost: pages 1..4 of every
    // layer are one run of 3 x 61 strides
    let pf = dsv32(1, 0, 8, MemoryLayout::PageFirst);
    let plan = page_plan(&pf, &pf, &[1, 2, 3], &[4, 5, 6]).unwrap();
    assert_eq!(
        plan.buffers[0].runs,
        vec![run(61 * s, 4 * 61 * s, 3 * 61 * s)]
    );
}

#[test]
fn page_first_direct_offsets_are_page_groups_of_every_buffer() {
    let lf = dsv32(1, 0, 4, MemoryLayout::LayerFirst);
    let direct = dsv32(1, 0, 4, MemoryLayout::PageFirstDirect);
    let plan = page_plan(&lf, &direct, &[2], &[3]).unwrap();
    let (kv_s, ik_s) = (64 * KV_TOKEN, 64 * IK_TOKEN);
    // one region [page][buffer][layer][stride]: a page group is 61 kv + 61 index-K strides
    let group = 61 * kv_s + 61 * ik_s;
    let ik = &plan.buffers[1];
    assert_eq!((ik.src_region, ik.dst_region), (1, 0));
    // layer 5 of index-K: page 3's group, after kv's 61 strides, 5 strides in
    assert_eq!(
        ik.runs.len(),
        61,
        "layer_first source pages do not continue each other"
    );
    assert_eq!(
        ik.runs[5],
        run((5 * 4 + 2) * ik_s, 3 * group + 61 * kv_s + 5 * ik_s, ik_s)
    );
    // back the other way, pages outermost: page 3's 61 index-K layers are one source run
    let back = page_plan(&direct, &lf, &[3], &[2]).unwrap();
    assert_eq!(
        back.buffers[1].runs[5],
        run(3 * group + 61 * kv_s + 5 * ik_s, (5 * 4 + 2) * ik_s, ik_s)
    );
}

/// `fa`: 4 layers of K and V `[heads, 128]` bf16 (`section_major`), heads split 8 over `tp`,
/// 16-token pages.
fn heads_pool(tp: u64, rank: u64, memory_layout: MemoryLayout) -> PoolGeometry {
    PoolGeometry {
        name: "fa".into(),
        page_size_tokens: 16,
        pages: 4,
        memory_layout,
        buffers: vec![
            BufferGeometry::new("fa", 4, mha(8 / tp, 128, Dtype::Bf16).unwrap())
                .with_shard(Shard::heads(tp, rank, 8)),
        ],
    }
}

#[test]
fn tp1_to_tp2_moves_the_destination_ranks_heads() {
    for rank in 0..2 {
        let a = heads_pool(1, 0, MemoryLayout::LayerFirst);
        let b = heads_pool(2, rank, MemoryLayout::LayerFirst);
        let plan = token_plan(&a, &b, &[2], &[1]).unwrap();
        let fa = &plan.buffers[0];
        let lo = rank * 4; // heads_total 8 / tp_size 2
        assert_eq!(fa.heads, Some(lo..lo + 4));
        let head = 128 * 2;
        let (src_row, dst_row) = (8 * head, 4 * head); // TP1 8 heads a token, TP2 4
        let (src_page, dst_page) = (2 * 16 * src_row, 2 * 16 * dst_row); // k then v
        // section_major, layer 0, token 3 of v: src page 2, dst page 1
        let want = run(
            2 * src_page + 16 * src_row + 3 * src_row + lo * head,
            dst_page + 16 * dst_row + 3 * dst_row,
            4 * head,
        );
        assert!(fa.runs.contains(&want), "{want:?}");
        // 4 layers x 2 sections x 16 tokens, each half a source row: nothing merges
        assert_eq!(fa.runs.len(), 4 * 2 * 16);
        assert_eq!(plan.bytes_total(), 4 * 2 * 16 * 4 * head);
    }
}

#[test]
fn two_small_pages_glue_into_one() {
    let pool = |page_tokens: u64| PoolGeometry {
        name: "t".into(),
        page_size_tokens: page_tokens,
        pages: 4,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![BufferGeometry::new(
            "kv",
            2,
            mla(64, 64, Dtype::Bf16).unwrap(),
        )],
    };
    let (src, dst) = (pool(16), pool(32));
    let row = 128 * 2; // 64 + 64 bf16
    let plan = token_plan(&src, &dst, &[3, 1], &[2]).unwrap();
    let mut want = Vec::new();
    for layer in 0..2 {
        want.push(run(
            (layer * 4 + 3) * 16 * row,
            (layer * 4 + 2) * 32 * row,
            16 * row,
        ));
        want.push(run(
            (layer * 4 + 1) * 16 * row,
            (layer * 4 + 2) * 32 * row + 16 * row,
            16 * row,
        ));
    }
    assert_eq!(plan.buffers[0].runs, want);
    assert_eq!(
        token_plan(&src, &dst, &[0, 1, 2], &[2])
            .unwrap_err()
            .to_string(),
        "kv: 3 source pages x 16 tokens != 1 destination pages x 32 tokens"
    );
}

#[test]
fn page_head_pages_move_head_by_head() {
    // MHA 8 heads x 128 bf16, K then V; page_head: [page][head][layer][token][head row]
    let pool = |m| PoolGeometry {
        name: "mha".into(),
        page_size_tokens: 16,
        pages: 4,
        memory_layout: m,
        buffers: vec![BufferGeometry::new(
            "kv",
            3,
            mha(8, 128, Dtype::Bf16).unwrap(),
        )],
    };
    let (ph, lf) = (pool(MemoryLayout::PageHead), pool(MemoryLayout::LayerFirst));
    let plan = page_plan(&ph, &ph, &[1], &[2]).unwrap();
    let head_row = 2 * 128 * 2; // k and v of one head
    let chunk = 16 * head_row; // one head of one page of one layer
    // ((p * H + h) * L + l) * C: pages outermost, each head's 3 layers continue each other
    let runs = &plan.buffers[0].runs;
    assert_eq!(
        runs.len(),
        1,
        "page 1's 8 x 3 chunks are one block: {runs:?}"
    );
    assert_eq!(
        runs[0],
        run(8 * 3 * chunk, 2 * 8 * 3 * chunk, 8 * 3 * chunk)
    );
    // into layer_first section_major: head h of K of token t at T * 0 + (t * 8 + h) x 256
    let plan = page_plan(&ph, &lf, &[1], &[2]).unwrap();
    let page = 16 * 8 * 128 * 2 * 2;
    let k = run(
        ((8 + 5) * 3 + 2) * chunk + 7 * head_row,
        (2 * 4 + 2) * page + 7 * 8 * 256 + 5 * 256,
        256,
    );
    assert!(plan.buffers[0].runs.contains(&k), "{k:?}");
    assert_eq!(plan.bytes_total(), 3 * page);
}

#[test]
fn refusals_name_the_list_and_both_values() {
    let a = dsv32(1, 0, 8, MemoryLayout::LayerFirst);
    let err = |r: Result<Plan, PlanError>| r.unwrap_err().to_string();
    assert_eq!(
        err(page_plan(&a, &a, &[8], &[0])),
        "src_pages[0]: page 8 out of range (the source pool has 8 pages)"
    );
    assert_eq!(
        err(page_plan(&a, &a, &[1, 2], &[4, 4])),
        "dst_pages[1]: page 4 listed twice (also dst_pages[0])"
    );
    assert_eq!(
        err(page_plan(&a, &a, &[1, 2], &[4])),
        "page lists: 2 source pages, 1 destination pages"
    );
    let b = dsv32(2, 1, 8, MemoryLayout::LayerFirst);
    let e = page_plan(&a, &b, &[1], &[1]).unwrap_err();
    assert_eq!(e.kind(), "incompatible");
    assert!(
        e.to_string()
            .contains("kv.shard: tp_size 1 rank 0 replicated, tp_size 2 rank 1 replicated"),
        "{e}"
    );
}

/// A pool of `buffer` alone, 4 pages of `page_tokens` tokens, `layer_first`.
fn single(page_tokens: u64, buffer: BufferGeometry) -> PoolGeometry {
    PoolGeometry {
        name: "v3".into(),
        page_size_tokens: page_tokens,
        pages: 4,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![buffer],
    }
}

fn layout_of(section: crate::Section) -> crate::TokenLayout {
    crate::TokenLayout {
        arrangement: crate::Arrangement::TokenMajor,
        sections: vec![section].into(),
        page_align_bytes: None,
        page_stride_bytes: None,
    }
}

#[test]
fn split_groups_move_each_groups_slice_tp2_to_tp4() {
    // A GDN-like conv state (v3 split_groups): q|k|v groups of 4, 4 and 8 channels (heads_total
    // 16), 3 bf16 per channel = 6 B. TP 2 rank 0 holds q[0,2) k[0,2) v[0,4): local channels 0-1,
    // 2-3, 4-7 (8 x 6 = 48 B a slot); TP 4 rank 1 holds q[1,2) k[1,2) v[2,4): local 0, 1, 2-3
    // (4 x 6 = 24 B).
    let conv = |tp: u64, rank: u64| {
        let section = crate::Section::owned("conv", Dtype::Bf16, vec![16 / tp, 3])
            .with_split_groups(vec![4, 4, 8]);
        let buf = BufferGeometry::new("conv", 2, layout_of(section))
            .with_attention(crate::Attention::State)
            .with_shard(Shard::heads(tp, rank, 16));
        single(64, buf)
    };
    let plan = token_plan(&conv(2, 0), &conv(4, 1), &[1], &[2]).unwrap();
    let (s, d) = (48, 24);
    let mut want = Vec::new();
    for l in 0..2 {
        let (sb, db) = ((l * 4 + 1) * s, (l * 4 + 2) * d);
        want.push(run(sb + 6, db, 6)); // q channel 1
        want.push(run(sb + 3 * 6, db + 6, 6)); // k channel 1
        want.push(run(sb + 6 * 6, db + 2 * 6, 2 * 6)); // v channels 2, 3
    }
    assert_eq!(plan.buffers[0].runs, want);
    assert_eq!(plan.bytes_total(), 2 * d);
}

#[test]
fn replicated_heads_move_the_one_head_a_rank_holds() {
    // 2 KV heads over TP 4 (v3): rank r holds head r / 2, a head axis of 1; TP 2 rank 1 holds
    // head 1. K and V [1, 128] bf16 section_major, 16-token pages.
    let pool = |tp: u64, rank: u64| {
        let buf = BufferGeometry::new("kv", 2, mha(1, 128, Dtype::Bf16).unwrap())
            .with_shard(Shard::heads(tp, rank, 2));
        single(16, buf)
    };
    let page = 16 * 2 * 128 * 2;
    let plan = token_plan(&pool(2, 1), &pool(4, 3), &[0], &[3]).unwrap();
    assert_eq!(plan.buffers[0].heads, Some(1..2));
    assert_eq!(
        plan.buffers[0].runs,
        vec![run(0, 3 * page, page), run(4 * page, (4 + 3) * page, page)]
    );
    // rank 1 of 4 holds head 0, none of TP 2 rank 1's: the token level refuses the pair
    let e = token_plan(&pool(2, 1), &pool(4, 1), &[0], &[3]).unwrap_err();
    assert_eq!(e.kind(), "incompatible");
    assert!(
        e.to_string().contains("kv.shard.heads_held: head 1 of 2"),
        "{e}"
    );
}

#[test]
fn compressed_rows_glue_in_whole_rows() {
    // compress_ratio 4 (v3): one 128-B row per 4 tokens; 32-token pages hold 8 rows, 64-token
    // pages 16.
    let pool = |page_tokens: u64| {
        let section = crate::Section::owned("row", Dtype::U8, vec![128]);
        single(
            page_tokens,
            BufferGeometry::new("c4", 2, layout_of(section)).with_compress_ratio(4),
        )
    };
    let plan = token_plan(&pool(32), &pool(64), &[3, 1], &[2]).unwrap();
    let (s, d) = (8 * 128, 16 * 128);
    let mut want = Vec::new();
    for l in 0..2 {
        want.push(run((l * 4 + 3) * s, (l * 4 + 2) * d, s));
        want.push(run((l * 4 + 1) * s, (l * 4 + 2) * d + s, s));
    }
    assert_eq!(plan.buffers[0].runs, want);
    assert_eq!(
        token_plan(&pool(32), &pool(64), &[0, 1, 2], &[2])
            .unwrap_err()
            .to_string(),
        "c4: 3 source pages x 8 rows of 4 tokens != 1 destination pages x 16 rows of 4 tokens"
    );
}

// ---------------------------------------------------------------------------------------
// Geometry v3 on real model sizes: DeepSeek-V4 C4 rows, Qwen3.5's 2 KV heads over 4 ranks
// (every rank pair), its GDN conv state (q|k|v 2,048|2,048|4,096).

/// One 132-B row (128 e4m3 + 4 B, token-major here so pages of different sizes may glue) per
/// `ratio` tokens, 3 layers, `page` tokens a page, 8 pages, `layer_first`.
fn compressed(page: u64, ratio: u64) -> PoolGeometry {
    let layout = crate::TokenLayout {
        arrangement: crate::Arrangement::TokenMajor,
        sections: vec![
            crate::Section::owned("values", Dtype::F8E4M3, vec![128]),
            crate::Section::owned("scale", Dtype::F32, vec![1]).with_scale(0, 128),
        ]
        .into(),
        page_align_bytes: None,
        page_stride_bytes: None,
    };
    PoolGeometry {
        name: format!("c{ratio} page {page}"),
        page_size_tokens: page,
        pages: 8,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![BufferGeometry::new("c4", 3, layout).with_compress_ratio(ratio)],
    }
}

#[test]
fn compressed_pages_of_different_sizes_glue_in_whole_rows() {
    // Source pages of 64 tokens hold 64 / 4 = 16 rows (stride 16 x 132 = 2,112 B); the
    // destination's 128-token pages hold 32 rows (4,224 B). Source pages 3 and 5 fill
    // destination page 2: rows 0-15 from page 3, rows 16-31 from page 5.
    let (a, b) = (compressed(64, 4), compressed(128, 4));
    let plan = token_plan(&a, &b, &[3, 5], &[2]).unwrap();
    let runs = &plan.buffers[0].runs;
    assert_eq!(runs.len(), 3 * 2);
    let (sp, dp) = (16 * IK_TOKEN, 32 * IK_TOKEN);
    // layer_first: (layer * 8 + page) * stride
    assert_eq!(runs[0], run(3 * sp, 2 * dp, 16 * IK_TOKEN));
    assert_eq!(runs[1], run(5 * sp, 2 * dp + 16 * IK_TOKEN, 16 * IK_TOKEN));
    assert_eq!(
        runs[5],
        run(
            (2 * 8 + 5) * sp,
            (2 * 8 + 2) * dp + 16 * IK_TOKEN,
            16 * IK_TOKEN
        )
    );
    assert_eq!(plan.bytes_total(), 3 * 32 * IK_TOKEN);
    // One 64-token page (16 rows) does not fill a 128-token page (32 rows).
    let e = token_plan(&a, &b, &[3], &[2]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "c4: 1 source pages x 16 rows of 4 tokens != 1 destination pages x 32 rows of 4 tokens"
    );
    // A row per 4 tokens never pairs with a row per token.
    let e = token_plan(&a, &compressed(64, 1), &[3], &[2]).unwrap_err();
    assert!(e.to_string().contains("c4.compress_ratio: 4, 1"), "{e}");
    // Whole pages of a compressed buffer: one 2,112-B run per page and layer.
    let plan = page_plan(&a, &a, &[1], &[6]).unwrap();
    assert_eq!(
        plan.buffers[0].runs[2],
        run((2 * 8 + 1) * sp, (2 * 8 + 6) * sp, sp)
    );
}

/// Qwen3.5 full attention, one rank: section-major K then V of `heads` bf16 heads of 256,
/// 10 layers, 64-token pages, 4 pages; `Shard::heads(tp, rank, 2)` (2 KV heads).
fn qwen35(tp: u64, rank: u64) -> PoolGeometry {
    let heads = if tp >= 2 { 1 } else { 2 };
    PoolGeometry {
        name: format!("qwen3.5 tp{tp} r{rank}"),
        page_size_tokens: 64,
        pages: 4,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![
            BufferGeometry::new(
                "full_attn",
                10,
                crate::TokenLayout {
                    arrangement: crate::Arrangement::SectionMajor,
                    sections: vec![
                        crate::Section::owned("k", Dtype::Bf16, vec![heads, 256]),
                        crate::Section::owned("v", Dtype::Bf16, vec![heads, 256]),
                    ]
                    .into(),
                    page_align_bytes: None,
                    page_stride_bytes: None,
                },
            )
            .with_shard(Shard::heads(tp, rank, 2)),
        ],
    }
}

#[test]
fn replicated_heads_move_the_head_each_rank_holds() {
    // TP 4 rank r holds head r / 2; TP 2 rank s holds head s. A K or V plane of one head is
    // 64 x 512 B = 32,768 B, contiguous, and K's plane runs into V's: one 65,536-B run per
    // layer (layer_first: (layer * 4 + page) x 65,536).
    const PAGE: u64 = 64 * 2 * 512;
    for r in 0..4u64 {
        for s in 0..2u64 {
            let planned = token_plan(&qwen35(2, s), &qwen35(4, r), &[1], &[3]);
            if s == r / 2 {
                let plan = planned.unwrap();
                let b = &plan.buffers[0];
                assert_eq!(b.heads, Some(s..s + 1), "rank {r} from {s}");
                assert_eq!(b.runs.len(), 10);
                assert_eq!(b.runs[9], run((9 * 4 + 1) * PAGE, (9 * 4 + 3) * PAGE, PAGE));
            } else {
                // Pairing a replicated rank with a rank of another head is the reported bug
                // (SGLang #23746 paired decode rank r with head r % 2): refused at the token
                // level, naming both heads.
                let e = planned.unwrap_err().to_string();
                assert!(
                    e.contains(&format!(
                        "full_attn.shard.heads_held: head {s} of 2 (tp_size 2 rank {s}, 1 replicas), \
                         head {} of 2 (tp_size 4 rank {r}, 2 replicas)",
                        r / 2
                    )),
                    "{e}"
                );
            }
        }
    }
    // TP 1 holds both heads (K rows of 1,024 B): TP 4 rank 2 takes head 1, the second 512 B
    // of every K and V row: 64 runs a section, K's at 512 + 1,024 t, V's after K's plane.
    let plan = token_plan(&qwen35(1, 0), &qwen35(4, 2), &[0], &[0]).unwrap();
    let runs = &plan.buffers[0].runs;
    assert_eq!(runs.len(), 10 * 64 * 2);
    let (src_page, dst_page) = (64 * 2 * 1024, PAGE);
    assert_eq!(runs[1], run(1024 + 512, 512, 512));
    assert_eq!(runs[64], run(64 * 1024 + 512, 64 * 512, 512));
    assert_eq!(
        runs[128],
        run(4 * src_page + 512, 4 * dst_page, 512),
        "layer 1 starts after 4 pages"
    );
}

/// Qwen3.5 gated-delta-net conv state (shared case 30): q | k | v = 2,048 | 2,048 | 4,096
/// channels over the model, 3 positions, bf16 (6 B per channel), a rank of `tp` holding
/// 8,192 / tp; 30 layers; 4 request slots.
fn gdn(tp: u64, rank: u64) -> PoolGeometry {
    PoolGeometry {
        name: format!("gdn tp{tp} r{rank}"),
        page_size_tokens: 64,
        pages: 4,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![
            BufferGeometry::new(
                "conv",
                30,
                crate::TokenLayout {
                    arrangement: crate::Arrangement::TokenMajor,
                    sections: vec![
                        crate::Section::owned("conv", Dtype::Bf16, vec![8192 / tp, 3])
                            .with_split_groups(vec![2048, 2048, 4096]),
                    ]
                    .into(),
                    page_align_bytes: None,
                    page_stride_bytes: None,
                },
            )
            .with_attention(crate::Attention::State)
            .with_shard(Shard::heads(tp, rank, 8192)),
        ],
    }
}

#[test]
fn split_groups_move_group_by_group_between_tp_sizes() {
    const CH: u64 = 3 * 2; // bytes per channel
    let (src_slot, dst_slot) = (4096 * CH, 2048 * CH);
    // TP 2 rank 0 holds q[0,1024) k[0,1024) v[0,2048) at rows 0, 1,024, 2,048; TP 4 rank 0
    // holds q[0,512) k[0,512) v[0,1024) at rows 0, 512, 1,024. Slot 1 -> slot 3.
    let plan = token_plan(&gdn(2, 0), &gdn(4, 0), &[1], &[3]).unwrap();
    let runs = &plan.buffers[0].runs;
    assert_eq!(runs.len(), 30 * 3);
    let (s, d) = (src_slot, 3 * dst_slot);
    assert_eq!(runs[0], run(s, d, 512 * CH));
    assert_eq!(runs[1], run(s + 1024 * CH, d + 512 * CH, 512 * CH));
    assert_eq!(runs[2], run(s + 2048 * CH, d + 1024 * CH, 1024 * CH));
    assert_eq!(plan.bytes_total(), 30 * dst_slot);
    // Cut as one block, rows [0, 2,048) of the source slot would have landed: all of q and k,
    // none of v. TP 2 rank 1 -> TP 4 rank 3: q[1536,2048) at source row 512, k[1536,2048) at
    // 1,024 + 512, v[3072,4096) at 2,048 + 1,024; destination rows 0, 512, 1,024.
    let plan = token_plan(&gdn(2, 1), &gdn(4, 3), &[0], &[0]).unwrap();
    let runs = &plan.buffers[0].runs;
    assert_eq!(runs[0], run(512 * CH, 0, 512 * CH));
    assert_eq!(runs[1], run(1536 * CH, 512 * CH, 512 * CH));
    assert_eq!(runs[2], run(3072 * CH, 1024 * CH, 1024 * CH));
    // Layer 1: layer_first (layer x 4 slots + slot) x slot bytes.
    assert_eq!(
        runs[3],
        run(4 * src_slot + 512 * CH, 4 * dst_slot, 512 * CH)
    );
    // TP 2 rank 0 holds none of TP 4 rank 2's channels.
    let plan = token_plan(&gdn(2, 0), &gdn(4, 2), &[0], &[0]).unwrap();
    assert!(plan.buffers[0].runs.is_empty());
}

#[test]
fn a_state_buffer_beside_paged_buffers_is_refused() {
    let mut a = gdn(2, 0);
    a.buffers.push(qwen35(2, 0).buffers[0].clone());
    let e = token_plan(&a, &a, &[0], &[1]).unwrap_err();
    assert_eq!(e.kind(), "state");
    assert!(
        e.to_string().starts_with("conv.attention: a state buffer"),
        "{e}"
    );
}

/// Every memory layout, `page_unified` with one group of 4 heads and with 2 groups of 2.
const EVERY_LAYOUT: [MemoryLayout; 8] = [
    MemoryLayout::PageHeadToken,
    MemoryLayout::LayerFirst,
    MemoryLayout::PageFirst,
    MemoryLayout::PageFirstDirect,
    MemoryLayout::PageHead,
    MemoryLayout::LayerHead,
    MemoryLayout::PageUnified { heads_per_group: 4 },
    MemoryLayout::PageUnified { heads_per_group: 2 },
];

/// MHA-shaped `k` and `v` buffers of 4 heads, each with a second section (`*_s`, 1 byte a
/// head) so that `section_major` differs from `token_major`; 2 layers, 3-token pages, 4 pages.
fn two_sections(memory_layout: MemoryLayout, arrangement: crate::Arrangement) -> PoolGeometry {
    let layout = |name: &str, width: u64| crate::TokenLayout {
        arrangement: arrangement.clone(),
        sections: vec![
            crate::Section::owned(name, Dtype::U8, vec![4, width]),
            crate::Section::owned(format!("{name}_s"), Dtype::U8, vec![4, 1]),
        ]
        .into(),
        page_align_bytes: None,
        page_stride_bytes: None,
    };
    PoolGeometry {
        name: format!("{memory_layout}"),
        page_size_tokens: 3,
        pages: 4,
        memory_layout,
        buffers: vec![
            BufferGeometry::new("k", 2, layout("k", 2)),
            BufferGeometry::new("v", 2, layout("v", 3)),
        ],
    }
}

/// The byte at `offset` of the canonical page (the arrangement's order) of `page` of `layer`
/// of buffer `b`: never 0 (the untouched value).
fn marker(b: usize, layer: u64, page: u64, offset: u64) -> u8 {
    (1 + (b as u64 * 131 + layer * 31 + page * 7 + offset * 3) % 251) as u8
}

/// The pool's bytes with every page of every layer of every buffer holding its markers,
/// written through [`PoolGeometry::page_segments`].
fn filled(g: &PoolGeometry) -> Vec<u8> {
    let mut mem = vec![0u8; g.total_bytes().unwrap() as usize];
    for b in 0..g.buffers.len() {
        for layer in 0..g.buffers[b].layers {
            for page in 0..g.pages {
                for s in g.page_segments(b, layer, page).unwrap() {
                    for i in 0..s.len_bytes {
                        mem[(s.pool_offset_bytes + i) as usize] =
                            marker(b, layer, page, s.page_offset_bytes + i);
                    }
                }
            }
        }
    }
    mem
}

/// Regression guard for every layout pair, by the layouts' own segments: a plan applied to
/// zeroed destination memory writes each listed destination page's canonical bytes from its
/// source page and not one byte elsewhere (the byte count written equals the pages' bytes).
#[test]
fn plans_between_every_pair_of_memory_layouts_move_exact_bytes() {
    let arrangements = [
        crate::Arrangement::TokenMajor,
        crate::Arrangement::SectionMajor,
        crate::Arrangement::HeadMajor,
    ];
    let (src_pages, dst_pages) = ([2u64, 0, 3], [1u64, 3, 0]);
    for arrangement in arrangements {
        for sm in EVERY_LAYOUT {
            for dm in EVERY_LAYOUT {
                let (src, dst) = (
                    two_sections(sm, arrangement.clone()),
                    two_sections(dm, arrangement.clone()),
                );
                src.validate().unwrap();
                dst.validate().unwrap();
                let mem = filled(&src);
                let (sr, dr) = (src.regions().unwrap(), dst.regions().unwrap());
                for plan in [
                    page_plan(&src, &dst, &src_pages, &dst_pages).unwrap(),
                    token_plan(&src, &dst, &src_pages, &dst_pages).unwrap(),
                ] {
                    let mut out = vec![0u8; dst.total_bytes().unwrap() as usize];
                    let mut written = 0u64;
                    for bp in &plan.buffers {
                        let (s0, d0) = (
                            sr[bp.src_region].pool_offset_bytes,
                            dr[bp.dst_region].pool_offset_bytes,
                        );
                        for r in &bp.runs {
                            for i in 0..r.len_bytes {
                                let byte = mem[(s0 + r.src_offset_bytes + i) as usize];
                                out[(d0 + r.dst_offset_bytes + i) as usize] = byte;
                            }
                            written += r.len_bytes;
                        }
                    }
                    let mut expected = 0u64;
                    for b in 0..dst.buffers.len() {
                        for layer in 0..dst.buffers[b].layers {
                            for (&sp, &dp) in src_pages.iter().zip(&dst_pages) {
                                for s in dst.page_segments(b, layer, dp).unwrap() {
                                    for i in 0..s.len_bytes {
                                        let at = (s.pool_offset_bytes + i) as usize;
                                        assert_eq!(
                                            out[at],
                                            marker(b, layer, sp, s.page_offset_bytes + i),
                                            "{arrangement:?} {sm} -> {dm} {:?}: buffer {b} \
                                             layer {layer} page {sp} -> {dp} byte {}",
                                            plan.level,
                                            s.page_offset_bytes + i
                                        );
                                    }
                                    expected += s.len_bytes;
                                }
                            }
                        }
                    }
                    // 2 buffers x 2 layers x 3 pages x 3 tokens x 4 heads x (3 + 1 or 2 + 1)
                    assert_eq!(expected, 2 * 3 * 3 * 4 * (4 + 3));
                    assert_eq!(
                        written, expected,
                        "{arrangement:?} {sm} -> {dm} {:?}: bytes written beside the pages",
                        plan.level
                    );
                    let nonzero = out.iter().filter(|&&x| x != 0).count() as u64;
                    assert_eq!(
                        nonzero, expected,
                        "{arrangement:?} {sm} -> {dm}: stray bytes"
                    );
                }
            }
        }
    }
}
