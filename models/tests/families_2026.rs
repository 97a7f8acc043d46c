//! The model families of issue 21 that need no geometry v3 field, each worked by hand from its
//! config (configs/, sources in configs/README.md) and the engine source the reader follows.

use kvlayout_models::{BufferAttention, LayerKind, Model, ModelError, Options, StateDtype, Tp};

fn config(file: &str) -> String {
    std::fs::read_to_string(format!("{}/../configs/{file}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn model(file: &str) -> Model {
    Model::parse(file, file, &config(file)).unwrap()
}

/// (name, attention, layer ids, bytes per token (state: per slot) per layer) of every buffer.
fn buffers(m: &Model, opts: &Options) -> Vec<(String, BufferAttention, Vec<u64>, u64)> {
    m.plan(opts)
        .unwrap()
        .into_iter()
        .map(|b| {
            let per = b.layout.bytes_per_token().unwrap();
            (b.name, b.attention, b.layer_ids, per)
        })
        .collect()
}

fn every(start: u64, step: u64, end: u64) -> Vec<u64> {
    (start..end).step_by(step as usize).collect()
}

#[test]
fn recurrent_gemma_attends_in_one_layer_of_three_over_a_window() {
    // configs/recurrentgemma-2b.json (google/recurrentgemma-2b): 26 layers, `_block_types`
    // (recurrent, recurrent, attention) repeated (transformers RecurrentGemmaConfig.block_types:
    // `(_block_types * 100)[:num_hidden_layers]`): attention at 2, 5, ..., 23 = 8 layers,
    // 18 recurrent.
    let m = model("recurrentgemma-2b.json");
    let kinds = m.layer_kinds().unwrap();
    let attention: Vec<u64> = (0..26).filter(|i| i % 3 == 2).collect();
    assert_eq!(attention, every(2, 3, 26));
    for (i, k) in kinds.iter().enumerate() {
        let want = if i % 3 == 2 {
            LayerKind::Sliding {
                window_tokens: 2_048,
            }
        } else {
            LayerKind::RgLru
        };
        assert_eq!(*k, want, "layer {i}");
    }
    let b = buffers(&m, &Options::default());
    // Attention (transformers RecurrentGemmaSdpaAttention._setup_cache: K and V of
    // `[batch, num_key_value_heads 1, attention_window_size 2048, head_dim 256]`, model dtype):
    // 2 x 1 x 256 x 2 B = 1,024 B per token per layer, at most 2,048 tokens.
    assert_eq!(b[0].0, "conv");
    let swa = b.iter().find(|x| x.0 == "swa").unwrap();
    assert_eq!(
        swa.1,
        BufferAttention::SlidingWindow {
            window_tokens: 2_048
        }
    );
    assert_eq!(swa.2, attention);
    assert_eq!(swa.3, 2 * 256 * 2);
    // Recurrent block (RecurrentGemmaRecurrentBlock._setup_cache): conv `[lru_width 2560,
    // conv1d_width 4 - 1]` bf16 = 15,360 B; RG-LRU `[2560]` f32 = 10,240 B.
    let conv = b.iter().find(|x| x.0 == "conv").unwrap();
    let lru = b.iter().find(|x| x.0 == "temporal").unwrap();
    assert_eq!((conv.3, lru.3), (2_560 * 3 * 2, 2_560 * 4));
    assert_eq!(conv.2.len(), 18);
    let t = m.totals(&Options::default()).unwrap();
    // Regression: every layer was read as full attention, 26 x 1,024 = 26,624 B/token.
    assert_ne!(t.full_bytes_per_token, 26 * 1_024);
    assert_eq!(t.full_bytes_per_token, 0);
    assert_eq!(t.window_bytes_per_request_max, 8 * 1_024 * 2_048);
    assert_eq!(t.window_bytes_per_request_max, 16_777_216);
    assert_eq!(t.state_bytes_per_request, 18 * (15_360 + 10_240));
    assert_eq!(t.state_bytes_per_request, 460_800);
    assert_eq!(
        (t.layers_by_attention.sliding, t.layers_by_attention.linear),
        (8, 18)
    );
    // No engine shards the recurrent block: --tp is refused naming the field.
    let e = m
        .totals(&Options {
            tp: Some(Tp::new(2, 0).unwrap()),
            ..Options::default()
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("block_types") && e.contains("--tp 2"), "{e}");
    // An unknown block type is named.
    let bad = config("recurrentgemma-2b.json").replace("\"attention\"]", "\"mlp\"]");
    let e = Model::parse("rg", "rg", &bad)
        .unwrap()
        .layer_kinds()
        .unwrap_err()
        .to_string();
    assert!(e.contains("block_types[2]") && e.contains("mlp"), "{e}");
}

/// A DeciLM config of 6 layers: `heads` per layer (`None`: a `no_op` layer), 32 query heads of
/// 128 (hidden 4096).
fn decilm(heads: &[Option<u64>], extra_attention: &str) -> String {
    let blocks: Vec<String> = heads
        .iter()
        .map(|h| match h {
            Some(g) => format!(
                r#"{{"attention": {{"n_heads_in_group": {g}, "no_op": false, "replace_with_linear": false, "num_sink_tokens": null, "window_length": null{extra_attention}}}, "ffn": {{"ffn_mult": 2.625, "no_op": false}}}}"#
            ),
            None => r#"{"attention": {"n_heads_in_group": null, "no_op": true, "replace_with_linear": false}, "ffn": {"ffn_mult": 2.625, "no_op": false}}"#.to_string(),
        })
        .collect();
    format!(
        r#"{{"architectures": ["DeciLMForCausalLM"], "model_type": "nemotron-nas", "num_hidden_layers": {}, "num_attention_heads": 32, "num_key_value_heads": null, "hidden_size": 4096, "torch_dtype": "bfloat16", "block_configs": [{}]}}"#,
        heads.len(),
        blocks.join(", ")
    )
}

#[test]
fn decilm_block_configs_give_per_layer_kv_heads_and_no_op_layers() {
    // vLLM nemotron_nas.py DeciLMDecoderLayer: `no_op` attention has no cache; otherwise
    // num_kv_heads = num_attention_heads // n_heads_in_group. Layers: group 8 -> 32/8 = 4 KV
    // heads; group 4 -> 8 heads; no_op; group 8; no_op; group 32 -> 1 head.
    let text = decilm(&[Some(8), Some(4), None, Some(8), None, Some(32)], "");
    let m = Model::parse("decilm", "t", &text).unwrap();
    let b = buffers(&m, &Options::default());
    // K and V of h heads x 128 bf16: 2 x h x 128 x 2 = 512 h B per token per layer.
    let sizes: Vec<(Vec<u64>, u64)> = b.iter().map(|x| (x.2.clone(), x.3)).collect();
    assert_eq!(
        sizes,
        [
            (vec![0, 3], 2 * 4 * 128 * 2),
            (vec![1], 2 * 8 * 128 * 2),
            (vec![5], 2 * 128 * 2)
        ]
    );
    let t = m.totals(&Options::default()).unwrap();
    // 2 x 2,048 + 4,096 + 512 = 8,704 B/token. Regression: block_configs was ignored and the
    // config read as 6 layers of 32 heads (no num_key_value_heads: MHA): 6 x 2 x 32 x 128 x 2
    // = 98,304 B/token.
    assert_eq!(t.full_bytes_per_token, 2 * 2_048 + 4_096 + 512);
    assert_eq!(t.full_bytes_per_token, 8_704);
    assert_ne!(t.full_bytes_per_token, 98_304);
    assert_eq!(
        (t.layers_by_attention.full, t.layers_by_attention.no_cache),
        (4, 2)
    );
    // The buffers name their layers (they do not serve every layer).
    let g = m.pool(&Options::default()).unwrap().geometry;
    assert_eq!(g.buffers[0].layer_ids.as_deref(), Some(&[0u32, 3][..]));
    // --tp 4: 4 heads -> 1 per rank, 8 -> 2, 1 -> replicated.
    let t4 = m
        .totals(&Options {
            tp: Some(Tp::new(4, 3).unwrap()),
            ..Options::default()
        })
        .unwrap();
    assert_eq!(t4.full_bytes_per_token, 2 * 512 + 1_024 + 512);
    // A windowed layer is refused naming the field: it would change the cache.
    let e = Model::parse(
        "d",
        "t",
        &decilm(&[Some(8), Some(8)], "").replace(
            r#""window_length": null}, "ffn": {"ffn_mult": 2.625, "no_op": false}}]"#,
            r#""window_length": 4096}, "ffn": {"ffn_mult": 2.625, "no_op": false}}]"#,
        ),
    )
    .unwrap()
    .totals(&Options::default())
    .unwrap_err();
    assert!(
        matches!(&e, ModelError::Unmodelled { field, .. } if field == "block_configs[1].attention.window_length"),
        "{e}"
    );
    // A group that does not divide the query heads is named.
    let e = Model::parse("d", "t", &decilm(&[Some(5)], ""))
        .unwrap()
        .totals(&Options::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("block_configs[0].attention.n_heads_in_group"),
        "{e}"
    );
    // One entry per layer.
    let short = decilm(&[Some(8), Some(8)], "")
        .replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 3"#);
    let e = Model::parse("d", "t", &short)
        .unwrap()
        .layer_kinds()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("block_configs") && e.contains("2 entries"),
        "{e}"
    );
}

#[test]
fn mamba_ssm_cache_dtype_sizes_the_recurrent_state() {
    // configs/nemotron-nano-9b-v2.json + vLLM's `mamba_ssm_cache_dtype` "bfloat16": the Mamba2
    // temporal state [128 heads, 80, 128] in bf16 = 2,621,440 B (f32: 5,242,880); conv
    // 12,288 x 3 x 2 = 73,728 B; 27 Mamba layers.
    let with = |extra: &str| {
        let text = config("nemotron-nano-9b-v2.json").replacen('{', &format!("{{{extra}"), 1);
        Model::parse("nemotron", "t", &text).unwrap()
    };
    let t = with(r#""mamba_ssm_cache_dtype": "bfloat16", "#)
        .totals(&Options::default())
        .unwrap();
    // Regression: the field was ignored and the state reported at f32, 143,548,416 B.
    assert_eq!(
        t.state_bytes_per_request,
        27 * (73_728 + 128 * 80 * 128 * 2)
    );
    assert_eq!(t.state_bytes_per_request, 72_769_536);
    // "auto" (vLLM's default) leaves SGLang's f32.
    let t = with(r#""mamba_ssm_cache_dtype": "auto", "#)
        .totals(&Options::default())
        .unwrap();
    assert_eq!(t.state_bytes_per_request, 143_548_416);
    // --state-dtype wins over the config.
    let t = with(r#""mamba_ssm_cache_dtype": "bfloat16", "#)
        .totals(&Options {
            state_dtype: Some(StateDtype::F32),
            ..Options::default()
        })
        .unwrap();
    assert_eq!(t.state_bytes_per_request, 143_548_416);
    // Both fields, disagreeing: refused naming both.
    let e = with(r#""mamba_ssm_cache_dtype": "bfloat16", "mamba_ssm_dtype": "float32", "#)
        .totals(&Options::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mamba_ssm_cache_dtype") && e.contains("mamba_ssm_dtype f32"),
        "{e}"
    );
}

#[test]
fn gemma4_shared_kv_layers_own_no_buffer() {
    // configs/gemma-4-e2b-it.json: 35 layers (sliding x4, full) x7, num_kv_shared_layers 20
    // (vLLM gemma4.py: first_kv_shared_layer_idx = 35 - 20 = 15; a later layer reads the cache
    // of the last layer of its kind before 15). Layers 0..15 own the cache: sliding 0-3, 5-8,
    // 10-13 (12), full 4, 9, 14 (3).
    let m = model("gemma-4-e2b-it.json");
    let b = buffers(&m, &Options::default());
    let swa = b.iter().find(|x| x.0 == "swa").unwrap();
    let full = b.iter().find(|x| x.0 == "full").unwrap();
    assert_eq!(swa.2, [0, 1, 2, 3, 5, 6, 7, 8, 10, 11, 12, 13]);
    assert_eq!(full.2, [4, 9, 14]);
    assert_eq!(b.len(), 2);
    // Sliding: K and V of 1 KV head x head_dim 256, bf16 = 1,024 B; full: 1 head x
    // global_head_dim 512 (no attention_k_eq_v: num_key_value_heads) = 2,048 B.
    assert_eq!((swa.3, full.3), (2 * 256 * 2, 2 * 512 * 2));
    let t = m.totals(&Options::default()).unwrap();
    assert_eq!(t.full_bytes_per_token, 3 * 2_048);
    assert_eq!(t.window_bytes_per_request_max, 12 * 1_024 * 512);
    assert_eq!(t.window_bytes_per_request_max, 6_291_456);
    // layers_by_attention counts model layers (shared ones attend too): 28 sliding, 7 full.
    assert_eq!(
        (t.layers_by_attention.sliding, t.layers_by_attention.full),
        (28, 7)
    );
    // Sharing every layer leaves no owner: refused naming the field.
    let bad = config("gemma-4-e2b-it.json").replace(
        r#""num_kv_shared_layers": 20"#,
        r#""num_kv_shared_layers": 35"#,
    );
    let e = Model::parse("g", "t", &bad)
        .unwrap()
        .totals(&Options::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("num_kv_shared_layers") && e.contains("35"),
        "{e}"
    );
}

#[test]
fn mimo_v2_sliding_layers_have_their_own_heads_and_v_narrower_than_k() {
    // configs/mimo-v2-flash.json: 48 layers, hybrid_layer_pattern 0 (full) at 0, 5, 11, 17,
    // ..., 47 (9 layers), 1 (sliding, window 128) elsewhere (39). SGLang SWAKVPool (head_num,
    // head_dim, v_head_dim; swa_head_num, swa_head_dim, swa_v_head_dim):
    // full: K 4 heads x 192 + V 4 x 128, bf16 = 1,536 + 1,024 = 2,560 B;
    // sliding: K 8 x 192 + V 8 x 128 = 3,072 + 2,048 = 5,120 B.
    let m = model("mimo-v2-flash.json");
    let b = buffers(&m, &Options::default());
    let full = b.iter().find(|x| x.0 == "full").unwrap();
    let swa = b.iter().find(|x| x.0 == "swa").unwrap();
    let mut full_ids = vec![0];
    full_ids.extend(every(5, 6, 48));
    assert_eq!(full.2, full_ids);
    assert_eq!(full.2.len(), 9);
    assert_eq!(swa.2.len(), 39);
    assert_eq!(
        (full.3, swa.3),
        (4 * 192 * 2 + 4 * 128 * 2, 8 * 192 * 2 + 8 * 128 * 2)
    );
    let t = m.totals(&Options::default()).unwrap();
    assert_eq!(t.full_bytes_per_token, 9 * 2_560);
    assert_eq!(t.window_bytes_per_request_max, 39 * 5_120 * 128);
    assert_eq!(t.window_bytes_per_request_max, 25_559_040);
    // --tp 8: full 4 KV heads replicated (1 per rank, each on 2 ranks), sliding 8 -> 1:
    // full 192 x 2 + 128 x 2 = 640 B, sliding the same.
    let t8 = m
        .totals(&Options {
            tp: Some(Tp::new(8, 5).unwrap()),
            ..Options::default()
        })
        .unwrap();
    assert_eq!(t8.full_bytes_per_token, 9 * 640);
    assert_eq!(t8.window_bytes_per_request_max, 39 * 640 * 128);
    // Outside MiMo a v_head_dim other than the head dim stays refused (no engine rule read).
    let e = Model::parse(
        "t",
        "t",
        r#"{"num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64, "v_head_dim": 48}"#,
    )
    .err()
    .map(|e| e.to_string())
    .unwrap();
    assert!(e.contains("v_head_dim = 48"), "{e}");
}

#[test]
fn kimi_linear_kda_state_and_mla_layers() {
    // configs/kimi-linear-48b-a3b.json: 27 layers; linear_attn_config.full_attn_layers
    // (1-based) 4, 8, ..., 24, 27 -> MLA at 0-based 3, 7, 11, 15, 19, 23, 26; the other 20
    // are KDA.
    let m = model("kimi-linear-48b-a3b.json");
    let b = buffers(&m, &Options::default());
    let full = b.iter().find(|x| x.0 == "full").unwrap();
    assert_eq!(full.2, [3, 7, 11, 15, 19, 23, 26]);
    // MLA latent kv_lora_rank 512 + qk_rope_head_dim 64, bf16: 1,152 B.
    assert_eq!(full.3, (512 + 64) * 2);
    // KDA (vLLM mamba_utils.py kda_state_shape, num_heads 32, head_dim 128, kernel 4):
    // conv q, k, v of 32 x 128 channels x 3 positions bf16 = 3 x 4,096 x 3 x 2 = 73,728 B;
    // recurrent [32, 128, 128] f32 = 2,097,152 B.
    let conv = b.iter().find(|x| x.0 == "conv").unwrap();
    let rec = b.iter().find(|x| x.0 == "temporal").unwrap();
    assert_eq!(conv.2.len(), 20);
    assert_eq!((conv.3, rec.3), (73_728, 2_097_152));
    let t = m.totals(&Options::default()).unwrap();
    assert_eq!(t.full_bytes_per_token, 7 * 1_152);
    assert_eq!(t.state_bytes_per_request, 20 * (73_728 + 2_097_152));
    assert_eq!(t.state_bytes_per_request, 43_417_600);
    assert_eq!(
        (t.layers_by_attention.full, t.layers_by_attention.linear),
        (7, 20)
    );
    // --tp 4: the KDA heads split (32 / 4), the MLA latent is replicated.
    let t4 = m
        .totals(&Options {
            tp: Some(Tp::new(4, 1).unwrap()),
            ..Options::default()
        })
        .unwrap();
    assert_eq!(t4.state_bytes_per_request, 43_417_600 / 4);
    assert_eq!(t4.full_bytes_per_token, 7 * 1_152);
    // A layer in both lists, or in neither, is named.
    let twice = config("kimi-linear-48b-a3b.json").replacen(
        "\"kda_layers\": [\n      1,",
        "\"kda_layers\": [\n      4,",
        1,
    );
    let e = Model::parse("k", "t", &twice)
        .unwrap()
        .layer_kinds()
        .unwrap_err()
        .to_string();
    assert!(e.contains("listed twice"), "{e}");
    // A per-layer indexer list (Kimi-K3-style `indexer_types`) would decide which MLA layers
    // keep indexer keys: not modelled, refused by name rather than given every layer or none.
    let k3 = config("kimi-linear-48b-a3b.json").replacen(
        "\"use_cache\"",
        "\"indexer_types\": [\"full\", \"none\"], \"use_cache\"",
        1,
    );
    let e = Model::parse("k", "t", &k3).unwrap_err().to_string();
    assert!(
        e.contains("indexer_types") && e.contains("not modelled"),
        "{e}"
    );
}

#[test]
fn tp_conv_states_are_split_group_by_group() {
    use kvlayout_core::{Level, compare_at};
    // Qwen3-Coder-Next GDN conv (SGLang configs/mamba_utils.py: conv_dim = 2 x 16 x 128 +
    // 32 x 128 = 8,192 channels of q | k | v): under --tp the v3 spelling, one section of
    // [8,192 / N, 3] whose groups q 2,048, k 2,048, v 4,096 split on their own (SGLang #30997).
    let m = Model::builtin("qwen3-coder-next").unwrap().unwrap();
    let conv_of = |size: u64, rank: u64| {
        let g = m
            .pool(&Options {
                tp: Some(Tp::new(size, rank).unwrap()),
                ..Options::default()
            })
            .unwrap()
            .geometry;
        let mut g = g.clone();
        g.buffers.retain(|b| b.name() == "conv");
        g
    };
    let (tp2, tp4) = (conv_of(2, 0), conv_of(4, 0));
    let s = &tp2.buffers[0].layout.sections()[0];
    assert_eq!(s.shape(), [8_192 / 2, 3]);
    assert_eq!(s.split_groups(), Some(&[2_048u64, 2_048, 4_096][..]));
    assert_eq!(tp2.buffers[0].shard.unwrap().heads_total(), Some(8_192));
    // 4,096 x 3 x 2 B = 24,576 B a slot per layer at TP 2; 12,288 at TP 4.
    assert_eq!(tp2.buffers[0].layout.bytes_per_token().unwrap(), 24_576);
    assert_eq!(tp4.buffers[0].layout.bytes_per_token().unwrap(), 12_288);
    // Shared case 30: a TP 2 rank and a TP 4 rank exchange slots at token level.
    assert!(compare_at(&tp2, &tp4, Level::Token).is_ok());
    // Nemotron-Nano-9B-v2 Mamba2 at --tp 8: x 128 x 80 = 10,240, B and C 8 x 128 = 1,024 each;
    // a rank holds 12,288 / 8 = 1,536 channels.
    let n = Model::builtin("nemotron-nano-9b-v2").unwrap().unwrap();
    let g = n
        .pool(&Options {
            tp: Some(Tp::new(8, 7).unwrap()),
            ..Options::default()
        })
        .unwrap()
        .geometry;
    let conv = g.buffers.iter().find(|b| b.name() == "conv").unwrap();
    let s = &conv.layout.sections()[0];
    assert_eq!(s.shape(), [1_536, 3]);
    assert_eq!(s.split_groups(), Some(&[10_240u64, 1_024, 1_024][..]));
    // Kimi-Linear KDA at --tp 4: q, k, v of 32 x 128 = 4,096 channels each, 3,072 a rank.
    let k = model("kimi-linear-48b-a3b.json");
    let g = k
        .pool(&Options {
            tp: Some(Tp::new(4, 2).unwrap()),
            ..Options::default()
        })
        .unwrap()
        .geometry;
    let conv = g.buffers.iter().find(|b| b.name() == "conv").unwrap();
    assert_eq!(conv.layout.sections()[0].shape(), [3_072, 3]);
    assert_eq!(
        conv.layout.sections()[0].split_groups(),
        Some(&[4_096u64, 4_096, 4_096][..])
    );
}
