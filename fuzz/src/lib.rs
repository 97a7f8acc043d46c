//! Fuzz entry points, shared by the cargo-fuzz targets (fuzz/fuzz_targets) and by the corpus
//! replay test that CI runs (tests/tests/fuzz_corpus.rs includes this file).
//!
//! Each entry takes arbitrary bytes and must never panic, hang, or allocate in proportion to a
//! number read from the input; the assertions below are the invariants checked on every input.

use kvlayout_core::{PoolGeometry, compare, file};

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

/// Splits the input at its first NUL byte into two geometry files and runs the whole
/// `kvlayout check` comparison both ways.
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
    let ab = compare(&a, &b);
    let ba = compare(&b, &a);
    assert_eq!(ab.is_ok(), ba.is_ok(), "compare is symmetric");
    if let (Err(x), Err(y)) = (&ab, &ba) {
        assert_eq!(
            x.diffs.len(),
            y.diffs.len(),
            "same number of differing fields"
        );
        let _ = x.to_string();
    }
    if ab.is_ok() {
        assert_eq!(
            a.fingerprint(),
            b.fingerprint(),
            "compatible => equal fingerprints"
        );
    }
}

fn valid_geometry_invariants(g: &PoolGeometry) {
    assert_eq!(
        compare(g, g),
        Ok(()),
        "a geometry is compatible with itself"
    );
    let again = file::from_json(&file::to_json(g)).expect("a written geometry reads back");
    assert_eq!(&again, g, "lossless round trip");
    let total = g.total_bytes().expect("validated geometry has a total");
    let _ = g
        .fingerprint()
        .expect("validated geometry has a fingerprint");
    for (b, buf) in g.buffers.iter().enumerate() {
        let stored = g.stored_page_bytes(b).expect("stride");
        for (layer, page) in [(0, 0), (buf.layers - 1, g.pages - 1)] {
            let off = g.page_offset_bytes(b, layer, page).expect("in range");
            assert!(off < total, "page offset inside the pool");
            if g.memory_layout != kvlayout_core::MemoryLayout::PageHead {
                assert!(off + stored <= total, "page inside the pool");
            }
        }
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
