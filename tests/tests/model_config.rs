//! Regressions from the new-user review: configs that used to map silently to a wrong layout
//! (notes F3, F6, F14, F15).

use kvlayout_models::{IndexK, Model, PoolOptions};

fn parse(text: &str) -> Result<Model, String> {
    Model::parse("test", "test", text).map_err(|e| e.to_string())
}

fn pool_err(text: &str) -> String {
    parse(text)
        .unwrap()
        .pool(&PoolOptions::default())
        .unwrap_err()
        .to_string()
}

#[test]
fn deepseek_without_kv_lora_rank_is_refused() {
    // Before: fell back to GQA, 128 heads x (7168 / 128 = 56) dims = 28,672 B/token/layer.
    let e = pool_err(
        r#"{"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
            "num_hidden_layers": 61, "num_attention_heads": 128, "hidden_size": 7168,
            "qk_rope_head_dim": 64, "index_head_dim": 128}"#,
    );
    assert!(e.contains("kv_lora_rank: missing"), "{e}");
}

#[test]
fn kv_heads_must_divide_query_heads() {
    let llama = |kv: u64| {
        format!(
            r#"{{"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32,
                "num_key_value_heads": {kv}, "hidden_size": 4096}}"#
        )
    };
    for kv in [5, 64] {
        let e = pool_err(&llama(kv));
        assert!(
            e.contains(&format!(
                "num_key_value_heads: {kv} does not divide num_attention_heads 32"
            )),
            "{e}"
        );
    }
    // 8 of 32: Llama-3.1-8B, 2 x 8 x 128 x 2 = 4096 B/token/layer.
    let pool = parse(&llama(8))
        .unwrap()
        .pool(&PoolOptions::default())
        .unwrap();
    assert_eq!(pool.geometry.buffers[0].layout.bytes_per_token(), Ok(4096));
}

#[test]
fn non_standard_dimensions_get_their_own_format_names() {
    // index_head_dim 256: 256 e4m3 + 2 f32 = 264 B/token, not the 132-B index_k_fp8.
    let text = r#"{"model_type": "deepseek_v32", "num_hidden_layers": 61,
        "num_attention_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
        "index_head_dim": 256}"#;
    let opts = PoolOptions {
        index_k: IndexK::Fp8,
        ..PoolOptions::default()
    };
    let pool = parse(text).unwrap().pool(&opts).unwrap();
    assert_eq!(pool.formats, vec!["dsa_mla_fp8", "index_k_fp8_256"]);
    assert_eq!(
        pool.geometry.buffers[1].layout.bytes_per_token(),
        Ok(256 + 2 * 4)
    );
}

#[test]
fn config_errors_name_the_field() {
    let e = parse(r#"{"num_hidden_layers": "32", "num_attention_heads": 32}"#).unwrap_err();
    assert!(e.contains("num_hidden_layers: invalid type"), "{e}");
    let e = parse("[32, 32]").unwrap_err();
    assert!(e.contains("must be a JSON object"), "{e}");
    assert!(parse("\u{feff}{\"num_hidden_layers\": 1, \"num_attention_heads\": 1}").is_ok());
}

#[test]
fn a_model_directory_means_its_config_json() {
    let dir = std::env::temp_dir().join(format!("kvlayout-model-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.json"),
        r#"{"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128}"#,
    )
    .unwrap();
    let model = Model::load(dir.to_str().unwrap()).unwrap();
    // Qwen3-8B shape: 36 x 4096 = 147,456 B/token.
    let pool = model.pool(&PoolOptions::default()).unwrap();
    assert_eq!(pool.geometry.bytes_per_token_all_layers(), Ok(147_456));
    std::fs::remove_dir_all(&dir).unwrap();
}
