//! Replays the fuzz corpora (fuzz/corpus/<target>/, seeded with every shared and repo case, plus
//! what fuzzing kept) and every past crash (fuzz/regressions/<target>/) through the same entry
//! points the fuzz targets call. CI runs this; `cargo fuzz run <target>` explores further.

#[path = "../../fuzz/src/lib.rs"]
mod fuzz_entry;

use std::path::Path;

fn replay(target: &str, entry: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut count = 0;
    for dir in [
        root.join("corpus").join(target),
        root.join("regressions").join(target),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let path = e.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let r = std::panic::catch_unwind(|| entry(&data));
            assert!(r.is_ok(), "{} panicked", path.display());
            count += 1;
        }
    }
    count
}

#[test]
fn geometry_file_corpus() {
    // At least the distinct seed files: 24 shared + 21 repo cases, two sides each, stored by
    // content hash (identical sides count once), plus 3 hand-made v2 seeds.
    let n = replay("geometry_file", fuzz_entry::geometry_file);
    assert!(n >= 90, "{n} inputs");
}

#[test]
fn check_pair_corpus() {
    // 24 shared + 21 repo case pairs, 2 hand-made v2 pairs.
    let n = replay("check_pair", fuzz_entry::check_pair);
    assert!(n >= 47, "{n} inputs");
}

#[test]
fn model_config_corpus() {
    // Seeded with the 8 real configs in configs/.
    let n = replay("model_config", fuzz_entry::model_config);
    assert!(n >= 8, "{n} inputs");
}
