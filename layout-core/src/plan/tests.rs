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
