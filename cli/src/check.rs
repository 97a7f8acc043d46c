//! `kvlayout check A.json B.json [--level pool|storage|token]`: exit 0 when the two geometries
//! are compatible at that level, 1 with one line per differing field, 2 when an input cannot be
//! read (the message names the file, the field and the value). `-` reads one side from stdin.

use std::path::{Path, PathBuf};

use kvlayout_core::{Level, PoolGeometry, compare_at, file};

/// Arguments of `kvlayout check`.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// Geometry file of side A (`kvlayout.geometry/v1`, `/v2` or `/v3`); `-` reads stdin.
    pub a: PathBuf,
    /// Geometry file of side B; `-` reads stdin.
    pub b: PathBuf,
    /// What must agree: `pool` (whole pages move between the pools), `storage` (stored page
    /// objects are interchangeable: adds memory_layout), or `token` (tokens convert per head
    /// across page sizes and tensor-parallel ranks).
    #[arg(long, value_enum, default_value = "pool")]
    pub level: Level,
}

/// Reads and validates one geometry file (`-`: stdin); the error names the file, the field and
/// the value.
pub fn read_geometry(path: &Path) -> Result<PoolGeometry, String> {
    let read = if path == Path::new("-") {
        file::read_from(std::io::stdin().lock())
    } else {
        file::read_path(path)
    };
    read.map_err(|e| {
        let name = if path == Path::new("-") {
            "<stdin>".to_string()
        } else {
            path.display().to_string()
        };
        format!("{name}: {e}")
    })
}

/// The level's fingerprint of one side, as printed in the verdict line.
fn level_fingerprint(g: &PoolGeometry, level: Level) -> String {
    let hex = |r: Result<u64, _>| match r {
        Ok(f) => format!("{f:#018x}"),
        Err(e) => format!("invalid ({e})"),
    };
    match level {
        Level::Pool => hex(g.fingerprint()),
        Level::Storage => hex(g.storage_fingerprint()),
        Level::Token => {
            let parts: Vec<String> = g
                .token_fingerprints()
                .into_iter()
                .map(|(n, f)| format!("{n}={f:#018x}"))
                .collect();
            parts.join(" ")
        }
    }
}

/// Runs the check and prints its verdict.
pub fn run(args: &CheckArgs) -> u8 {
    if args.a == Path::new("-") && args.b == Path::new("-") {
        eprintln!("error: only one side can be read from stdin (`-`)");
        return 2;
    }
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
    let level = args.level;
    match compare_at(&a, &b, level) {
        Ok(()) => {
            // A pool of state slots only has no token axis: its page size is not compared.
            let page = if a.has_token_axis() {
                format!("page_size_tokens {}", a.page_size_tokens)
            } else {
                "state slots only".to_string()
            };
            println!(
                "compatible at level {level}: {page}, {} buffers, {level} fingerprint {}",
                a.buffers.len(),
                level_fingerprint(&a, level),
            );
            for (side, g) in [("A", &a), ("B", &b)] {
                match g.fingerprints() {
                    Ok(f) => println!("{side} fingerprints: {f}"),
                    Err(e) => println!("{side} fingerprints: invalid ({e})"),
                }
            }
            0
        }
        Err(m) => {
            println!(
                "incompatible: {} differing field{} at level {level} (A {}, B {}; {level} fingerprints {}, {})",
                m.diffs.len(),
                if m.diffs.len() == 1 { "" } else { "s" },
                args.a.display(),
                args.b.display(),
                level_fingerprint(&a, level),
                level_fingerprint(&b, level)
            );
            println!("{m}");
            1
        }
    }
}
