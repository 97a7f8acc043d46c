//! `kvlayout describe`'s numbers: each built-in model config mapped to its pool geometry, bytes
//! per token per layer per buffer and the all-layer total, against totals worked by hand from
//! docs/DESIGN-facts.md ("Model configs" and "Token layouts").

use kvlayout_core::{MemoryLayout, file};
use kvlayout_models::{
    Attention, BUILTIN, BufferAttention, IndexK, KvDtype, LayersByAttention, Model, ModelError,
    ModelPool, ModelSource, Options, PoolOptions, Shard, StateDtype, Totals, Tp,
};

fn pool(name: &str, kv_dtype: Option<KvDtype>, index_k: IndexK) -> ModelPool {
    let model = Model::builtin(name)
        .unwrap_or_else(|| panic!("{name} is not built in"))
        .unwrap();
    model
        .pool(&PoolOptions {
            kv_dtype,
            index_k,
            ..PoolOptions::default()
        })
        .unwrap()
}

fn total(name: &str, kv_dtype: Option<KvDtype>, index_k: IndexK) -> u64 {
    pool(name, kv_dtype, index_k)
        .geometry
        .bytes_per_token_all_layers()
        .unwrap()
}

/// (buffer, format, layers, bytes per token per layer, page stride) of each buffer.
fn rows(p: &ModelPool) -> Vec<(String, String, u64, u64, u64)> {
    p.summary()
        .unwrap()
        .into_iter()
        .map(|r| {
            (
                r.name,
                r.format,
                r.layers,
                r.bytes_per_token,
                r.page_stride_bytes,
            )
        })
        .collect()
}

#[test]
fn deepseek_v32_fp8_kv_fp8_index_k() {
    // 61 x (656 + 132) = 61 x 788 = 48,068 B/token.
    assert_eq!(total("deepseek-v3.2-exp", None, IndexK::Fp8), 48_068);
    let p = pool("deepseek-v3.2-exp", None, IndexK::Fp8);
    // Page strides: 64 x 656 = 41,984; 64 x 132 = 8,448.
    assert_eq!(
        rows(&p),
        [
            ("kv".into(), "dsa_mla_fp8".into(), 61, 656, 41_984),
            ("index_k".into(), "index_k_fp8".into(), 61, 132, 8_448),
        ]
    );
}

#[test]
fn deepseek_v32_bf16_and_fp4_index_k() {
    // 61 x (656 + 256) = 61 x 912 = 55,632 B/token.
    assert_eq!(total("deepseek-v3.2-exp", None, IndexK::Bf16), 55_632);
    // fp4: 128 / 2 + 4 = 68; 61 x (656 + 68) = 61 x 724 = 44,164 B/token.
    assert_eq!(total("deepseek-v3.2-exp", None, IndexK::Fp4), 44_164);
    // bf16 KV on a DSA model: the bf16 MLA row, 61 x (1152 + 132) = 61 x 1284 = 78,324.
    assert_eq!(
        total("deepseek-v3.2-exp", Some(KvDtype::Bf16), IndexK::Fp8),
        78_324
    );
}

#[test]
fn mla_models() {
    // DeepSeek-V3 bf16: 61 x (512 + 64) x 2 = 61 x 1152 = 70,272 B/token.
    assert_eq!(total("deepseek-v3", None, IndexK::Fp8), 70_272);
    // Plain fp8 MLA: 61 x 576 = 35,136.
    assert_eq!(
        total("deepseek-v3", Some(KvDtype::Fp8), IndexK::Fp8),
        35_136
    );
    // Kimi-K2: the same latent (64 heads do not change the MLA cache): 61 x 1152 = 70,272.
    assert_eq!(total("kimi-k2", None, IndexK::Fp8), 70_272);
    let p = pool("deepseek-v3", None, IndexK::Fp8);
    assert_eq!(
        rows(&p),
        [("kv".into(), "mla_bf16".into(), 61, 1152, 73_728)]
    );
}

#[test]
fn gqa_models() {
    // K + V, 8 KV heads x 128 x 2 B each: 2 x 2048 = 4096 B/token/layer.
    // Llama-3.1-8B: 32 x 4096 = 131,072 (head_dim = 4096 / 32 = 128 from hidden_size).
    assert_eq!(total("llama-3.1-8b", None, IndexK::Fp8), 131_072);
    // Llama-3.1-70B: 80 x 4096 = 327,680 (head_dim = 8192 / 64 = 128).
    assert_eq!(total("llama-3.1-70b", None, IndexK::Fp8), 327_680);
    // Qwen3-8B: 36 x 4096 = 147,456.
    assert_eq!(total("qwen3-8b", None, IndexK::Fp8), 147_456);
    // GLM-4.5: 92 x 4096 = 376,832.
    assert_eq!(total("glm-4.5", None, IndexK::Fp8), 376_832);
    // Qwen3-235B-A22B: 4 KV heads, 2 x 4 x 128 x 2 = 2048; 94 x 2048 = 192,512.
    assert_eq!(total("qwen3-235b-a22b", None, IndexK::Fp8), 192_512);
    let p = pool("qwen3-235b-a22b", None, IndexK::Fp8);
    // Page stride 64 x 2048 = 131,072; built at run time (no 4 x 128 const).
    assert_eq!(
        rows(&p),
        [("kv".into(), "mha_bf16_4x128".into(), 94, 2048, 131_072)]
    );
    // fp8 halves it: 32 x 2048 = 65,536 for Llama-3.1-8B.
    assert_eq!(
        total("llama-3.1-8b", Some(KvDtype::Fp8), IndexK::Fp8),
        65_536
    );
}

#[test]
fn every_builtin_config_parses_with_its_attention_family() {
    // (name, family, num_hidden_layers, layers full / sliding / chunked / linear / mamba /
    // without cache), from each config's own fields (worked in the tests below).
    let expected = [
        (
            "deepseek-v3.2-exp",
            Attention::MlaDsa,
            61,
            [61, 0, 0, 0, 0, 0],
        ),
        ("deepseek-v3", Attention::Mla, 61, [61, 0, 0, 0, 0, 0]),
        ("kimi-k2", Attention::Mla, 61, [61, 0, 0, 0, 0, 0]),
        ("glm-4.5", Attention::Gqa, 92, [92, 0, 0, 0, 0, 0]),
        ("llama-3.1-8b", Attention::Gqa, 32, [32, 0, 0, 0, 0, 0]),
        ("llama-3.1-70b", Attention::Gqa, 80, [80, 0, 0, 0, 0, 0]),
        ("qwen3-8b", Attention::Gqa, 36, [36, 0, 0, 0, 0, 0]),
        ("qwen3-235b-a22b", Attention::Gqa, 94, [94, 0, 0, 0, 0, 0]),
        ("gpt-oss-20b", Attention::Gqa, 24, [12, 12, 0, 0, 0, 0]),
        ("qwen3-coder-next", Attention::Gqa, 48, [12, 0, 0, 36, 0, 0]),
        ("gemma-3-4b-it", Attention::Gqa, 34, [5, 29, 0, 0, 0, 0]),
        ("gemma-4-26b-a4b", Attention::Gqa, 30, [5, 25, 0, 0, 0, 0]),
        (
            "nemotron-nano-9b-v2",
            Attention::Gqa,
            56,
            [4, 0, 0, 0, 27, 25],
        ),
        ("llama-4-scout", Attention::Gqa, 48, [12, 0, 36, 0, 0, 0]),
        // models/tests/families_2026.rs works these four by hand.
        ("recurrentgemma-2b", Attention::Gqa, 26, [0, 8, 0, 18, 0, 0]),
        (
            "kimi-linear-48b-a3b",
            Attention::Mla,
            27,
            [7, 0, 0, 20, 0, 0],
        ),
        ("gemma-4-e2b-it", Attention::Gqa, 35, [7, 28, 0, 0, 0, 0]),
        ("mimo-v2-flash", Attention::Gqa, 48, [9, 39, 0, 0, 0, 0]),
    ];
    // DeepSeek-V4-Flash (models/tests/deepseek_v4.rs): 2 sliding + 41 compressed layers, at
    // SGLang's 256-token page.
    let v4 = Model::builtin("deepseek-v4-flash").unwrap().unwrap();
    assert_eq!(v4.attention(), Attention::Dsv4);
    let t = v4
        .totals(&Options {
            page_size_tokens: v4.engine_page_size_tokens(),
            ..Options::default()
        })
        .unwrap();
    assert_eq!(
        (
            t.layers_by_attention.sliding,
            t.layers_by_attention.compressed
        ),
        (2, 41)
    );
    assert_eq!(BUILTIN.len(), expected.len() + 1);
    for (name, attention, layers, [full, sliding, chunked, linear, mamba, no_cache]) in expected {
        let m = Model::builtin(name).unwrap().unwrap();
        assert_eq!(m.attention(), attention, "{name}");
        assert_eq!(m.config.num_hidden_layers, layers, "{name}");
        let t = m.totals(&Options::default()).unwrap();
        assert_eq!(
            t.layers_by_attention,
            LayersByAttention {
                full,
                sliding,
                chunked,
                linear,
                compressed: 0,
                mamba,
                no_cache
            },
            "{name}"
        );
    }
    // Names are case-insensitive.
    assert!(Model::builtin("DeepSeek-V3.2-Exp").is_some());
    assert!(Model::builtin("GPT-OSS-20B").is_some());
}

#[test]
fn model_path_is_read_from_a_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/qwen3-8b.json");
    let m = Model::load(path).unwrap();
    assert_eq!(m.config.head_dim, Some(128));
    let err = Model::load("no-such-model").unwrap_err();
    assert!(matches!(err, ModelError::NotFound { .. }));
    assert!(err.to_string().contains("deepseek-v3.2-exp"), "{err}");
}

#[test]
fn describe_json_is_a_geometry_file_that_reads_back() {
    let p = pool("deepseek-v3.2-exp", None, IndexK::Bf16);
    let text = file::to_json(&p.geometry);
    let back = file::from_json(&text).unwrap();
    assert_eq!(back.memory_layout, MemoryLayout::LayerFirst);
    assert_eq!(back.fingerprint(), p.geometry.fingerprint());
    // It is the seed's device geometry (shared case 00 a.json) up to name and page count.
    let case_a: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(case_a["buffers"][1]["sections"][0]["dtype"], "bf16");
    assert_eq!(case_a["buffers"][1]["arrangement"], "section_major");
}

#[test]
fn bad_head_dim_is_an_error_naming_the_field() {
    let m = Model::parse(
        "odd",
        "inline",
        r#"{"num_hidden_layers": 2, "num_attention_heads": 3, "hidden_size": 100}"#,
    )
    .unwrap();
    let err = m.pool(&PoolOptions::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "model \"odd\": hidden_size: 100 is not a multiple of num_attention_heads 3"
    );
}

/// Hostile review: an overflow blamed the first field the builder was given, not the one at
/// fault (`"head_dim": 2^64 - 1` was reported as `num_key_value_heads: 2 gives an invalid
/// layout`, a `qk_rope_head_dim` of 2^63 - 1 as `kv_lora_rank: 512`). 2 heads x (2^64 - 1)
/// elements and (2^63 - 1) x 16 bits both pass 2^64.
#[test]
fn an_overflow_names_the_field_at_fault_and_its_value() {
    let e = refusal(
        r#"{"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
            "head_dim": 18446744073709551615}"#,
    );
    assert!(
        e.contains(
            "head_dim: 18446744073709551615 (with num_key_value_heads 2) gives an invalid layout: overflow"
        ),
        "{e}"
    );
    let e = refusal(
        r#"{"num_hidden_layers": 4, "num_attention_heads": 8, "kv_lora_rank": 512,
            "qk_rope_head_dim": 9223372036854775807}"#,
    );
    assert!(
        e.contains(
            "qk_rope_head_dim: 9223372036854775807 (with kv_lora_rank 512) gives an invalid layout: overflow"
        ),
        "{e}"
    );
    // 2^62 KV heads (dividing 2^62 query heads) x 64: the heads are at fault.
    let e = refusal(
        r#"{"num_hidden_layers": 4, "num_attention_heads": 4611686018427387904,
            "num_key_value_heads": 4611686018427387904, "head_dim": 64}"#,
    );
    assert!(
        e.contains(
            "num_key_value_heads: 4611686018427387904 (with head_dim 64) gives an invalid layout: overflow"
        ),
        "{e}"
    );
    // head_dim from hidden_size 2^63 / 2 heads = 2^62, x 2 heads x 16 bits: hidden_size is named.
    let e = refusal(
        r#"{"num_hidden_layers": 4, "num_attention_heads": 2, "hidden_size": 9223372036854775808}"#,
    );
    assert!(
        e.contains(
            "hidden_size: 9223372036854775808 (with num_key_value_heads 2) gives an invalid layout: overflow"
        ),
        "{e}"
    );
}

fn totals_of(name: &str, opts: &Options) -> Totals {
    Model::builtin(name).unwrap().unwrap().totals(opts).unwrap()
}

/// (name, attention, layer ids, bytes per token per layer) of each buffer in the plan.
fn buffers(name: &str, opts: &Options) -> Vec<(String, BufferAttention, Vec<u64>, u64)> {
    Model::builtin(name)
        .unwrap()
        .unwrap()
        .plan(opts)
        .unwrap()
        .into_iter()
        .map(|b| {
            let per = b.layout.bytes_per_token().unwrap();
            (b.name, b.attention, b.layer_ids, per)
        })
        .collect()
}

fn every(from: u64, step: u64, to: u64) -> Vec<u64> {
    (from..to).step_by(step as usize).collect()
}

#[test]
fn gpt_oss_20b_full_and_window() {
    // configs/gpt-oss-20b.json: layer_types alternate sliding_attention / full_attention (24),
    // sliding_window 128, num_key_value_heads 8, head_dim 64, bf16.
    // K + V per layer: 2 x 8 x 64 x 2 B = 2,048 B/token.
    let t = totals_of("gpt-oss-20b", &Options::default());
    assert_eq!(t.full_bytes_per_token, 12 * 2_048); // 24,576
    assert_eq!(t.full_bytes_per_token, 24_576);
    assert_eq!(t.window_bytes_per_request_max, 12 * 2_048 * 128); // 3,145,728
    assert_eq!(t.window_bytes_per_request_max, 3_145_728);
    assert_eq!(t.state_bytes_per_request, 0);
    assert_eq!(
        buffers("gpt-oss-20b", &Options::default()),
        [
            (
                "swa".to_string(),
                BufferAttention::SlidingWindow { window_tokens: 128 },
                every(0, 2, 24),
                2 * 8 * 64 * 2
            ),
            (
                "full".to_string(),
                BufferAttention::Full,
                every(1, 2, 24),
                2 * 8 * 64 * 2
            ),
        ]
    );
}

#[test]
fn qwen3_coder_next_full_and_state() {
    // configs/qwen3-coder-next.json: 48 layers, (linear x3, full) x 12; full layers
    // num_key_value_heads 2, head_dim 256: 2 x 2 x 256 x 2 B = 2,048 B/token; 12 x 2,048.
    let t = totals_of("qwen3-coder-next", &Options::default());
    assert_eq!(t.full_bytes_per_token, 12 * 2 * 2 * 256 * 2);
    assert_eq!(t.full_bytes_per_token, 24_576);
    // Per linear layer (SGLang configs/qwen3_next.py + mamba_utils.py Mamba2StateShape):
    // conv: conv_dim = 2 x linear_num_key_heads 16 x linear_key_head_dim 128
    //       + linear_num_value_heads 32 x linear_value_head_dim 128 = 8,192 channels,
    //       x (linear_conv_kernel_dim 4 - 1) = 3 positions, bf16: 8,192 x 3 x 2 = 49,152 B;
    // temporal: [32 value heads, 128, 128] f32 (SGLang default): 32 x 128 x 128 x 4 = 2,097,152 B.
    let conv = (2 * 16 * 128 + 32 * 128) * (4 - 1) * 2;
    let temporal = 32 * 128 * 128 * 4;
    assert_eq!((conv, temporal), (49_152, 2_097_152));
    // 36 linear layers: 36 x (49,152 + 2,097,152) = 77,266,944 B per request.
    assert_eq!(t.state_bytes_per_request, 36 * (conv + temporal));
    assert_eq!(t.state_bytes_per_request, 77_266_944);
    let linear: Vec<u64> = (0..48).filter(|i| (i + 1) % 4 != 0).collect();
    assert_eq!(
        buffers("qwen3-coder-next", &Options::default()),
        [
            (
                "conv".to_string(),
                BufferAttention::State,
                linear.clone(),
                conv
            ),
            (
                "temporal".to_string(),
                BufferAttention::State,
                linear,
                temporal
            ),
            (
                "full".to_string(),
                BufferAttention::Full,
                every(3, 4, 48),
                2_048
            ),
        ]
    );
    // vLLM's default for a bf16 model keeps the state in bf16: 32 x 128 x 128 x 2 = 1,048,576.
    let bf16 = Options {
        state_dtype: Some(StateDtype::Bf16),
        ..Options::default()
    };
    assert_eq!(
        totals_of("qwen3-coder-next", &bf16).state_bytes_per_request,
        36 * (49_152 + 32 * 128 * 128 * 2)
    );
}

#[test]
fn qwen3_coder_next_state_splits_over_ranks() {
    // --tp 4: 16 / 4 = 4 key heads, 32 / 4 = 8 value heads per rank; every size quarters.
    let tp = Options {
        tp: Some(Tp::new(4, 1).unwrap()),
        ..Options::default()
    };
    let t = totals_of("qwen3-coder-next", &tp);
    assert_eq!(t.state_bytes_per_request, 36 * (49_152 + 2_097_152) / 4);
    // Full layers: 2 KV heads on 4 ranks: one head each, replicated twice: 2 x 1 x 256 x 2.
    assert_eq!(t.full_bytes_per_token, 12 * 2 * 256 * 2);
    let plan = Model::builtin("qwen3-coder-next")
        .unwrap()
        .unwrap()
        .plan(&tp)
        .unwrap();
    assert_eq!(
        plan[1].shard,
        Some(Shard::Heads {
            tp: Tp { size: 4, rank: 1 },
            heads_total: 32,
            local: 8,
            first: 8,
            replicas: 1
        })
    );
    // Rank 1 of 4 with 2 heads: head 1 / (4 / 2) = 0, as vLLM QKVParallelLinear.
    assert_eq!(
        plan[2].shard,
        Some(Shard::Heads {
            tp: Tp { size: 4, rank: 1 },
            heads_total: 2,
            local: 1,
            first: 0,
            replicas: 2
        })
    );
}

#[test]
fn llama_31_8b_at_tp_2() {
    // 8 KV heads over 2 ranks: 4 per rank, head_dim 4096 / 32 = 128, bf16:
    // 32 x 2 x 4 x 128 x 2 = 65,536 B/token.
    for rank in [0, 1] {
        let opts = Options {
            tp: Some(Tp::new(2, rank).unwrap()),
            ..Options::default()
        };
        let t = totals_of("llama-3.1-8b", &opts);
        assert_eq!(t.full_bytes_per_token, 32 * 2 * 4 * 128 * 2);
        assert_eq!(t.full_bytes_per_token, 65_536);
        let plan = Model::builtin("llama-3.1-8b")
            .unwrap()
            .unwrap()
            .plan(&opts)
            .unwrap();
        assert_eq!(
            plan[0].shard,
            Some(Shard::Heads {
                tp: Tp { size: 2, rank },
                heads_total: 8,
                local: 4,
                first: 4 * rank,
                replicas: 1
            })
        );
    }
    // MLA: the latent is replicated, 61 x 656 + 61 x 132 on every rank.
    let t = totals_of(
        "deepseek-v3.2-exp",
        &Options {
            tp: Some(Tp::new(8, 5).unwrap()),
            ..Options::default()
        },
    );
    assert_eq!(t.full_bytes_per_token, 61 * (656 + 132));
}

#[test]
fn deepseek_v32_totals() {
    // fp8 KV (656) + fp8 index-K (132) in all 61 layers: 61 x 788 = 48,068 B/token.
    let t = totals_of("deepseek-v3.2-exp", &Options::default());
    assert_eq!(t.full_bytes_per_token, 61 * (656 + 132));
    assert_eq!(t.full_bytes_per_token, 48_068);
    assert_eq!(
        (t.window_bytes_per_request_max, t.state_bytes_per_request),
        (0, 0)
    );
}

#[test]
fn gemma_3_global_every_sixth_layer() {
    // configs/gemma-3-4b-it.json (text_config): 34 layers, sliding_window 1024,
    // sliding_window_pattern 6: layer i global iff (i + 1) % 6 == 0: 5, 11, 17, 23, 29.
    // 4 KV heads x 256, bf16: 2 x 4 x 256 x 2 = 4,096 B/token/layer.
    let b = buffers("gemma-3-4b-it", &Options::default());
    assert_eq!(b[1].2, [5, 11, 17, 23, 29]);
    assert_eq!(b[0].2.len(), 29);
    let t = totals_of("gemma-3-4b-it", &Options::default());
    assert_eq!(t.full_bytes_per_token, 5 * 4_096);
    assert_eq!(t.window_bytes_per_request_max, 29 * 4_096 * 1_024);
}

#[test]
fn gemma_4_global_layers_have_their_own_heads() {
    // configs/gemma-4-26b-a4b.json: (sliding x5, full) x5; sliding: 8 KV heads x head_dim 256;
    // full (attention_k_eq_v): num_global_key_value_heads 2 x global_head_dim 512, K and V both
    // cached (vLLM gemma4.py loads K's weights into both slots; V gets v_norm, K k_norm + RoPE).
    let b = buffers("gemma-4-26b-a4b", &Options::default());
    assert_eq!(
        b,
        [
            (
                "swa".to_string(),
                BufferAttention::SlidingWindow {
                    window_tokens: 1024
                },
                (0..30).filter(|i| (i + 1) % 6 != 0).collect::<Vec<u64>>(),
                2 * 8 * 256 * 2
            ),
            (
                "full".to_string(),
                BufferAttention::Full,
                vec![5, 11, 17, 23, 29],
                2 * 2 * 512 * 2
            ),
        ]
    );
    let t = totals_of("gemma-4-26b-a4b", &Options::default());
    // 5 x 4,096 = 20,480 B/token; 25 x 8,192 x 1,024 = 209,715,200 B/request.
    assert_eq!(t.full_bytes_per_token, 20_480);
    assert_eq!(t.window_bytes_per_request_max, 209_715_200);
}

#[test]
fn equal_page_bytes_like_vllm() {
    // Gemma 4: sliding pages 64 x 8,192 = 524,288 B; the full layers' 4,096 B/token get
    // 524,288 / 4,096 = 128 tokens per page (vLLM unify_kv_cache_spec_page_size).
    let opts = Options {
        equal_page_bytes: true,
        ..Options::default()
    };
    let pool = Model::builtin("gemma-4-26b-a4b")
        .unwrap()
        .unwrap()
        .pool(&opts)
        .unwrap();
    assert_eq!(pool.buffers[0].page_size_tokens, None);
    assert_eq!(pool.buffers[1].page_size_tokens, Some(128));
    assert_eq!(pool.geometry.buffers[1].page_size_tokens, Some(128));
    let strides: Vec<u64> = pool
        .summary()
        .unwrap()
        .iter()
        .map(|r| r.page_stride_bytes)
        .collect();
    assert_eq!(strides, [64 * 8_192, 128 * 4_096]);
    // 256 B/token (sliding, 2 x 2 x 32 x 2) and 384 (global, 2 x 2 x 48 x 2): 64 x 384 is not a
    // multiple of 64 x 256, so no page size gives equal bytes.
    let e = refusal(
        r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "global_head_dim": 48, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"]}"#,
    );
    assert!(e.is_empty(), "{e}");
    let m = Model::parse(
        "t",
        "t",
        r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 32, "global_head_dim": 48, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"]}"#,
    )
    .unwrap();
    let e = m.pool(&opts).unwrap_err().to_string();
    assert!(
        e.contains("buffer swa: a 16384-byte page does not divide the largest page, 24576 bytes"),
        "{e}"
    );
}

#[test]
fn llama_4_nope_layers_are_global() {
    // configs/llama-4-scout.json: attention_chunk_size 8192, no_rope_layers [] -> interval 4:
    // layer i is NoPE (global) iff (i + 1) % 4 == 0; the 36 RoPE layers attend in chunks.
    // 8 KV heads x 128 bf16: 4,096 B/token/layer.
    let b = buffers("llama-4-scout", &Options::default());
    assert_eq!(b[0].1, BufferAttention::Chunked { chunk_tokens: 8192 });
    assert_eq!(b[0].2.len(), 36);
    assert_eq!(b[1].2, every(3, 4, 48));
    let t = totals_of("llama-4-scout", &Options::default());
    assert_eq!(t.full_bytes_per_token, 12 * 4_096);
    assert_eq!(t.window_bytes_per_request_max, 36 * 4_096 * 8_192);
}

#[test]
fn nemotron_h_mamba_state_and_four_attention_layers() {
    // configs/nemotron-nano-9b-v2.json: hybrid_override_pattern of 56 characters, 27 'M' (Mamba2),
    // 4 '*' (attention, layers 14, 21, 30, 39), 25 '-' (MLP, no cache).
    let b = buffers("nemotron-nano-9b-v2", &Options::default());
    assert_eq!(b[2].0, "full");
    assert_eq!(b[2].2, [14, 21, 30, 39]);
    // Attention: 2 x 8 KV heads x 128 x 2 B = 4,096 B/token/layer; 4 layers.
    let t = totals_of("nemotron-nano-9b-v2", &Options::default());
    assert_eq!(t.full_bytes_per_token, 4 * 2 * 8 * 128 * 2);
    // Mamba2 (vLLM mamba_utils.py mamba2_state_shape, SGLang Mamba2StateShape.create):
    // conv_dim = mamba_num_heads 128 x mamba_head_dim 80 + 2 x n_groups 8 x ssm_state_size 128
    //          = 10,240 + 2,048 = 12,288 channels x (conv_kernel 4 - 1), bf16 = 73,728 B;
    // temporal [128, 80, 128] f32 = 5,242,880 B; 27 layers.
    let conv = (128 * 80 + 2 * 8 * 128) * (4 - 1) * 2;
    let temporal = 128 * 80 * 128 * 4;
    assert_eq!((conv, temporal), (73_728, 5_242_880));
    assert_eq!(t.state_bytes_per_request, 27 * (conv + temporal));
    assert_eq!(t.state_bytes_per_request, 143_548_416);
    // --tp 8: 8 groups / 8, 128 heads / 8, 8 KV heads / 8: every figure divides by 8.
    let t8 = totals_of(
        "nemotron-nano-9b-v2",
        &Options {
            tp: Some(Tp::new(8, 7).unwrap()),
            ..Options::default()
        },
    );
    assert_eq!(t8.state_bytes_per_request, 143_548_416 / 8);
    // One KV head per rank: 4 layers x 2 (K, V) x 1 head x 128 x 2 B.
    assert_eq!(t8.full_bytes_per_token, 4 * 2 * 128 * 2);
}

/// The refusal of `text` ("" when it maps).
fn refusal(text: &str) -> String {
    match Model::parse("t", "t", text) {
        Err(e) => e.to_string(),
        Ok(m) => m
            .totals(&Options::default())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default(),
    }
}

const GQA: &str =
    r#""num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64"#;

#[test]
fn unknown_layer_type_and_unmodelled_fields_are_refused_by_name() {
    let e = refusal(&format!(
        r#"{{{GQA}, "layer_types": ["full_attention", "mamba", "full_attention", "full_attention"]}}"#
    ));
    assert!(
        e.contains("layer_types[1]: \"mamba\" is not a layer type"),
        "{e}"
    );
    // num_kv_shared_layers is modelled (models/tests/families_2026.rs): the last 2 of 4 full
    // layers read layer 1's cache, so 2 layers x 2 x 2 heads x 64 x 2 B = 1,024 B/token; all 4
    // shared leaves no owner and is refused naming the field.
    let m = Model::parse(
        "t",
        "t",
        &format!(r#"{{{GQA}, "num_kv_shared_layers": 2}}"#),
    )
    .unwrap();
    assert_eq!(
        m.totals(&Options::default()).unwrap().full_bytes_per_token,
        2 * 2 * 2 * 64 * 2
    );
    let e = refusal(&format!(r#"{{{GQA}, "num_kv_shared_layers": 4}}"#));
    assert!(e.contains("num_kv_shared_layers: 4 is not below"), "{e}");
    let e = refusal(&format!(
        r#"{{{GQA}, "quantization_config": {{"kv_cache_scheme": {{"num_bits": 8}}}}}}"#
    ));
    assert!(e.contains("quantization_config.kv_cache_scheme"), "{e}");
    // ModelOpt's FP8 KV cache (hostile review: read as bf16, 4 x 2 x 2 x 64 x 2 = 2,048
    // B/token where fp8 is 1,024); refused like kv_cache_scheme, pointing at --kv-dtype.
    let e = refusal(&format!(
        r#"{{{GQA}, "quantization_config": {{"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}}}"#
    ));
    assert!(
        e.contains("quantization_config.kv_cache_quant_algo = \"FP8\""),
        "{e}"
    );
    assert!(e.contains("--kv-dtype"), "{e}");
    // null: no KV quantization, maps (2,048 B/token as above).
    let m = Model::parse(
        "t",
        "t",
        &format!(r#"{{{GQA}, "quantization_config": {{"kv_cache_quant_algo": null}}}}"#),
    )
    .unwrap();
    assert_eq!(
        m.totals(&Options::default()).unwrap().full_bytes_per_token,
        2_048
    );
    // Fields that size the cache under names the reader does not know (hostile review:
    // MiMo-V2's swa_* fields without its hybrid_layer_pattern, which alone reads them;
    // Step-3.5's num_attention_groups).
    for (field, value) in [
        ("swa_num_key_value_heads", "8"),
        ("swa_head_dim", "192"),
        ("num_attention_groups", "8"),
        // Unknown names with a shape ending.
        ("local_num_key_value_heads", "4"),
        ("swa_kv_heads", "4"),
        ("attention_head_dim", "96"),
        ("moe_layer_pattern", "\"EEDD\""),
    ] {
        let e = refusal(&format!(r#"{{{GQA}, "{field}": {value}}}"#));
        assert!(e.contains(&format!("{field} = ")), "{field}: {e}");
        assert!(e.contains("not modelled"), "{field}: {e}");
    }
    // v_head_dim 48 with head_dim 64 outside MLA: the V plane is narrower than K.
    let e = refusal(&format!(r#"{{{GQA}, "v_head_dim": 48}}"#));
    assert!(e.contains("v_head_dim = 48"), "{e}");
    // Harmless: v_head_dim equal to head_dim (given, or hidden_size 512 / 8 heads = 64), null
    // or 0 shape fields; 4 layers x 2 (K, V) x 2 heads x 64 x 2 B = 2,048 B/token.
    for extra in [
        r#""v_head_dim": 64"#,
        r#""swa_head_dim": null, "num_attention_groups": 0"#,
    ] {
        let m = Model::parse("t", "t", &format!("{{{GQA}, {extra}}}")).unwrap();
        assert_eq!(
            m.totals(&Options::default()).unwrap().full_bytes_per_token,
            4 * 2 * 2 * 64 * 2
        );
    }
    let m = Model::parse(
        "t",
        "t",
        r#"{"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
            "hidden_size": 512, "v_head_dim": 64}"#,
    )
    .unwrap();
    assert_eq!(
        m.totals(&Options::default()).unwrap().full_bytes_per_token,
        4 * 2 * 2 * 64 * 2
    );
    // Regressions (new-user check, session 8): harmless fields the shape-ending rule refused.
    // Hunyuan's attention_head_dim equal to head_dim, Nemotron-H's MTP draft pattern (its own
    // pool): 4 layers x 2 (K, V) x 2 heads x 64 x 2 B = 2,048 B/token, as without them.
    for extra in [
        r#""attention_head_dim": 64"#,
        r#""mtp_hybrid_override_pattern": "*E""#,
    ] {
        let m = Model::parse("t", "t", &format!("{{{GQA}, {extra}}}")).unwrap();
        assert_eq!(
            m.totals(&Options::default()).unwrap().full_bytes_per_token,
            4 * 2 * 2 * 64 * 2,
            "{extra}"
        );
    }
    // MiniMax-M2's attn_type_list of 1s only (softmax everywhere): plain GQA, 2,048 B/token as
    // above; a 0 (lightning attention) anywhere is still refused.
    let m = Model::parse(
        "t",
        "t",
        &format!(r#"{{{GQA}, "attn_type_list": [1, 1, 1, 1]}}"#),
    )
    .unwrap();
    assert_eq!(
        m.totals(&Options::default()).unwrap().full_bytes_per_token,
        4 * 2 * 2 * 64 * 2
    );
    let e = refusal(&format!(r#"{{{GQA}, "attn_type_list": [0, 1, 0, 1]}}"#));
    assert!(e.contains("attn_type_list = [0,1,0,1]"), "{e}");
    // transformers' re-saved DeepSeek-V3 config: qk_head_dim 192 (128 nope + 64 rope) and
    // head_dim 64 under MLA; the latent row is 512 + 64 bf16 = 1,152 B, 61 layers = 70,272.
    let dsv3: serde_json::Value =
        serde_json::from_str(include_str!("../../configs/deepseek-v3.json")).unwrap();
    let mut resaved = dsv3.clone();
    resaved["qk_head_dim"] = 192.into();
    resaved["head_dim"] = 64.into();
    let m = Model::parse("t", "t", &resaved.to_string()).unwrap();
    let bf16 = Options {
        kv_dtype: Some(KvDtype::Bf16),
        ..Options::default()
    };
    assert_eq!(m.totals(&bf16).unwrap().full_bytes_per_token, 61 * 1_152);
    // Gemma 3 as transformers exports it: `_sliding_window_pattern` (read as
    // sliding_window_pattern), with or without the layer_types it implies. gemma-3-4b-it: 34
    // layers, global iff (i + 1) % 6 == 0: 5 full, 29 sliding (window 1,024); 2 x 4 KV heads x
    // 256 x 2 B = 4,096 B/token/layer: 5 x 4,096 = 20,480 B/token, 29 x 4,096 x 1,024 =
    // 121,634,816 B/request.
    let gemma: serde_json::Value =
        serde_json::from_str(include_str!("../../configs/gemma-3-4b-it.json")).unwrap();
    let mut exported = gemma.clone();
    let text = exported["text_config"].as_object_mut().unwrap();
    let pattern = text.remove("sliding_window_pattern").unwrap();
    text.insert("_sliding_window_pattern".into(), pattern);
    let with_types = {
        let mut e = exported.clone();
        let types: Vec<&str> = (0..34)
            .map(|i| {
                if (i + 1) % 6 == 0 {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();
        e["text_config"]["layer_types"] = serde_json::json!(types);
        e
    };
    for config in [exported, with_types] {
        let t = Model::parse("t", "t", &config.to_string())
            .unwrap()
            .totals(&Options::default())
            .unwrap();
        assert_eq!(t.full_bytes_per_token, 20_480);
        assert_eq!(t.window_bytes_per_request_max, 121_634_816);
    }
    // A key named twice (hostile review: the last value won, 1 KV head instead of 2), at the
    // top level or in text_config.
    let e = refusal(&format!(r#"{{{GQA}, "num_key_value_heads": 1}}"#));
    assert!(
        e.contains("json: key \"num_key_value_heads\" given twice in one object"),
        "{e}"
    );
    let e = refusal(&format!(r#"{{"text_config": {{{GQA}, "head_dim": 128}}}}"#));
    assert!(
        e.contains("text_config: key \"head_dim\" given twice in one object"),
        "{e}"
    );
    let e = refusal(&format!(r#"{{{GQA}, "torch_dtype": "float16"}}"#));
    assert!(e.contains("torch_dtype = \"float16\""), "{e}");
    // sliding layers need their window.
    let e = refusal(&format!(
        r#"{{{GQA}, "layer_types": ["sliding_attention", "full_attention", "full_attention", "full_attention"]}}"#
    ));
    assert!(e.contains("sliding_window: missing"), "{e}");
    // One entry per layer.
    let e = refusal(&format!(r#"{{{GQA}, "layer_types": ["full_attention"]}}"#));
    assert!(
        e.contains("layer_types: 1 entries, but num_hidden_layers is 4"),
        "{e}"
    );
    // layer_types and full_attention_interval must agree.
    let e = refusal(&format!(
        r#"{{{GQA}, "full_attention_interval": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
            "layer_types": ["full_attention", "linear_attention", "full_attention", "linear_attention"]}}"#
    ));
    assert!(
        e.contains("full_attention_interval: gives layer 0 linear"),
        "{e}"
    );
}

#[test]
fn nested_text_config_is_read_and_named_in_errors() {
    // Gemma 3 as Hugging Face ships it: the text fields under text_config.
    let m = Model::parse(
        "g",
        "g",
        &format!(r#"{{"model_type": "gemma3", "text_config": {{{GQA}, "sliding_window": 16, "sliding_window_pattern": 2}}}}"#),
    )
    .unwrap();
    // Layers 1 and 3 global; 2 x 2 x 64 x 2 = 512 B/token/layer.
    let t = m.totals(&Options::default()).unwrap();
    assert_eq!(t.full_bytes_per_token, 2 * 512);
    assert_eq!(t.window_bytes_per_request_max, 2 * 512 * 16);
    let e = Model::parse("g", "g", r#"{"text_config": {"num_attention_heads": 8}}"#)
        .unwrap_err()
        .to_string();
    assert!(e.contains("missing field `num_hidden_layers`"), "{e}");
    assert!(e.contains("text_config"), "{e}");
}

#[test]
fn sources_name_path_directory_and_text() {
    let t = kvlayout_models::totals(
        &ModelSource::Name("LLAMA-3.1-8B".into()),
        &Options::default(),
    )
    .unwrap();
    assert_eq!(t.model, "llama-3.1-8b");
    assert_eq!(t.full_bytes_per_token, 131_072);
    let t = kvlayout_models::totals(
        &ModelSource::Json {
            name: "inline".into(),
            text: format!("{{{GQA}}}"),
        },
        &Options::default(),
    )
    .unwrap();
    // 4 x 2 x 2 x 64 x 2 = 2,048.
    assert_eq!(t.full_bytes_per_token, 2_048);
    let dir = std::env::temp_dir().join(format!("kvlayout-describe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = kvlayout_models::describe(&ModelSource::Path(dir.clone()), &Options::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&format!("looked for {}", dir.join("config.json").display())),
        "{e}"
    );
    // A geometry file is not a model config.
    std::fs::write(
        dir.join("config.json"),
        r#"{"schema": "kvlayout.geometry/v1", "name": "x", "page_size_tokens": 64, "pages": 1,
            "memory_layout": "layer_first", "buffers": []}"#,
    )
    .unwrap();
    let e = kvlayout_models::describe(&ModelSource::Path(dir.clone()), &Options::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("geometry file"), "{e}");
    assert!(e.contains("expects"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tp_that_does_not_divide_is_refused() {
    // 8 KV heads on 3 ranks: neither 8 % 3 nor 3 % 8 is 0.
    let opts = Options {
        tp: Some(Tp::new(3, 0).unwrap()),
        ..Options::default()
    };
    let e = Model::builtin("llama-3.1-8b")
        .unwrap()
        .unwrap()
        .totals(&opts)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("num_attention_heads: 32 heads do not split evenly over --tp 3"),
        "{e}"
    );
    assert!(Tp::new(2, 2).is_err());
    assert!(Tp::new(0, 0).is_err());
}

#[test]
fn configs_readme_points_at_files_that_exist() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs");
    let readme = std::fs::read_to_string(format!("{dir}/README.md")).unwrap();
    // Every built-in config is listed, and every `configs/` file the README names exists.
    for (name, file, _) in BUILTIN {
        assert!(
            readme.contains(&format!("`{file}`")),
            "README lacks {file} ({name})"
        );
    }
    for word in readme.split('`') {
        if word.ends_with(".json") && !word.contains('/') && !word.contains(' ') {
            if word == "config.json" {
                continue;
            }
            assert!(
                std::path::Path::new(&format!("{dir}/{word}")).exists(),
                "README names {word}, which is not in configs/"
            );
        }
        if let Some(rest) = word.strip_prefix("geometry/") {
            assert!(
                std::path::Path::new(&format!("{dir}/geometry/{rest}")).exists(),
                "{word}"
            );
        }
    }
}

/// One reviewed snapshot per hybrid model (through serde): each buffer's format, what it keeps,
/// its layers, bytes per token (state: per slot) and page stride, the totals and the pool
/// fingerprint. The key figures are asserted by hand in the tests above.
#[test]
fn hybrid_geometry_snapshots() {
    for name in [
        "gpt-oss-20b",
        "qwen3-coder-next",
        "gemma-3-4b-it",
        "gemma-4-26b-a4b",
        "llama-4-scout",
        "nemotron-nano-9b-v2",
    ] {
        let model = Model::builtin(name).unwrap().unwrap();
        let opts = Options::default();
        let pool = model.pool(&opts).unwrap();
        let rows: Vec<serde_json::Value> = pool
            .summary()
            .unwrap()
            .into_iter()
            .zip(&pool.buffers)
            .map(|(r, b)| {
                serde_json::json!({
                    "buffer": r.name,
                    "format": r.format,
                    "keeps": r.attention.to_string(),
                    "layer_ids": b.layer_ids,
                    "bytes_per_token_or_slot": r.bytes_per_token,
                    "page_stride_bytes": r.page_stride_bytes,
                })
            })
            .collect();
        let t = model.totals(&opts).unwrap();
        let value = serde_json::json!({
            "model": name,
            "buffers": rows,
            "totals": {
                "full_bytes_per_token": t.full_bytes_per_token,
                "window_bytes_per_request_max": t.window_bytes_per_request_max,
                "state_bytes_per_request": t.state_bytes_per_request,
            },
            "fingerprint": format!("{:#018x}", pool.geometry.fingerprint().unwrap()),
        });
        insta::assert_json_snapshot!(format!("describe_{name}"), value);
    }
}
