//! `kvlayout describe`'s numbers: each built-in model config mapped to its pool geometry, bytes
//! per token per layer per buffer and the all-layer total, against totals worked by hand from
//! DESIGN-facts.md ("Model configs" and "Token layouts").

use kvlayout_core::{MemoryLayout, file};
use kvlayout_models::{
    Attention, BUILTIN, IndexK, KvDtype, Model, ModelError, ModelPool, PoolOptions,
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
    let expected = [
        ("deepseek-v3.2-exp", Attention::MlaDsa, 61),
        ("deepseek-v3", Attention::Mla, 61),
        ("kimi-k2", Attention::Mla, 61),
        ("glm-4.5", Attention::Gqa, 92),
        ("llama-3.1-8b", Attention::Gqa, 32),
        ("llama-3.1-70b", Attention::Gqa, 80),
        ("qwen3-8b", Attention::Gqa, 36),
        ("qwen3-235b-a22b", Attention::Gqa, 94),
    ];
    assert_eq!(BUILTIN.len(), expected.len());
    for (name, attention, layers) in expected {
        let m = Model::builtin(name).unwrap().unwrap();
        assert_eq!(m.attention(), attention, "{name}");
        assert_eq!(m.config.num_hidden_layers, layers, "{name}");
    }
    // Names are case-insensitive.
    assert!(Model::builtin("DeepSeek-V3.2-Exp").is_some());
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
