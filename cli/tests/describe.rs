//! `kvlayout describe` as a user runs it: exit codes, the `--totals` object, the messages for
//! refused configs (exit 2 naming the field), and what `--help` promises.

use std::path::PathBuf;
use std::process::Command;

fn describe(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .arg("describe")
        .args(args)
        .output()
        .expect("run kvlayout");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kvlayout-cli-describe-{tag}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn totals_is_the_design_contract() {
    let (code, out, err) = describe(&["--model", "gpt-oss-20b", "--totals"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // 12 full layers x 2 x 8 x 64 x 2 B; 12 sliding layers x 2,048 B x window 128.
    assert_eq!(v["model"], "gpt-oss-20b");
    assert_eq!(v["full_bytes_per_token"], 12 * 2 * 8 * 64 * 2);
    assert_eq!(v["window_bytes_per_request_max"], 12 * 2_048 * 128);
    assert_eq!(v["state_bytes_per_request"], 0);
    // No buffer stores a row per R > 1 tokens: 0, written as an integer.
    assert_eq!(v["compressed_bytes_per_token"], 0);
    assert_eq!(
        v["layers_by_attention"],
        serde_json::json!({"full": 12, "sliding": 12, "chunked": 0, "linear": 0, "compressed": 0, "mamba": 0, "no_cache": 0})
    );
    // DESIGN's key order.
    let at = |k: &str| out.find(&format!("\"{k}\"")).unwrap();
    assert!(at("model") < at("full_bytes_per_token"));
    assert!(at("full_bytes_per_token") < at("window_bytes_per_request_max"));
    assert!(at("window_bytes_per_request_max") < at("state_bytes_per_request"));
    assert!(at("state_bytes_per_request") < at("compressed_bytes_per_token"));
    assert!(at("compressed_bytes_per_token") < at("layers_by_attention"));
    // Llama-3.1-8B, one rank of two: 32 x 2 x 4 x 128 x 2 = 65,536.
    let (code, out, _) = describe(&[
        "--model",
        "Llama-3.1-8B",
        "--tp",
        "2",
        "--rank",
        "0",
        "--totals",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["full_bytes_per_token"], 65_536);
}

#[test]
fn table_prints_the_three_fingerprint_levels() {
    // DeepSeek-V3.2 fp8/fp8 keeps its v1 pool fingerprint; storage and per-buffer token
    // fingerprints follow (docs/DESIGN.md "Compare levels").
    let (code, out, err) = describe(&["--model", "deepseek-v3.2-exp"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("fingerprints: pool 0xeb019e4f84ee0658, storage 0x"),
        "{out}"
    );
    assert!(out.contains(" token kv=0x"), "{out}");
    assert!(out.contains(" index_k=0x"), "{out}");
    assert!(
        out.contains("total: 61 x (656 + 132) = 48,068 B/token, all layers"),
        "{out}"
    );
}

#[test]
fn json_of_a_hybrid_is_a_v2_geometry_that_check_reads() {
    let (code, out, err) = describe(&["--model", "qwen3-coder-next", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["schema"], "kvlayout.geometry/v2");
    let names: Vec<&str> = v["buffers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["conv", "temporal", "full"]);
    assert_eq!(v["buffers"][1]["attention"], "state");
    let dir = temp_dir("json");
    let path = dir.join("qwen3-coder-next.json");
    std::fs::write(&path, &out).unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .arg("check")
        .arg(&path)
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn refused_configs_exit_2_naming_the_field() {
    let dir = temp_dir("refused");
    let cases = [
        (
            r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8,
                "layer_types": ["full_attention", "cross_attention"]}"#,
            "layer_types[1]: \"cross_attention\" is not a layer type",
        ),
        // Gemma KV sharing of every layer: no layer owns the cache.
        (
            r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8,
                "num_kv_shared_layers": 2}"#,
            "num_kv_shared_layers: 2 is not below num_hidden_layers 2",
        ),
        (
            r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8,
                "hybrid_override_pattern": "MX"}"#,
            "hybrid_override_pattern[1]: 'X' is not a layer",
        ),
        // MiMo-V2's swa_* heads without the hybrid_layer_pattern that says which layers they
        // serve (the full MiMo-V2 config maps: models/tests/families_2026.rs).
        (
            r#"{"model_type": "mimo_v2_flash", "num_hidden_layers": 6, "num_attention_heads": 64,
                "num_key_value_heads": 4, "swa_num_key_value_heads": 8, "hidden_size": 4096,
                "head_dim": 192, "sliding_window": 128}"#,
            "swa_num_key_value_heads = 8",
        ),
        // Step-3.5: num_attention_groups 8 is the KV-head count (8 x 2 x 8 x 128 x 2 = 32,768
        // B/token over 8 layers); read as 64 KV heads (262,144 B/token) before.
        (
            r#"{"model_type": "step3p5", "num_hidden_layers": 8, "num_attention_heads": 64,
                "num_attention_groups": 8, "head_dim": 128, "hidden_size": 4096}"#,
            "num_attention_groups = 8",
        ),
        // A key named twice: the last value won before (1 KV head).
        (
            r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "head_dim": 8, "num_key_value_heads": 1}"#,
            "key \"num_key_value_heads\" given twice",
        ),
        // ModelOpt FP8 KV cache: read as bf16 before.
        (
            r#"{"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8,
                "quantization_config": {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}}"#,
            "quantization_config.kv_cache_quant_algo = \"FP8\"",
        ),
    ];
    for (i, (config, want)) in cases.into_iter().enumerate() {
        let path = dir.join(format!("config-{i}.json"));
        std::fs::write(&path, config).unwrap();
        let (code, _, err) = describe(&["--model", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(want), "{err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn directory_without_config_and_geometry_file_say_what_was_expected() {
    let dir = temp_dir("dir");
    let (code, _, err) = describe(&["--model", dir.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(
        err.contains(&format!("looked for {}", dir.join("config.json").display())),
        "{err}"
    );
    let geometry = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../configs/geometry/host-index-k-fp8-formula.json");
    let (code, _, err) = describe(&["--model", geometry.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("geometry file"), "{err}");
    assert!(err.contains("Hugging Face config.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_names_every_builtin_model_and_model_directories() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["describe", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for (name, _, _) in kvlayout_models::BUILTIN {
        assert!(help.contains(name), "--help lacks {name}:\n{help}");
    }
    assert!(help.contains("model directory"), "{help}");
    assert!(help.contains("case-insensitive"), "{help}");
}

#[test]
fn dtype_names_are_case_insensitive_like_model_names() {
    // bf16 KV, torch spelling in capitals: Llama-3.1-8B 32 x 4,096 = 131,072.
    let (code, out, err) = describe(&[
        "--model",
        "LLAMA-3.1-8B",
        "--kv-dtype",
        "BFloat16",
        "--totals",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["full_bytes_per_token"], 131_072);
    // fp8: 32 x 2,048 = 65,536.
    let (code, out, _) = describe(&[
        "--model",
        "llama-3.1-8b",
        "--kv-dtype",
        "float8_e4m3fn",
        "--totals",
    ]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["full_bytes_per_token"], 65_536);
}

#[test]
fn the_worked_example_in_docs_is_what_describe_prints() {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/describe-hybrid.md"),
    )
    .unwrap();
    for args in [
        &["--model", "qwen3-coder-next"][..],
        &["--model", "qwen3-coder-next", "--totals"][..],
    ] {
        let prompt = format!("$ kvlayout describe {}\n", args.join(" "));
        let start = doc
            .find(&prompt)
            .unwrap_or_else(|| panic!("docs lack {prompt}"))
            + prompt.len();
        let rest = &doc[start..];
        let end = rest.find("\n$ ").or_else(|| rest.find("\n```")).unwrap();
        let (code, out, err) = describe(args);
        assert_eq!(code, 0, "{err}");
        assert_eq!(out.trim_end(), rest[..end].trim_end(), "{prompt}");
    }
}

#[test]
fn readmes_deepseek_v4_table_and_totals_are_what_describe_prints() {
    // README "DeepSeek-V4": the buffer table and --totals of deepseek-v4-flash, with the
    // figures derived by hand beside them (models/tests/deepseek_v4.rs asserts each one).
    let doc =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../README.md"))
            .unwrap();
    for args in [
        &["--model", "deepseek-v4-flash"][..],
        &["--model", "deepseek-v4-flash", "--totals"][..],
    ] {
        let prompt = format!("$ kvlayout describe {}\n", args.join(" "));
        let start = doc
            .find(&prompt)
            .unwrap_or_else(|| panic!("README lacks {prompt}"))
            + prompt.len();
        let rest = &doc[start..];
        let end = rest.find("\n$ ").or_else(|| rest.find("\n```")).unwrap();
        let (code, out, err) = describe(args);
        assert_eq!(code, 0, "{err}");
        assert_eq!(out.trim_end(), rest[..end].trim_end(), "{prompt}");
    }
    let (_, out, _) = describe(&["--model", "deepseek-v4-flash", "--totals"]);
    assert!(
        out.contains("\"compressed_bytes_per_token\": 10570.25"),
        "{out}"
    );
}

#[test]
fn bad_tp_and_rank_exit_2() {
    let (code, _, err) = describe(&["--model", "llama-3.1-8b", "--tp", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("--tp must be at least 1, got 0"), "{err}");
    let (code, _, err) = describe(&["--model", "llama-3.1-8b", "--tp", "2", "--rank", "2"]);
    assert_eq!(code, 2);
    assert!(err.contains("--rank 2 is not below --tp 2"), "{err}");
    // 8 KV heads on 3 ranks: the engines refuse it, and so does describe.
    let (code, _, err) = describe(&["--model", "llama-3.1-8b", "--tp", "3"]);
    assert_eq!(code, 2);
    assert!(err.contains("do not split evenly over --tp 3"), "{err}");
    // --rank needs --tp (clap's usage error, exit 2).
    let (code, _, _) = describe(&["--model", "llama-3.1-8b", "--rank", "1"]);
    assert_eq!(code, 2);
}

/// Regression: Qwen3-8B's config plus `"sliding_window": 4096` and no `use_sliding_window`
/// read as 36 windowed layers; transformers Qwen3Config defaults use_sliding_window to False,
/// so every layer is full.
#[test]
fn a_qwen_window_without_use_sliding_window_is_not_used() {
    let dir = temp_dir("qwen-window");
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/qwen3-8b.json"
    ))
    .unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    config["sliding_window"] = serde_json::json!(4096);
    let path = dir.join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let (code, out, err) = describe(&["--model", path.to_str().unwrap(), "--totals"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // 36 layers x 2 (K, V) x 8 KV heads x 128 x 2 B (bf16).
    assert_eq!(v["full_bytes_per_token"], 36 * 2 * 8 * 128 * 2);
    assert_eq!(v["window_bytes_per_request_max"], 0);
    assert_eq!(v["layers_by_attention"]["sliding"], 0);
    assert_eq!(v["layers_by_attention"]["full"], 36);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Regression: `--pages 0` printed the table on stdout with the error inside the `pool:` line
/// and nothing on stderr; the error goes to stderr alone.
#[test]
fn a_bad_pool_prints_no_table() {
    let (code, out, err) = describe(&["--model", "gpt-oss-20b", "--pages", "0"]);
    assert_eq!(code, 2, "{out}{err}");
    assert_eq!(out, "", "stdout must stay empty");
    assert!(err.contains("pages: must be at least 1, got 0"), "{err}");
}

/// Hostile review: `describe` without `--tp` writes no shard, so it is not the TP-1 side of a
/// token-level check against a TP-2 rank; README and --help say `--tp 1` gives it. Llama-3.1-8B
/// has 8 KV heads: rank 0 of 2 holds heads 0-3 of the 8 that --tp 1 holds.
#[test]
fn tp_1_is_the_token_level_peer_of_a_tp_2_rank() {
    let dir = temp_dir("tp1");
    let write = |name: &str, extra: &[&str]| {
        let mut args = vec!["--model", "llama-3.1-8b", "--json"];
        args.extend_from_slice(extra);
        let (code, out, err) = describe(&args);
        assert_eq!(code, 0, "{err}");
        let path = dir.join(name);
        std::fs::write(&path, out).unwrap();
        path
    };
    let whole = write("whole.json", &[]);
    let tp1 = write("tp1.json", &["--tp", "1"]);
    let rank0 = write("tp2-rank0.json", &["--tp", "2", "--rank", "0"]);
    let check = |a: &PathBuf| {
        let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
            .args(["check", "--level", "token"])
            .arg(a)
            .arg(&rank0)
            .output()
            .expect("run kvlayout");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code().expect("exit code"), text)
    };
    let (code, text) = check(&whole);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("kv.shard.split: whole, heads of 8"), "{text}");
    let (code, text) = check(&tp1);
    assert_eq!(code, 0, "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["describe", "--help"])
        .output()
        .expect("run kvlayout");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("pass --tp 1"), "{help}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Regression: `--state-dtype` on a model without recurrent state was ignored silently; it is
/// an error naming the flag and the model. On a model with linear-attention (Gated DeltaNet)
/// or Mamba layers it applies.
#[test]
fn state_dtype_applies_to_models_with_recurrent_state_only() {
    let (code, out, err) = describe(&["--model", "llama-3.1-8b", "--state-dtype", "bf16"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains(
            "error: --state-dtype does not apply: llama-3.1-8b has no linear-attention or Mamba layers"
        ),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
    for model in ["qwen3-coder-next", "nemotron-nano-9b-v2"] {
        let (code, out, err) = describe(&["--model", model, "--state-dtype", "bf16"]);
        assert_eq!(code, 0, "{model}: {err}");
        assert!(out.contains("state: "), "{model}: {out}");
    }
}

/// Regression: Kimi-Linear's KDA layers and RecurrentGemma's RG-LRU layers hold recurrent
/// state, but `--state-dtype` was refused on both as "no recurrent state" (only linear-attention
/// and Mamba layers were looked for), so the KDA state could not be sized in bf16 and
/// RecurrentGemma's own refusal of a non-f32 RG-LRU state never ran.
#[test]
fn state_dtype_applies_to_kda_and_rg_lru_layers() {
    // Kimi-Linear: 20 KDA layers, conv 73,728 B (bf16, unchanged) + temporal 32 x 128 x 128
    // in bf16 = 32,768 x 2 = 1,048,576 B (f32: 2,097,152): 20 x 1,122,304 = 22,446,080 B.
    let (code, out, err) = describe(&["--model", "kimi-linear-48b-a3b", "--state-dtype", "bf16"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("state: 20 x (73728 + 1048576) = 22,446,080 B/request"),
        "{out}"
    );
    // RecurrentGemma: f32 is what its RG-LRU keeps (accepted); bf16 is refused by name.
    let (code, _, err) = describe(&["--model", "recurrentgemma-2b", "--state-dtype", "f32"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = describe(&["--model", "recurrentgemma-2b", "--state-dtype", "bf16"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("--state-dtype: bf16: RecurrentGemma's RG-LRU state is always f32"),
        "{err}"
    );
}

/// Regression: `--index-k` on a model without the DeepSeek indexer was a note ("ignored");
/// it is an error naming the flag and the model.
#[test]
fn index_k_applies_to_dsa_models_only() {
    let (code, out, err) = describe(&["--model", "llama-3.1-8b", "--index-k", "bf16"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains(
            "error: --index-k does not apply: llama-3.1-8b has no DeepSeek sparse-attention indexer (no index_head_dim)"
        ),
        "{err}"
    );
    let (code, out, err) = describe(&["--model", "deepseek-v3.2-exp", "--index-k", "bf16"]);
    assert_eq!(code, 0, "{err}");
    // DeepSeek-V3.2 with bf16 index-K: 61 x (656 + 128 x 2) = 55,632 B/token.
    assert!(
        out.contains("total: 61 x (656 + 256) = 55,632 B/token"),
        "{out}"
    );
}

/// `--totals` has no pool pages: `--pages` next to it is refused by name.
#[test]
fn pages_with_totals_is_refused() {
    let (code, out, err) = describe(&["--model", "gpt-oss-20b", "--totals", "--pages", "3"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("--totals") && err.contains("--pages"), "{err}");
    assert!(out.is_empty(), "{out}");
}

/// The dtype flags take every spelling the models crate reads (its `from_name`), ignoring
/// case: `fp8_e4m3` was taken in a config but refused on the command line.
#[test]
fn dtype_flags_take_the_model_crate_spellings() {
    let totals = |kv: &str| {
        let (code, out, err) = describe(&["--model", "llama-3.1-8b", "--kv-dtype", kv, "--totals"]);
        assert_eq!(code, 0, "--kv-dtype {kv}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["full_bytes_per_token"].as_u64().unwrap()
    };
    // Llama-3.1-8B: 32 layers x (K + V) x 8 heads x 128 dims x 1 B (fp8).
    for kv in ["fp8", "FP8_E4M3", "f8e4m3", "float8_e4m3fn"] {
        assert_eq!(totals(kv), 32 * 2 * 8 * 128, "--kv-dtype {kv}");
    }
    // ... and x 2 B in bf16.
    for kv in ["bf16", "BFloat16"] {
        assert_eq!(totals(kv), 32 * 2 * 8 * 128 * 2, "--kv-dtype {kv}");
    }
}

#[test]
fn check_refuses_the_seeds_host_on_v4_geometry() {
    // The device: describe --index-k bf16 (C4 index-K 128 x 2 = 256 B a row, 64 rows = 16,384 B
    // a page); the host: configs/geometry/host-v4-c4-index-k-fp8-formula.json (the fp8 formula,
    // 128 + 128 // 128 x 4 = 132 B a row, 8,448 B a page).
    let dir = temp_dir("v4-seed");
    let (code, out, err) = describe(&[
        "--model",
        "deepseek-v4-flash",
        "--index-k",
        "bf16",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let device = dir.join("device.json");
    std::fs::write(&device, out).unwrap();
    let host = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../configs/geometry/host-v4-c4-index-k-fp8-formula.json");
    let check = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["check", device.to_str().unwrap(), host.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout);
    assert_eq!(check.status.code(), Some(1), "{text}");
    assert!(
        text.contains("c4_index_k.bytes_per_token: 256 B per 4 tokens, 132 B per 4 tokens"),
        "{text}"
    );
    assert!(
        text.contains("c4_index_k.page_stride_bytes: 16384, 8448"),
        "{text}"
    );
    // Only the C4 index-K differs: the other six buffers are the device's.
    assert!(
        text.lines().skip(1).all(|l| l.starts_with("c4_index_k.")),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A page size the model refuses names `--page-size` and the value, exit 2, on stderr alone,
/// in the table, `--json` and `--totals` paths (trial finding: `--page-size
/// 18446744073709551615` said only "buffer kv: overflow in layout arithmetic"). DeepSeek-V3.2's
/// kv page holds 656 B a token (MLA fp8), so 2^64 - 1 tokens overflow a page's bytes; 0 is
/// refused for any model.
#[test]
fn a_page_size_the_model_refuses_names_the_flag_and_value() {
    for extra in [&[][..], &["--json"][..], &["--totals"][..]] {
        let mut args = vec![
            "--model",
            "deepseek-v3.2-exp",
            "--page-size",
            "18446744073709551615",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = describe(&args);
        assert_eq!(code, 2, "{extra:?}: {out}{err}");
        assert_eq!(out, "", "{extra:?}: stdout must stay empty");
        assert!(
            err.contains(
                "--page-size: 18446744073709551615 gives an invalid pool: buffers[0] (kv)"
            ),
            "{extra:?}: {err}"
        );
        assert!(err.contains("overflow"), "{extra:?}: {err}");
        assert!(
            err.contains("(model \"deepseek-v3.2-exp\")"),
            "{extra:?}: {err}"
        );
    }
    let (code, _, err) = describe(&["--model", "llama-3.1-8b", "--page-size", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--page-size: must be at least 1, got 0 (model \"llama-3.1-8b\")"),
        "{err}"
    );
}
