//! `kvlayout check A.json B.json`: exit 0 when the two geometries can exchange pages, 1 with one
//! line per differing field, 2 when an input cannot be read (the message names the field).

use std::path::{Path, PathBuf};

use kvlayout_core::{PoolGeometry, compare, file};

/// Arguments of `kvlayout check`.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// Geometry file of side A (`kvlayout.geometry/v1`).
    pub a: PathBuf,
    /// Geometry file of side B.
    pub b: PathBuf,
}

/// Reads and validates one geometry file; the error names the file, the field and the value.
pub fn read_geometry(path: &Path) -> Result<PoolGeometry, String> {
    file::read_path(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs the check and prints its verdict.
pub fn run(args: &CheckArgs) -> u8 {
    let (a, b) = (read_geometry(&args.a), read_geometry(&args.b));
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => {
            for e in [a.err(), b.err()].into_iter().flatten() {
                eprintln!("error: {e}");
            }
            return 2;
        }
    };
    let fingerprint = |g: &PoolGeometry| match g.fingerprint() {
        Ok(f) => format!("{f:#018x}"),
        Err(e) => format!("invalid ({e})"),
    };
    match compare(&a, &b) {
        Ok(()) => {
            println!(
                "compatible: page_size_tokens {}, {} buffers, fingerprint {}",
                a.page_size_tokens,
                a.buffers.len(),
                fingerprint(&a)
            );
            0
        }
        Err(m) => {
            println!(
                "incompatible: {} differing field{} (A {}, B {}; fingerprints {}, {})",
                m.diffs.len(),
                if m.diffs.len() == 1 { "" } else { "s" },
                args.a.display(),
                args.b.display(),
                fingerprint(&a),
                fingerprint(&b)
            );
            println!("{m}");
            1
        }
    }
}
