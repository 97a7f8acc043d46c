//! `kvlayout replay` exit codes on the binary (a small workload: 8 sessions, 2 layers, batches
//! of 2, 14 device pages): 0 ran clean, 1 pairing refused, 2 bad input, 3 sessions corrupted.

use std::process::Command;

fn replay(extra: &[&str]) -> (i32, String) {
    replay_layers("2", extra)
}

fn replay_layers(layers: &str, extra: &[&str]) -> (i32, String) {
    let host = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/configs/geometry/host-index-k-fp8-formula.json"
    );
    let mut args = vec![
        "replay",
        "--sessions",
        "8",
        "--layers",
        layers,
        "--concurrency",
        "2",
        "--device-pages",
        "14",
        "--host-pages",
        "64",
    ];
    for a in extra {
        args.push(if *a == "HOST" { host } else { a });
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(&args)
        .output()
        .expect("run kvlayout");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("exit code"), text)
}

#[test]
fn mirrored_bf16_host_exits_0() {
    let (code, text) = replay(&["--index-k", "bf16"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("corrupted 0"), "{text}");
}

#[test]
fn fp8_formula_host_is_refused_with_exit_1() {
    let (code, text) = replay(&["--index-k", "bf16", "--host-geometry", "HOST"]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("index_k.bytes_per_token: 256, 132"), "{text}");
}

#[test]
fn seed_bug_without_the_shim_exits_3() {
    let (code, text) = replay(&[
        "--index-k",
        "bf16",
        "--host-geometry",
        "HOST",
        "--no-verify",
    ]);
    assert_eq!(code, 3, "{text}");
    assert!(!text.contains("corrupted 0"), "{text}");
}

#[test]
fn more_layers_than_the_model_exits_2() {
    let (code, text) = replay_layers("62", &[]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("62 simulated layers, but the model has 61"),
        "{text}"
    );
}

/// Review 2, N1: a host geometry file is read up to the 16 MiB cap, not whole.
#[test]
fn endless_host_geometry_file_is_refused() {
    let (code, text) = replay(&["--host-geometry", "/dev/zero"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("16777216-byte limit"), "{text}");
}

/// Review 2, N2: an unwritable stdout is an exit-2 error, not a panic (exit 101).
#[test]
fn unwritable_stdout_exits_2() {
    let Ok(full) = std::fs::OpenOptions::new().write(true).open("/dev/full") else {
        eprintln!("skipped: no /dev/full on this system");
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_kvlayout"))
        .args(["formats", "--json"])
        .stdout(full)
        .output()
        .expect("run kvlayout");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.starts_with("error: failed printing to stdout"), "{err}");
}
