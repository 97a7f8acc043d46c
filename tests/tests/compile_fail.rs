//! The derive's compile-fail cases (tests/ui/*.rs) and its pass case, run by trybuild.
//!
//! The expected `.stderr` files quote rustc's own wording and spans, which change between
//! compiler releases; they were blessed with the rustc below. Under another rustc the cases are
//! skipped, saying why (a toolchain pin would make CI fetch a toolchain it cannot fetch).

/// The rustc the `.stderr` files were blessed with.
const BLESSED_RUSTC: &str = "rustc 1.95.0";

/// `rustc --version` of the compiler trybuild will run (`$RUSTC`, else `rustc`).
fn rustc_version() -> Option<String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn ui() {
    let version = rustc_version().unwrap_or_else(|| "unknown".into());
    if !version.starts_with(&format!("{BLESSED_RUSTC} ")) && version != BLESSED_RUSTC {
        eprintln!(
            "compile_fail: skipped: the .stderr files were blessed with {BLESSED_RUSTC}, this is \
             {version} (rerun with TRYBUILD=overwrite under it and review the diff to move them)"
        );
        return;
    }
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
    t.pass("ui/pass/*.rs");
}
