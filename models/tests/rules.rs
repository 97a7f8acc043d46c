//! The reading rules one by one, on small configs worked by hand (the built-in models' totals
//! are tested in `tests/tests/describe.rs`).

use kvlayout_models::shard::split_heads;
use kvlayout_models::{
    BufferAttention, KvDtype, LayerKind, Model, ModelError, Options, Shard, StateDtype, Tp,
};

const BASE: &str =
    r#""num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 16"#;

fn model(extra: &str) -> Model {
    Model::parse("t", "t", &format!("{{{BASE}{extra}}}")).unwrap()
}

fn kinds(extra: &str) -> Vec<&'static str> {
    model(extra)
        .layer_kinds()
        .unwrap()
        .into_iter()
        .map(LayerKind::key)
        .collect()
}

fn err(extra: &str) -> String {
    match Model::parse("t", "t", &format!("{{{BASE}{extra}}}")) {
        Err(e) => e.to_string(),
        Ok(m) => m.totals(&Options::default()).unwrap_err().to_string(),
    }
}

#[test]
fn sliding_window_patterns() {
    // Gemma 3: global iff (i + 1) % 3 == 0 -> layers 2 and 5.
    let g3 = kinds(r#", "sliding_window": 8, "sliding_window_pattern": 3"#);
    assert_eq!(
        g3,
        ["sliding", "sliding", "full", "sliding", "sliding", "full"]
    );
    // gemma2 without a pattern alternates (transformers Gemma2Config).
    let g2 = kinds(r#", "model_type": "gemma2", "sliding_window": 8"#);
    assert_eq!(
        g2,
        ["sliding", "full", "sliding", "full", "sliding", "full"]
    );
    // gemma3_text without a pattern: the transformers default 6 -> only layer 5 global.
    let g3d = kinds(r#", "model_type": "gemma3_text", "sliding_window": 8"#);
    assert_eq!(
        g3d,
        [
            "sliding", "sliding", "sliding", "sliding", "sliding", "full"
        ]
    );
    // Any other model with a window windows every layer (Mistral-7B-v0.1).
    assert_eq!(kinds(r#", "sliding_window": 8"#), ["sliding"; 6]);
    // use_sliding_window: false turns the window off (Qwen2/Qwen3 configs).
    assert_eq!(
        kinds(r#", "sliding_window": 8, "use_sliding_window": false"#),
        ["full"; 6]
    );
    // Regression: a qwen config with a window and no use_sliding_window read every layer as
    // windowed; transformers Qwen2Config / Qwen3Config default use_sliding_window to False.
    assert_eq!(
        kinds(r#", "model_type": "qwen3", "sliding_window": 8"#),
        ["full"; 6]
    );
    assert_eq!(
        kinds(r#", "model_type": "qwen2_moe", "sliding_window": 8"#),
        ["full"; 6]
    );
    // max_window_layers is a field of that family: the same default without a model type.
    assert_eq!(
        kinds(r#", "sliding_window": 8, "max_window_layers": 3"#),
        ["full"; 6]
    );
    // use_sliding_window true: layers i >= max_window_layers (3) windowed, 0..3 full
    // (transformers Qwen3Config.layer_types).
    assert_eq!(
        kinds(
            r#", "model_type": "qwen3", "sliding_window": 8, "use_sliding_window": true, "max_window_layers": 3"#
        ),
        ["full", "full", "full", "sliding", "sliding", "sliding"]
    );
    assert_eq!(
        kinds(r#", "sliding_window": 8, "use_sliding_window": true, "max_window_layers": 4"#),
        ["full", "full", "full", "full", "sliding", "sliding"]
    );
    let e = err(r#", "model_type": "qwen3", "sliding_window": 8, "use_sliding_window": true"#);
    assert!(
        e.contains("max_window_layers") && e.contains("missing"),
        "{e}"
    );
    let e = err(
        r#", "model_type": "qwen3_moe", "sliding_window": 8, "use_sliding_window": true, "max_window_layers": 3"#,
    );
    assert!(
        e.contains("use_sliding_window") && e.contains("qwen3_moe"),
        "{e}"
    );
    // Cohere 2 / EXAONE 4 window only some layers by a default pattern: refused without it.
    let e = err(r#", "model_type": "cohere2", "sliding_window": 8"#);
    assert!(
        e.contains("sliding_window_pattern") && e.contains("missing"),
        "{e}"
    );
    assert_eq!(
        kinds(r#", "model_type": "cohere2", "sliding_window": 8, "sliding_window_pattern": 3"#),
        ["sliding", "sliding", "full", "sliding", "sliding", "full"]
    );
}

#[test]
fn chunked_layers_follow_no_rope_layers() {
    // Default interval 4: layer 3 NoPE (global), others chunked.
    assert_eq!(
        kinds(r#", "attention_chunk_size": 32"#),
        [
            "chunked", "chunked", "chunked", "full", "chunked", "chunked"
        ]
    );
    assert_eq!(
        kinds(r#", "attention_chunk_size": 32, "no_rope_layers": [1, 0, 1, 0, 1, 0]"#),
        ["chunked", "full", "chunked", "full", "chunked", "full"]
    );
    let e = err(r#", "attention_chunk_size": 32, "no_rope_layers": [1, 2, 1, 0, 1, 0]"#);
    assert!(e.contains("no_rope_layers[1]: 2"), "{e}");
    let e = err(r#", "attention_chunk_size": 0"#);
    assert!(
        e.contains("attention_chunk_size: must be at least 1, got 0"),
        "{e}"
    );
}

const GDN: &str = r#", "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 8, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4"#;

#[test]
fn linear_attention_state() {
    let m = model(&format!(r#"{GDN}, "full_attention_interval": 3"#));
    assert_eq!(
        m.layer_kinds()
            .unwrap()
            .into_iter()
            .map(LayerKind::key)
            .collect::<Vec<_>>(),
        ["linear", "linear", "full", "linear", "linear", "full"]
    );
    // conv: (2 x 2 x 8 + 4 x 16) x (4 - 1) bf16 = 96 x 3 x 2 = 576 B;
    // temporal: [4, 16, 8] f32 = 512 x 4 = 2,048 B; 4 linear layers.
    let t = m.totals(&Options::default()).unwrap();
    assert_eq!(t.state_bytes_per_request, 4 * (576 + 2_048));
    // K/V of the 2 full layers: 2 x 2 x 16 x 2 = 128 B/token/layer.
    assert_eq!(t.full_bytes_per_token, 2 * 128);
    // mamba_ssm_dtype in the config (SGLang reads it), and the option over it.
    let bf16 = model(&format!(
        r#"{GDN}, "full_attention_interval": 3, "mamba_ssm_dtype": "bfloat16""#
    ));
    assert_eq!(
        bf16.totals(&Options::default())
            .unwrap()
            .state_bytes_per_request,
        4 * (576 + 1_024)
    );
    let f16 = Options {
        state_dtype: Some(StateDtype::F16),
        ..Options::default()
    };
    assert_eq!(
        bf16.totals(&f16).unwrap().state_bytes_per_request,
        4 * (576 + 1_024)
    );
    let plan = m.plan(&Options::default()).unwrap();
    assert_eq!(plan[0].attention, BufferAttention::State);
    assert_eq!(plan[0].layer_ids, [0, 1, 3, 4]);
    let e = err(&format!(
        r#"{GDN}, "full_attention_interval": 3, "mamba_ssm_dtype": "int8""#
    ));
    assert!(e.contains("mamba_ssm_dtype: \"int8\""), "{e}");
    let e = err(
        r#", "full_attention_interval": 3, "linear_num_key_heads": 3, "linear_num_value_heads": 4,
        "linear_key_head_dim": 8, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4"#,
    );
    assert!(
        e.contains("linear_num_value_heads: 4 is not a multiple of linear_num_key_heads 3"),
        "{e}"
    );
    let e = err(r#", "full_attention_interval": 3, "linear_num_key_heads": 2"#);
    assert!(e.contains("linear_num_value_heads: missing"), "{e}");
}

#[test]
fn heads_split_or_replicate_like_the_engines() {
    let tp = |size, rank| Tp::new(size, rank).unwrap();
    // 8 heads on 4 ranks: 2 each, rank 3 holds 6-7.
    assert_eq!(
        split_heads("t", "h", 8, tp(4, 3)).unwrap(),
        Shard::Heads {
            tp: tp(4, 3),
            heads_total: 8,
            local: 2,
            first: 6,
            replicas: 1
        }
    );
    // 2 heads on 8 ranks: each head on 4 ranks; rank 5 holds head 5 / 4 = 1.
    let s = split_heads("t", "h", 2, tp(8, 5)).unwrap();
    assert_eq!(
        s,
        Shard::Heads {
            tp: tp(8, 5),
            heads_total: 2,
            local: 1,
            first: 1,
            replicas: 4
        }
    );
    // Geometry v3: heads_total stays the model's 2 KV heads (never 2 x 4 replicas); the core
    // derives replicas 8 / 2 = 4 and rank 5's head 5 / 4 = 1.
    let g = s.geometry();
    assert_eq!(g, kvlayout_core::Shard::heads(8, 5, 2));
    assert_eq!((g.replicas(), g.heads_held()), (4, Some((1, 2))));
    for (heads, size) in [(6, 4), (3, 4), (4, 6)] {
        let e = split_heads("t", "h", heads, tp(size, 0)).unwrap_err();
        assert!(matches!(e, ModelError::Field { .. }), "{e}");
    }
}

#[test]
fn model_dtype_other_than_bf16_needs_an_explicit_kv_dtype() {
    let e = err(r#", "torch_dtype": "float16""#);
    assert!(e.contains("torch_dtype = \"float16\""), "{e}");
    let m = model(r#", "torch_dtype": "float16""#);
    let fp8 = Options {
        kv_dtype: Some(KvDtype::Fp8),
        ..Options::default()
    };
    // 6 x 2 x 2 x 16 x 1 = 384 B/token.
    assert_eq!(m.totals(&fp8).unwrap().full_bytes_per_token, 384);
    // The torch spelling of bf16 is bf16.
    assert!(
        model(r#", "dtype": "torch.bfloat16""#)
            .totals(&Options::default())
            .is_ok()
    );
    assert_eq!(KvDtype::from_name("BFloat16"), Some(KvDtype::Bf16));
}

#[test]
fn mla_query_heads_must_split_over_tp() {
    // MLA: the latent is replicated, but attention splits the 8 query heads of BASE:
    // 8 % 3 = 2, so --tp 3 is refused naming num_attention_heads (was accepted: the MHA path
    // checked the query heads, the MLA path did not).
    let m = model(r#", "kv_lora_rank": 512, "qk_rope_head_dim": 64"#);
    let at = |size, rank| Options {
        tp: Some(Tp::new(size, rank).unwrap()),
        ..Options::default()
    };
    let e = m.totals(&at(3, 1)).unwrap_err().to_string();
    assert!(
        e.contains("num_attention_heads: 8 heads do not split evenly over --tp 3"),
        "{e}"
    );
    // 8 % 4 = 0: the latent replicated, 6 layers x (512 + 64) x 2 B (bf16) = 6,912 B per token.
    assert_eq!(
        m.totals(&at(4, 3)).unwrap().full_bytes_per_token,
        6 * 576 * 2
    );
}

#[test]
fn page_size_0_is_refused_naming_the_model_and_the_value() {
    // `describe`'s table plans the buffers, then sizes them: the plan took page size 0 and
    // the sizing said "buffer kv: page_size_tokens must be at least 1" (no model, no value).
    let opts = Options {
        page_size_tokens: 0,
        ..Options::default()
    };
    let e = model("").plan(&opts).unwrap_err().to_string();
    assert!(
        e.contains("model \"t\": page_size_tokens: must be at least 1, got 0"),
        "{e}"
    );
}

/// A page size whose page overflows 64 bits is blamed on `page_size_tokens` with its value
/// (trial finding: `kvlayout replay --page-size-tokens 18446744073709551615` said only
/// "buffers[0] (kv): overflow in layout arithmetic", naming neither flag nor value). BASE's
/// page holds K and V of 2 heads x 16 dims in bf16: 128 B a token, so 2^64 - 1 tokens overflow.
/// A page count that overflows the pool stays the geometry's error: the page size is fine.
#[test]
fn a_page_size_that_overflows_is_named_with_its_value() {
    let opts = Options {
        page_size_tokens: u64::MAX,
        pages: 1,
        ..Options::default()
    };
    match model("").pool(&opts) {
        Err(ModelError::Field { field, problem, .. }) => {
            assert_eq!(field, "page_size_tokens");
            assert!(
                problem.starts_with("18446744073709551615 gives an invalid pool: buffers[0]"),
                "{problem}"
            );
            assert!(problem.contains("overflow"), "{problem}");
        }
        other => panic!("want a page_size_tokens error, got {other:?}"),
    }
    // 64-token pages of 128 B a token are 8,192 B; u64::MAX of them overflow the pool.
    let opts = Options {
        page_size_tokens: 64,
        pages: u64::MAX,
        ..Options::default()
    };
    let e = model("").pool(&opts).map(|_| ()).unwrap_err();
    assert!(matches!(e, ModelError::Geometry { .. }), "{e:?}");
}

#[test]
fn mla_with_local_layers_is_refused() {
    let e = err(r#", "kv_lora_rank": 512, "qk_rope_head_dim": 64, "sliding_window": 8"#);
    assert!(
        e.contains("sliding_window: sliding attention in an MLA model"),
        "{e}"
    );
}

const MAMBA: &str = r#", "mamba_num_heads": 8, "mamba_head_dim": 4, "n_groups": 2,
    "ssm_state_size": 16, "conv_kernel": 4"#;

#[test]
fn nemotron_h_pattern() {
    let m = model(&format!(r#"{MAMBA}, "hybrid_override_pattern": "M*-EM*""#));
    assert_eq!(
        m.layer_kinds()
            .unwrap()
            .into_iter()
            .map(LayerKind::key)
            .collect::<Vec<_>>(),
        ["mamba", "full", "no_cache", "no_cache", "mamba", "full"]
    );
    // conv: (8 x 4 + 2 x 2 x 16) x 3 x 2 B = 96 x 6 = 576; temporal [8, 4, 16] f32 = 2,048.
    let t = m.totals(&Options::default()).unwrap();
    assert_eq!(t.state_bytes_per_request, 2 * (576 + 2_048));
    // Attention layers 1 and 5: 2 x 2 x 16 x 2 = 128 B/token/layer.
    assert_eq!(t.full_bytes_per_token, 2 * 128);
    assert_eq!(
        (t.layers_by_attention.mamba, t.layers_by_attention.no_cache),
        (2, 2)
    );
    let e = err(&format!(r#"{MAMBA}, "hybrid_override_pattern": "M*-EMX""#));
    assert!(
        e.contains("hybrid_override_pattern[5]: 'X' is not a layer"),
        "{e}"
    );
    let e = err(&format!(r#"{MAMBA}, "hybrid_override_pattern": "M*""#));
    assert!(
        e.contains("hybrid_override_pattern: 2 characters, but num_hidden_layers is 6"),
        "{e}"
    );
    // 2 groups do not split over 4 ranks.
    let tp4 = Options {
        tp: Some(Tp::new(4, 0).unwrap()),
        ..Options::default()
    };
    let e = model(&format!(r#"{MAMBA}, "hybrid_override_pattern": "M*-EM*""#))
        .totals(&tp4)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("n_groups: 2 heads do not split evenly over --tp 4"),
        "{e}"
    );
}

#[test]
fn kv_heads_under_other_names_are_refused() {
    // Falcon-7B: multi_query true means one KV head; reading it as MHA would be 71x too big.
    for (extra, field) in [
        (r#", "multi_query": true"#, "multi_query = true"),
        (r#", "num_kv_heads": 8"#, "num_kv_heads = 8"),
        (r#", "n_head_kv": 8"#, "n_head_kv = 8"),
        (
            r#", "attn_type_list": [0, 1, 1, 1, 1, 1]"#,
            "attn_type_list = [0,1,1,1,1,1]",
        ),
        (r#", "use_cla": true"#, "use_cla = true"),
    ] {
        let e = err(extra);
        assert!(e.contains(field), "{e}");
    }
    // false / null / 0 are the fields' "off" values and map normally.
    assert!(
        model(r#", "multi_query": false, "use_cla": null"#)
            .totals(&Options::default())
            .is_ok()
    );
}
