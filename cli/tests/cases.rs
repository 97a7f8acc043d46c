//! `kvlayout check` on every public bug case in cli/tests/shared-cases (vendored from the
//! project's shared case set) and the repo's own cases in cli/tests/cases: the exit code and
//! the strings `expect.json` names must appear in the combined output, case-insensitively;
//! `expect.json` may add `args` (e.g. `["--level", "token"]`, passed after the two files) and
//! `max_lines` (the combined output has at most that many lines).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Runs `kvlayout check A B ARGS...`, feeding `stdin` when given; exit code and combined output.
fn check_with(a: &Path, b: &Path, args: &[&str], stdin: Option<&[u8]>) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .arg("check")
        .arg(a)
        .arg(b)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kvlayout");
    let mut input = child.stdin.take().expect("stdin");
    if let Some(bytes) = stdin {
        // kvlayout may exit before reading (a refused argument): a closed pipe is not an error.
        if let Err(e) = input.write_all(bytes) {
            assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "write stdin: {e}");
        }
    }
    drop(input);
    let out = child.wait_with_output().expect("kvlayout output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("exit code"), text)
}

fn check(a: &Path, b: &Path) -> (i32, String) {
    check_with(a, b, &[], None)
}

fn run_case(dir: &Path) {
    let expect: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expect.json")).unwrap()).unwrap();
    let args: Vec<&str> = expect
        .get("args")
        .map(|a| {
            a.as_array()
                .expect("args is an array")
                .iter()
                .map(|x| x.as_str().expect("args are strings"))
                .collect()
        })
        .unwrap_or_default();
    let (code, text) = check_with(&dir.join("a.json"), &dir.join("b.json"), &args, None);
    let want = expect["exit"].as_i64().unwrap() as i32;
    assert_eq!(code, want, "{}: exit code\n{text}", dir.display());
    for m in expect["mentions"].as_array().unwrap() {
        let m = m.as_str().unwrap();
        assert!(
            text.to_lowercase().contains(&m.to_lowercase()),
            "{}: output lacks {m:?}\n{text}",
            dir.display()
        );
    }
    if let Some(max) = expect.get("max_lines") {
        let max = max.as_u64().expect("max_lines is a count") as usize;
        let lines = text.lines().count();
        assert!(
            lines <= max,
            "{}: {lines} lines, at most {max} expected\n{text}",
            dir.display()
        );
    }
}

fn case_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expect.json").exists())
        .collect();
    dirs.sort();
    dirs
}

/// The public bug cases (each a public bug report turned into a geometry pair), vendored so a
/// fresh clone tests them.
fn shared_cases() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shared-cases")
}

macro_rules! shared_case {
    ($($test:ident => $dir:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            run_case(&shared_cases().join($dir));
        }
    )*};
}

shared_case! {
    case_00_dsa_index_k_bf16_vs_fp8_host => "00-dsa-index-k-bf16-vs-fp8-host",
    case_01_mla_656_vs_576 => "01-mla-656-vs-576",
    case_02_host_missing_index_k => "02-host-missing-index-k",
    case_03_mxfp8_scales_not_mirrored => "03-mxfp8-scales-not-mirrored",
    case_04_pd_bf16_prefill_fp8_decode => "04-pd-bf16-prefill-fp8-decode",
    case_05_block_size_128_vs_64 => "05-block-size-128-vs-64",
    case_06_bf16_bits_read_as_f16 => "06-bf16-bits-read-as-f16",
    case_07_kv_first_vs_token_rows => "07-kv-first-vs-token-rows",
    case_08_compatible_layer_first_vs_page_first => "08-compatible-layer-first-vs-page-first",
    case_09_compatible_section_names_differ => "09-compatible-section-names-differ",
    case_10_invalid_unknown_dtype => "10-invalid-unknown-dtype",
    case_11_invalid_block_does_not_divide => "11-invalid-block-does-not-divide",
    case_12_invalid_zero_page => "12-invalid-zero-page",
    case_13_offload_nhd_vs_hnd => "13-offload-nhd-vs-hnd",
    case_14_namespace_label_only_same_geometry => "14-namespace-label-only-same-geometry",
    case_15_gpt_oss_sliding_group_missing => "15-gpt-oss-sliding-group-missing",
    case_16_gemma4_per_layer_head_dims => "16-gemma4-per-layer-head-dims",
    case_17_packed_kv_per_head_vs_planes => "17-packed-kv-per-head-vs-planes",
    case_18_nvfp4_mla_record_432_vs_368 => "18-nvfp4-mla-record-432-vs-368",
    case_19_storage_cross_layer_vs_per_layer => "19-storage-cross-layer-vs-per-layer",
    case_20_pool_level_ignores_memory_layout => "20-pool-level-ignores-memory-layout",
    case_21_mamba_side_states_missing_on_host => "21-mamba-side-states-missing-on-host",
    case_22_hetero_tp_1_to_2_token_level => "22-hetero-tp-1-to-2-token-level",
    case_23_hetero_tp_1_to_2_pool_level => "23-hetero-tp-1-to-2-pool-level",
    case_24_dsv4_pd_flashmla_584_vs_trtllm_512 => "24-dsv4-pd-flashmla-584-vs-trtllm-512",
    case_25_mamba_conv_state_ds_vs_sd => "25-mamba-conv-state-ds-vs-sd",
    case_26_compatible_hetero_block_size_16_vs_128_token_level =>
        "26-compatible-hetero-block-size-16-vs-128-token-level",
    case_27_invalid_dsv4_nope_scaled_per_128 => "27-invalid-dsv4-nope-scaled-per-128",
    case_28_dsv4_c4_indexer_host_per_token_vs_per_row =>
        "28-dsv4-c4-indexer-host-per-token-vs-per-row",
    case_29_compatible_replicated_heads_tp2_to_tp4_token_level =>
        "29-compatible-replicated-heads-tp2-to-tp4-token-level",
    case_30_compatible_gdn_conv_split_groups_tp2_vs_tp4_token_level =>
        "30-compatible-gdn-conv-split-groups-tp2-vs-tp4-token-level",
}

/// Every vendored case (a case added to the directory runs without a code change).
#[test]
fn every_shared_case_passes() {
    let dirs = case_dirs(&shared_cases());
    assert!(dirs.len() >= 31, "found {} shared cases", dirs.len());
    for d in dirs {
        run_case(&d);
    }
}

/// The repo's own cases, one per rule of the geometry contract.
#[test]
fn every_repo_case_passes() {
    let dirs = case_dirs(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases"));
    assert!(dirs.len() >= 10, "found {} repo cases", dirs.len());
    for d in dirs {
        run_case(&d);
    }
}

#[test]
fn exact_lines_for_the_seed_bug() {
    let dir = shared_cases().join("00-dsa-index-k-bf16-vs-fp8-host");
    let (code, text) = check(&dir.join("a.json"), &dir.join("b.json"));
    assert_eq!(code, 1);
    // bf16 128 x 2 = 256 B/token vs 128 + 4 = 132; 64-token pages: 16384 vs 8448.
    for line in [
        "index_k.sections.count: 1, 2",
        "index_k.sections[0].dtype: bf16, f8e4m3",
        "index_k.sections[1]: missing, f32 [1] (scale)",
        "index_k.bytes_per_token: 256, 132",
        "index_k.bytes_per_page: 16384, 8448",
        "index_k.page_stride_bytes: 16384, 8448",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    // The latent buffer is equal: no kv line.
    assert!(!text.lines().any(|l| l.starts_with("kv.")), "{text}");
}

#[test]
fn unreadable_files_exit_2_naming_the_file() {
    let dir = shared_cases().join("08-compatible-layer-first-vs-page-first");
    let (code, text) = check(Path::new("/nonexistent/a.json"), &dir.join("b.json"));
    assert_eq!(code, 2);
    assert!(text.contains("/nonexistent/a.json"), "{text}");
}

/// Case 18: one inserted section (rope_scale) is one line; the sections after it are named by
/// their labels, not shifted into a cascade of dtype/shape lines.
#[test]
fn an_inserted_section_is_one_line() {
    let dir = shared_cases().join("18-nvfp4-mla-record-432-vs-368");
    let (code, text) = check(&dir.join("a.json"), &dir.join("b.json"));
    assert_eq!(code, 1);
    // A: 512 fp4 / 2 = 256 + 32 e4m3 scales + 16 pad + 64 x 2 bf16 rope = 432 B/token.
    // B: 256 + 32 + 1 x 4 f32 + 12 pad + 64 x 1 e4m3 rope = 368 B/token. 64-token pages.
    for line in [
        "kv.sections[2]: missing, f32 [1] (rope_scale)",
        "kv.sections[2->3] (pad).shape: [16], [12]",
        "kv.sections[3->4] (rope).dtype: bf16, f8e4m3",
        &format!(
            "kv.bytes_per_token: {}, {}",
            256 + 32 + 16 + 128,
            256 + 32 + 4 + 12 + 64
        ),
        &format!(
            "kv.bytes_per_page: {}, {}",
            64 * (256 + 32 + 16 + 128),
            64 * (256 + 32 + 4 + 12 + 64)
        ),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    // Nothing about nope or nope_scale, which are equal.
    assert!(
        !text.contains("sections[0]") && !text.contains("sections[1]"),
        "{text}"
    );
}

/// A buffer on one side only prints its bytes per token and per page (case 15: gpt-oss-20b's
/// sliding group, 2 x 8 heads x 64 x 2 B = 2,048 B/token, 16 x 2,048 = 32,768 B/page).
#[test]
fn a_one_sided_buffer_prints_its_sizes() {
    let dir = shared_cases().join("15-gpt-oss-sliding-group-missing");
    let (code, text) = check(&dir.join("a.json"), &dir.join("b.json"));
    assert_eq!(code, 1);
    let line = format!(
        "swa: present (sliding_window_tokens 128, {} B/token, {} B/page of 16 tokens, 12 layers), missing",
        2 * 8 * 64 * 2,
        16 * 2 * 8 * 64 * 2
    );
    assert!(
        text.lines().any(|l| l == line),
        "missing {line:?} in\n{text}"
    );
}

/// The same pair at each level: pool refuses (shards and page bytes differ), token accepts
/// (per head equal, heads_total 8 on both sides), storage refuses like pool.
#[test]
fn levels_on_the_hetero_tp_pair() {
    let dir = shared_cases().join("22-hetero-tp-1-to-2-token-level");
    let (a, b) = (dir.join("a.json"), dir.join("b.json"));
    assert_eq!(check_with(&a, &b, &["--level", "token"], None).0, 0);
    let (code, text) = check_with(&a, &b, &["--level", "pool"], None);
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("fa.sections[0].shape: [8, 128], [4, 128]"),
        "{text}"
    );
    assert_eq!(check_with(&a, &b, &["--level", "storage"], None).0, 1);
    let (code, text) = check_with(&a, &b, &["--level", "page"], None);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("page"), "{text}");
}

/// `-` reads one side from stdin; both sides from stdin is refused.
#[test]
fn dash_reads_stdin() {
    let dir = shared_cases().join("14-namespace-label-only-same-geometry");
    let a = std::fs::read(dir.join("a.json")).unwrap();
    let (code, text) = check_with(Path::new("-"), &dir.join("b.json"), &[], Some(&a));
    assert_eq!(code, 0, "{text}");
    let (code, text) = check_with(Path::new("-"), Path::new("-"), &[], Some(&a));
    assert_eq!(code, 2, "{text}");
    let (code, text) = check_with(Path::new("-"), &dir.join("b.json"), &[], Some(b"{"));
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("<stdin>"), "{text}");
}

/// A model config.json given to `check` says a geometry file was expected and what it saw.
#[test]
fn a_model_config_is_named_as_one() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/llama-3.1-8b.json");
    let dir = shared_cases().join("14-namespace-label-only-same-geometry");
    let (code, text) = check(&config, &dir.join("b.json"));
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("expected a kvlayout geometry file")
            && text.contains("model config.json")
            && text.contains("\"llama\""),
        "{text}"
    );
}
