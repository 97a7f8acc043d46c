//! DeepSeek-V4-Flash as SGLang allocates it on CUDA, every figure worked by hand from
//! configs/deepseek-v4-flash-0731.json and sgl-project/sglang
//! `python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py` (`DeepSeekV4SingleKVPool`,
//! `DeepSeekV4UniformFP8KVPool`, `DeepSeekV4IndexerPool`, `DeepSeekV4TokenToKVPool`),
//! `deepseek_v4_compress_state.py` (`CompressStatePool`) and
//! `model_executor/model_runner_kv_cache_mixin.py` (page size 256 on CUDA).

use kvlayout_models::{
    BufferAttention, IndexK, KvDtype, KvLayout, LayerKind, Model, Options, StateDtype, Tp, summary,
};

fn v4() -> Model {
    let text = std::fs::read_to_string(format!(
        "{}/../configs/deepseek-v4-flash-0731.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    Model::parse("deepseek-v4-flash", "t", &text).unwrap()
}

fn opts() -> Options {
    Options {
        page_size_tokens: 256,
        ..Options::default()
    }
}

/// (name, attention, layers, compress ratio, row bytes, page bytes) per buffer.
fn table(m: &Model, o: &Options) -> Vec<(String, BufferAttention, u64, u64, u64, u64)> {
    let plans = m.plan(o).unwrap();
    summary(&plans, o.page_size_tokens)
        .unwrap()
        .into_iter()
        .map(|s| {
            (
                s.name,
                s.attention,
                s.layers,
                s.compress_ratio,
                s.bytes_per_token,
                s.page_stride_bytes,
            )
        })
        .collect()
}

const W: BufferAttention = BufferAttention::SlidingWindow { window_tokens: 128 };
const FULL: BufferAttention = BufferAttention::Full;

#[test]
fn compress_ratios_give_2_sliding_21_c4_and_20_c128_layers() {
    // compress_ratios (46 entries; the first 43 = num_hidden_layers are the model's, SGLang
    // slices compress_ratios[start_layer:end_layer]): 0, 0, then 4, 128 alternating from layer
    // 2 to 42 (layer 42 is 4): 21 x 4 at even layers 2..=42, 20 x 128 at odd 3..=41.
    let m = v4();
    let kinds = m.layer_kinds().unwrap();
    assert_eq!(kinds.len(), 43);
    for (i, k) in kinds.iter().enumerate() {
        let want = match i {
            0 | 1 => LayerKind::Sliding { window_tokens: 128 },
            i if i % 2 == 0 => LayerKind::Compressed { ratio: 4 },
            _ => LayerKind::Compressed { ratio: 128 },
        };
        assert_eq!(*k, want, "layer {i}");
    }
    let plans = m.plan(&opts()).unwrap();
    let c4: Vec<u64> = (2..43).step_by(2).collect();
    let c128: Vec<u64> = (3..42).step_by(2).collect();
    assert_eq!((c4.len(), c128.len()), (21, 20));
    let ids = |n: &str| {
        plans
            .iter()
            .find(|p| p.name == n)
            .unwrap()
            .layer_ids
            .clone()
    };
    assert_eq!(ids("swa"), (0..43).collect::<Vec<u64>>());
    assert_eq!(ids("c4_kv"), c4);
    assert_eq!(ids("c4_index_k"), c4);
    assert_eq!(ids("c4_state"), c4);
    assert_eq!(ids("c4_index_state"), c4);
    assert_eq!(ids("c128_kv"), c128);
    assert_eq!(ids("c128_state"), c128);
}

#[test]
fn the_sglang_cuda_pool_buffer_by_buffer() {
    let t = table(&v4(), &opts());
    // Page P = 256 tokens. The 584-B record: 448 e4m3 NoPE (head_dim 512 - qk_rope_head_dim 64)
    // + 64 bf16 RoPE (128 B) = 576 B in plane 1, 448 / 64 = 7 ue8m0 scales + 1 pad = 8 B in
    // plane 2 (get_bytes_per_token: 448 + 64 x 2 + 7 + 1 = 584); a page is padded to a
    // multiple of 576 (create_buffer: ceil_div(page_size x 584, 576) x 576).
    let pad576 = |b: u64| b.div_ceil(576) * 576;
    assert_eq!(448 + 64 * 2 + 448 / 64 + 1, 584);
    // swa: 256 x 584 = 149,504 -> 260 x 576 = 149,760.
    assert_eq!(pad576(256 * 584), 149_760);
    // c4_kv: page_size // 4 = 64 rows: 37,376 -> 65 x 576 = 37,440.
    assert_eq!(pad576(64 * 584), 37_440);
    // c128_kv: 256 // 128 = 2 rows: 1,168 -> 3 x 576 = 1,728.
    assert_eq!(pad576(2 * 584), 1_728);
    // c4_index_k (get_dsv4_indexer_bytes_per_token, fp8): 128 + 128 / 128 x 4 = 132 B a row,
    // 64 rows = 8,448 B, no padding.
    // c4_state (CompressStatePool, ratio 4, overlap): last_dim 2 x (1 + 1) x 512 = 2,048 f32
    // = 8,192 B a row; ring 8 rows per 256-token SWA page (get_compress_state_ring_size(4)):
    // R = 256 / 8 = 32, a page 8 x 8,192 = 65,536 B, kept with the SWA window.
    // c4_index_state: 2 x 2 x 128 = 512 f32 = 2,048 B a row, 16,384 B a page.
    // c128_state: ring 128 rows per request (offline C128) of 2 x 512 f32: 128 x 1,024 x 4 =
    // 524,288 B a slot.
    assert_eq!(
        t,
        [
            ("swa".into(), W, 43, 1, 584, 149_760),
            ("c4_kv".into(), FULL, 21, 4, 584, 37_440),
            ("c4_index_k".into(), FULL, 21, 4, 132, 8_448),
            ("c128_kv".into(), FULL, 20, 128, 584, 1_728),
            ("c4_state".into(), W, 21, 32, 8_192, 65_536),
            ("c4_index_state".into(), W, 21, 32, 2_048, 16_384),
            (
                "c128_state".into(),
                BufferAttention::State,
                20,
                1,
                524_288,
                524_288
            ),
        ]
    );
    // The swa record is the 584-B FlashMLA record of shared case 24 (prefill side), in two
    // planes per page: [256 x 576 = 147,456 B][256 x 8 = 2,048 B] = 149,504 B, padded by
    // 256 B to 149,760; token t's scales at byte 147,456 + 8t.
    let plans = v4().plan(&opts()).unwrap();
    let swa = &plans[0].layout;
    assert_eq!(swa.page_payload_bytes(256).unwrap(), 256 * 584);
    assert_eq!(swa.page_stride_bytes(256).unwrap(), 149_760);
}

#[test]
fn kv_layout_trtllm_and_index_k_choices() {
    // --kv-layout trtllm (DeepSeekV4UniformFP8KVPool): 448 + 64 e4m3 = 512 B, no padding:
    // swa 256 x 512 = 131,072; c4 64 x 512 = 32,768; c128 2 x 512 = 1,024.
    let t = table(
        &v4(),
        &Options {
            kv_layout: KvLayout::Trtllm,
            ..opts()
        },
    );
    let row = |n: &str| t.iter().find(|r| r.0 == n).unwrap().clone();
    assert_eq!((row("swa").4, row("swa").5), (512, 131_072));
    assert_eq!((row("c4_kv").4, row("c4_kv").5), (512, 32_768));
    assert_eq!((row("c128_kv").4, row("c128_kv").5), (512, 1_024));
    // --index-k fp4 (use_fp4_indexer: 128 / 2 + 128 / 32 = 68 B): 64 x 68 = 4,352 B a page;
    // bf16 (the seed's device): 128 x 2 = 256 B, 64 x 256 = 16,384 B.
    for (ik, row_b, page_b) in [(IndexK::Fp4, 68, 4_352), (IndexK::Bf16, 256, 16_384)] {
        let t = table(
            &v4(),
            &Options {
                index_k: ik,
                ..opts()
            },
        );
        let r = t.iter().find(|r| r.0 == "c4_index_k").unwrap();
        assert_eq!((r.4, r.5), (row_b, page_b), "{ik:?}");
    }
    // --state-dtype bf16 halves the state rows: c4 2,048 x 2 = 4,096 B.
    let t = table(
        &v4(),
        &Options {
            state_dtype: Some(StateDtype::Bf16),
            ..opts()
        },
    );
    assert_eq!(t.iter().find(|r| r.0 == "c4_state").unwrap().4, 4_096);
}

#[test]
fn tensor_parallel_ranks_hold_every_buffer_whole() {
    // One KV head (num_key_value_heads 1) and one indexer key: every buffer replicated, the
    // same bytes on every rank.
    let o = Options {
        tp: Some(Tp::new(8, 5).unwrap()),
        ..opts()
    };
    let plans = v4().plan(&o).unwrap();
    assert_eq!(plans.len(), 7);
    for p in &plans {
        assert_eq!(
            p.shard,
            Some(kvlayout_models::Shard::Replicated {
                tp: Tp::new(8, 5).unwrap()
            }),
            "{}",
            p.name
        );
    }
    assert_eq!(table(&v4(), &o), table(&v4(), &opts()));
}

/// The config with one field changed (`"key": old` -> `"key": new`, text replaced once).
fn v4_with(key: &str, old: &str, new: &str) -> Result<Vec<kvlayout_models::BufferPlan>, String> {
    let path = format!(
        "{}/../configs/deepseek-v4-flash-0731.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(path).unwrap();
    let (from, to) = (format!("\"{key}\": {old}"), format!("\"{key}\": {new}"));
    assert_eq!(text.matches(&from).count(), 1, "{from}");
    let m = Model::parse("v4", "t", &text.replacen(&from, &to, 1)).map_err(|e| e.to_string())?;
    m.plan(&opts()).map_err(|e| e.to_string())
}

#[test]
fn num_key_value_heads_other_than_1_and_window_0_are_refused_by_name() {
    // num_key_value_heads 2 was dropped silently (the pool is one latent row per token).
    let e = v4_with("num_key_value_heads", "1", "2").unwrap_err();
    assert!(e.contains("num_key_value_heads: 2:"), "{e}");
    assert!(e.contains("expected 1"), "{e}");
    // sliding_window 0 was called "missing".
    let e = v4_with("sliding_window", "128", "0").unwrap_err();
    assert!(
        e.contains("sliding_window: must be at least 1, got 0"),
        "{e}"
    );
    assert!(v4_with("num_key_value_heads", "1", "1").is_ok());
}

#[test]
fn tp_that_does_not_divide_the_query_heads_is_refused() {
    // The KV and indexer rows are replicated, but attention still splits the 64 query heads
    // (num_attention_heads 64 in the config): 64 % 3 = 1, so --tp 3 is no SGLang deployment.
    // Before this check the replicated buffers let --tp 3 through silently.
    let e = v4()
        .plan(&Options {
            tp: Some(Tp::new(3, 2).unwrap()),
            ..opts()
        })
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("num_attention_heads: 64 heads do not split evenly over --tp 3"),
        "{e}"
    );
    // 64 % 16 = 0: sixteen ranks of 4 query heads each are fine.
    assert!(
        v4().plan(&Options {
            tp: Some(Tp::new(16, 15).unwrap()),
            ..opts()
        })
        .is_ok()
    );
}

#[test]
fn page_size_and_kv_dtype_sglang_does_not_allocate_are_refused() {
    // Page 64 (the --page-size default of other models): SGLang asserts 256 on CUDA.
    let e = v4().plan(&Options::default()).unwrap_err().to_string();
    assert!(
        e.contains("page_size_tokens") && e.contains("64") && e.contains("256"),
        "{e}"
    );
    assert_eq!(v4().engine_page_size_tokens(), 256);
    // bf16 KV is the ROCm unified pool.
    let e = v4()
        .plan(&Options {
            kv_dtype: Some(KvDtype::Bf16),
            ..opts()
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("--kv-dtype") && e.contains("bf16"), "{e}");
    // vLLM's equal-page-bytes allocator is not SGLang's V4 pool: refused, not ignored.
    let e = v4()
        .plan(&Options {
            equal_page_bytes: true,
            ..opts()
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("--equal-page-bytes"), "{e}");
    // A ratio SGLang does not allocate.
    let text = std::fs::read_to_string(format!(
        "{}/../configs/deepseek-v4-flash-0731.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
    .replacen("[0, 0, 4, 128", "[0, 0, 8, 128", 1);
    let e = Model::parse("v4", "t", &text)
        .unwrap()
        .layer_kinds()
        .unwrap_err()
        .to_string();
    assert!(e.contains("compress_ratios[2]") && e.contains("8"), "{e}");
}

#[test]
fn totals_follow_designs_formula() {
    // docs/DESIGN.md "describe --totals" (layout-core PoolGeometry::totals): buffers with
    // R > 1 count row bytes x layers / R per token, whatever they keep; full counts R = 1 full
    // buffers (none in V4: every layer's own KV is the 128-token window).
    let t = v4().totals(&opts()).unwrap();
    assert_eq!(t.full_bytes_per_token, 0);
    // swa: 584 B x 43 layers x window 128 = 3,214,336 B.
    assert_eq!(t.window_bytes_per_request_max, 584 * 43 * 128);
    assert_eq!(t.window_bytes_per_request_max, 3_214_336);
    // c128_state: 524,288 B x 20 layers = 10,485,760 B.
    assert_eq!(t.state_bytes_per_request, 524_288 * 20);
    assert_eq!(t.state_bytes_per_request, 10_485_760);
    // c4_kv 584 x 21 / 4 = 3,066; c4_index_k 132 x 21 / 4 = 693; c128_kv 584 x 20 / 128 =
    // 91.25; c4_state 8,192 x 21 / 32 = 5,376; c4_index_state 2,048 x 21 / 32 = 1,344.
    let parts = [3_066.0, 693.0, 91.25, 5_376.0, 1_344.0];
    assert_eq!(
        parts,
        [
            584.0 * 21.0 / 4.0,
            132.0 * 21.0 / 4.0,
            584.0 * 20.0 / 128.0,
            8_192.0 * 21.0 / 32.0,
            2_048.0 * 21.0 / 32.0
        ]
    );
    assert_eq!(t.compressed_bytes_per_token, 10_570.25);
    assert_eq!(parts.iter().sum::<f64>(), 10_570.25);
    assert_eq!(
        (
            t.layers_by_attention.sliding,
            t.layers_by_attention.compressed
        ),
        (2, 41)
    );
    // The JSON writes the exact number, and an integer as an integer.
    let v = serde_json::to_value(&t).unwrap();
    assert_eq!(v["compressed_bytes_per_token"].to_string(), "10570.25");
    let gpt = Model::builtin("gpt-oss-20b").unwrap().unwrap();
    let v = serde_json::to_value(gpt.totals(&Options::default()).unwrap()).unwrap();
    assert_eq!(v["compressed_bytes_per_token"].to_string(), "0");
}

#[test]
fn geometry_is_v3_with_compress_ratios() {
    let g = v4().pool(&opts()).unwrap().geometry;
    let r: Vec<(&str, u64)> = g
        .buffers
        .iter()
        .map(|b| (b.name(), b.compress_ratio))
        .collect();
    assert_eq!(
        r,
        [
            ("swa", 1),
            ("c4_kv", 4),
            ("c4_index_k", 4),
            ("c128_kv", 128),
            ("c4_state", 32),
            ("c4_index_state", 32),
            ("c128_state", 1)
        ]
    );
    // Bytes of one page over all layers (a state buffer: one slot): swa 43 x 149,760 =
    // 6,439,680; c4_kv 21 x 37,440 = 786,240; c4_index_k 21 x 8,448 = 177,408; c128_kv
    // 20 x 1,728 = 34,560; c4_state 21 x 65,536 = 1,376,256; c4_index_state 21 x 16,384 =
    // 344,064; c128_state 20 x 524,288 = 10,485,760.
    let per_page: Vec<u64> = g
        .buffers
        .iter()
        .map(|b| b.layers * b.layout.page_stride_bytes(b.rows_per_page(256)).unwrap())
        .collect();
    assert_eq!(
        per_page,
        [
            6_439_680, 786_240, 177_408, 34_560, 1_376_256, 344_064, 10_485_760
        ]
    );
    let text = kvlayout_core::file::to_json(&g);
    assert!(text.contains("kvlayout.geometry/v3"), "{text}");
    let back = kvlayout_core::file::from_json(&text).unwrap();
    assert!(kvlayout_core::compare(&g, &back).is_ok());
}

#[test]
fn kv_layouts_are_shared_case_24s_records() {
    // ../shared/cases/24-dsv4-pd-flashmla-584-vs-trtllm-512: the prefill side's `swa` buffer
    // (DeepSeekV4SingleKVPool, 584 B) and the decode side's (DeepSeekV4UniformFP8KVPool, 512
    // B), their buffers copied here (page size 64 there; the record does not depend on it).
    let case = |buffer: &str| {
        let text = format!(
            r#"{{"schema": "kvlayout.geometry/v2", "name": "case 24", "page_size_tokens": 64,
                "pages": 1024, "memory_layout": "layer_first", "buffers": [{buffer}]}}"#
        );
        kvlayout_core::file::from_json(&text).unwrap().buffers[0]
            .layout
            .clone()
    };
    let flashmla = case(
        r#"{"name": "swa", "layers": 43, "arrangement": {"planes": [["nope", "rope"], ["scale", "pad"]]},
            "sections": [{"name": "nope", "dtype": "f8e4m3", "shape": [448]},
                         {"name": "rope", "dtype": "bf16", "shape": [64]},
                         {"name": "scale", "dtype": "ue8m0", "shape": [7], "scales": "nope", "block_elems": 64},
                         {"name": "pad", "dtype": "u8", "shape": [1]}],
            "page_align_bytes": 576, "attention": {"sliding_window_tokens": 128}}"#,
    );
    let trtllm = case(
        r#"{"name": "swa", "layers": 43, "arrangement": "token_major",
            "sections": [{"name": "nope", "dtype": "f8e4m3", "shape": [448]},
                         {"name": "rope", "dtype": "f8e4m3", "shape": [64]}],
            "attention": {"sliding_window_tokens": 128}}"#,
    );
    for (layout, want) in [(KvLayout::FlashMla, flashmla), (KvLayout::Trtllm, trtllm)] {
        let plans = v4()
            .plan(&Options {
                kv_layout: layout,
                ..opts()
            })
            .unwrap();
        for p in plans
            .iter()
            .filter(|p| p.name.ends_with("kv") || p.name == "swa")
        {
            assert_eq!(p.layout, want, "{layout:?} {}", p.name);
        }
    }
}
