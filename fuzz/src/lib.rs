//! Fuzz entry points, shared by the cargo-fuzz targets (fuzz/fuzz_targets) and by the corpus
//! replay test that CI runs (cli/tests/fuzz_corpus.rs includes this file).
//!
//! Each entry takes arbitrary bytes and must never panic, hang, or allocate in proportion to a
//! number read from the input; the assertions below are the invariants checked on every input.

use kvlayout_core::{Level, PoolGeometry, compare, compare_at, file};

/// Reads a geometry file; on success checks the invariants every valid geometry must hold.
pub fn geometry_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(g) = file::from_json(text) else {
        return;
    };
    valid_geometry_invariants(&g);
}

/// Splits the input at its first NUL byte into two geometry files (v1, v2 or v3) and runs the
/// whole `kvlayout check` comparison both ways at every level.
pub fn check_pair(data: &[u8]) {
    let Some(cut) = data.iter().position(|&b| b == 0) else {
        return;
    };
    let (Ok(a), Ok(b)) = (
        std::str::from_utf8(&data[..cut]),
        std::str::from_utf8(&data[cut + 1..]),
    ) else {
        return;
    };
    let (Ok(a), Ok(b)) = (file::from_json(a), file::from_json(b)) else {
        return;
    };
    let mut compatible = Vec::new();
    for level in Level::ALL {
        let ab = compare_at(&a, &b, level);
        let ba = compare_at(&b, &a, level);
        assert_eq!(ab.is_ok(), ba.is_ok(), "compare is symmetric at {level}");
        if let (Err(x), Err(y)) = (&ab, &ba) {
            assert_eq!(
                x.diffs.len(),
                y.diffs.len(),
                "same number of differing fields at {level}"
            );
            assert!(!x.diffs.is_empty(), "a mismatch has a line");
            let _ = x.to_string();
        }
        compatible.push(ab.is_ok());
    }
    let [pool, storage, token] = compatible[..] else {
        unreachable!("three levels")
    };
    assert!(!storage || pool, "storage-compatible => pool-compatible");
    assert!(!pool || token, "pool-compatible => token-compatible");
    assert_eq!(compare(&a, &b).is_ok(), pool, "compare is the pool level");
    // Layer ids are compared only when both sides give them, and hashed whenever present.
    let one_sided_layer_ids = a.buffers.iter().any(|x| {
        b.buffers
            .iter()
            .any(|y| y.name() == x.name() && x.layer_ids.is_some() != y.layer_ids.is_some())
    });
    if pool && !one_sided_layer_ids {
        assert_eq!(
            a.fingerprint(),
            b.fingerprint(),
            "compatible => equal fingerprints"
        );
    }
    if storage && !one_sided_layer_ids {
        assert_eq!(a.storage_fingerprint(), b.storage_fingerprint());
    }
}

fn valid_geometry_invariants(g: &PoolGeometry) {
    for level in Level::ALL {
        assert_eq!(
            compare_at(g, g, level),
            Ok(()),
            "a geometry is compatible with itself at {level}"
        );
    }
    let _ = g
        .fingerprints()
        .expect("validated geometry has fingerprints");
    let _ = g.totals(); // may overflow (an error), never panic
    let again = file::from_json(&file::to_json(g)).expect("a written geometry reads back");
    assert_eq!(&again, g, "lossless round trip");
    let total = g.total_bytes().expect("validated geometry has a total");
    let _ = g
        .fingerprint()
        .expect("validated geometry has a fingerprint");
    v3_invariants(g);
    for (b, buf) in g.buffers.iter().enumerate() {
        let stored = g.stored_page_bytes(b).expect("stride");
        for (layer, page) in [(0, 0), (buf.layers - 1, g.pages - 1)] {
            let off = g.page_offset_bytes(b, layer, page).expect("in range");
            assert!(off < total, "page offset inside the pool");
            if g.memory_layout != kvlayout_core::MemoryLayout::PageHead {
                assert!(off + stored <= total, "page inside the pool");
            }
            if g.page_geometry(b).expect("page").page_payload_bytes <= 1 << 16 {
                for s in g.page_segments(b, layer, page).expect("segments") {
                    assert!(s.pool_offset_bytes + s.len_bytes <= total, "segment inside");
                }
            }
        }
    }
}

/// Geometry v3 on a validated geometry: a page of P tokens holds P / R whole rows and its
/// payload is rows x row bytes; a heads split holds heads inside `0..heads_total` (one, the
/// same for every replica, when heads are replicated over ranks); split groups divide by
/// tp_size and sum to heads_total; compressed buffers add row bytes x layers / R per token.
fn v3_invariants(g: &PoolGeometry) {
    let mut compressed = 0f64;
    for (b, buf) in g.buffers.iter().enumerate() {
        let page = g.page_geometry(b).expect("page");
        let r = buf.compress_ratio;
        assert!(r >= 1, "compress_ratio at least 1");
        assert_eq!(
            page.rows_per_page * r,
            page.page_size_tokens,
            "whole rows per page"
        );
        let row = buf.layout.bytes_per_token().expect("row bytes");
        assert_eq!(
            page.page_payload_bytes,
            page.rows_per_page * row,
            "rows x row bytes"
        );
        if r > 1 {
            compressed += (row * buf.layers) as f64 / r as f64;
        }
        if let Some(s) = buf.shard
            && let Some(total) = s.heads_total()
        {
            let (lo, hi) = s.heads_held().expect("a heads split holds heads");
            assert!(lo < hi && hi <= total, "heads held inside 0..heads_total");
            if s.replicated_heads() {
                assert_eq!(hi - lo, 1, "one head per replicated rank");
                assert_eq!(s.tp_size % total, 0, "tp_size a multiple of heads_total");
            }
            for sec in buf.layout.sections() {
                assert_eq!(sec.shape()[0], hi - lo, "head axis = heads held");
                if let Some(groups) = sec.split_groups() {
                    assert_eq!(
                        groups.iter().sum::<u64>(),
                        total,
                        "groups sum to heads_total"
                    );
                    assert!(
                        groups.iter().all(|x| x % s.tp_size == 0),
                        "groups split evenly"
                    );
                }
            }
        }
    }
    if let Ok(t) = g.totals() {
        let tolerance = compressed.abs() * 1e-12;
        assert!(
            (t.compressed_bytes_per_token - compressed).abs() <= tolerance,
            "compressed bytes per token: {} vs {compressed}",
            t.compressed_bytes_per_token
        );
    }
}

/// Reads a Hugging Face `config.json` and maps it to a pool geometry under every dtype choice;
/// a geometry that comes out must be valid and its per-token total must be the sum of its
/// buffers' layers x bytes per token.
pub fn model_config(data: &[u8]) {
    use kvlayout_models::{IndexK, KvDtype, Model, PoolOptions};
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(model) = Model::parse("fuzz", "fuzz input", text) else {
        return;
    };
    for kv_dtype in [None, Some(KvDtype::Bf16), Some(KvDtype::Fp8)] {
        for index_k in [IndexK::Fp8, IndexK::Bf16, IndexK::Fp4] {
            let opts = PoolOptions {
                kv_dtype,
                index_k,
                page_size_tokens: 64,
                pages: 16,
                ..PoolOptions::default()
            };
            let Ok(pool) = model.pool(&opts) else {
                continue;
            };
            let g = &pool.geometry;
            assert_eq!(g.validate(), Ok(()), "a model pool is a valid geometry");
            v3_invariants(g);
            // One row per R > 1 tokens has no whole bytes per token: refused naming the ratio.
            if let Some(b) = g.buffers.iter().position(|b| b.compress_ratio != 1) {
                let e = g.bytes_per_token_all_layers().unwrap_err();
                assert!(e.field.ends_with(".compress_ratio"), "{e}");
                assert!(e.field.contains(g.buffers[b].name()), "{e}");
                continue;
            }
            let mut sum = 0u64;
            for b in &g.buffers {
                let per = b.layout.bytes_per_token().expect("valid layout");
                sum = sum
                    .checked_add(per.checked_mul(b.layers).expect("validated"))
                    .expect("validated");
            }
            assert_eq!(g.bytes_per_token_all_layers(), Ok(sum));
        }
    }
}
