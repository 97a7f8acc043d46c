//! `kvlayout check` on every public bug case in ../shared/cases (and the repo's own cases in
//! cli-tests/cases): the exit code and the strings `expect.json` names must appear in the
//! combined output, case-insensitively.

use std::path::{Path, PathBuf};
use std::process::Command;

fn check(a: &Path, b: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .arg("check")
        .arg(a)
        .arg(b)
        .output()
        .expect("run kvlayout");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("exit code"), text)
}

fn run_case(dir: &Path) {
    let expect: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expect.json")).unwrap()).unwrap();
    let (code, text) = check(&dir.join("a.json"), &dir.join("b.json"));
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

/// The public bug cases, vendored from ../shared/cases so a fresh clone tests them too.
fn shared_cases() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cli-tests/shared-cases")
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
}

/// Every vendored case, and every case in ../shared/cases beside the checkout when it exists
/// (a case added there later runs without a code change).
#[test]
fn every_shared_case_passes() {
    let dirs = case_dirs(&shared_cases());
    assert!(dirs.len() >= 13, "found {} shared cases", dirs.len());
    for d in dirs {
        run_case(&d);
    }
    let live = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/cases");
    if live.is_dir() {
        for d in case_dirs(&live) {
            run_case(&d);
        }
    } else {
        eprintln!("note: {} not present; vendored cases only", live.display());
    }
}

/// The repo's own cases, one per rule of the geometry contract.
#[test]
fn every_repo_case_passes() {
    let dirs = case_dirs(&Path::new(env!("CARGO_MANIFEST_DIR")).join("cli-tests/cases"));
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
