//! The geometry file read into typed serde models: serde's own errors (unknown field, field
//! given twice, wrong type, unknown name), each with its path, and the buffer and section
//! names in that path as in every later check.

use kvlayout_core::file;

/// A valid v2 file with one buffer `kv` of two sections `k`, `v`.
const BASE: &str = r#"{"schema": "kvlayout.geometry/v2", "name": "x", "page_size_tokens": 64,
 "pages": 16, "memory_layout": "layer_first", "buffers": [{"name": "kv", "layers": 2,
 "arrangement": "token_major", "sections": [{"name": "k", "dtype": "bf16", "shape": [2, 128]},
 {"name": "v", "dtype": "bf16", "shape": [2, 128]}], "attention": {"sliding_window_tokens": 128},
 "shard": {"tp_size": 2, "rank": 0, "split": "heads", "heads_total": 4}}]}"#;

fn err(from: &str, to: &str) -> String {
    let text = BASE.replacen(from, to, 1);
    assert_ne!(text, BASE, "{from}");
    file::from_json(&text).unwrap_err().to_string()
}

#[test]
fn the_base_file_reads() {
    let g = file::from_json(BASE).unwrap();
    assert_eq!(g.buffers[0].layers, 2);
}

#[test]
fn a_field_given_twice_is_serdes_duplicate_field_error_at_its_object() {
    let e = err(r#""pages": 16"#, r#""pages": 16, "pages": 7"#);
    assert!(
        e.starts_with("json: duplicate field `pages` at line 2"),
        "{e}"
    );
    let e = err(r#""layers": 2"#, r#""layers": 2, "layers": 1"#);
    assert!(
        e.starts_with("buffers[0] (kv): duplicate field `layers`"),
        "{e}"
    );
    let e = err(r#""dtype": "bf16""#, r#""dtype": "bf16", "dtype": "f16""#);
    assert!(
        e.starts_with("buffers[0] (kv).sections[0] (k): duplicate field `dtype`"),
        "{e}"
    );
    let e = err(r#""rank": 0"#, r#""rank": 0, "rank": 1"#);
    assert!(
        e.starts_with("buffers[0] (kv).shard: duplicate field `rank`"),
        "{e}"
    );
    // An object of one key (attention, arrangement) given its key twice names the second.
    let e = err(
        r#"{"sliding_window_tokens": 128}"#,
        r#"{"sliding_window_tokens": 128, "sliding_window_tokens": 64}"#,
    );
    assert!(
        e.starts_with("buffers[0] (kv).attention: expected ")
            && e.contains("an object of one key, got a second key \"sliding_window_tokens\""),
        "{e}"
    );
}

#[test]
fn a_key_with_a_quote_given_twice_is_named_whole() {
    // `pa"ges` is no field of a geometry file: refused at its first occurrence, named whole
    // (the old pass split its message at the quote).
    let e = err(
        r#""pages": 16"#,
        r#""pa\"ges": 16, "pa\"ges": 7, "pages": 16"#,
    );
    assert!(
        e.starts_with("pa\"ges: unknown field `pa\"ges`, expected one of"),
        "{e}"
    );
    let e = err(
        r#""layers": 2"#,
        r#""la\"yers": 2, "la\"yers": 1, "layers": 2"#,
    );
    assert!(
        e.starts_with("buffers[0] (kv).la\"yers: unknown field `la\"yers`"),
        "{e}"
    );
}

#[test]
fn names_of_another_json_type_say_what_was_expected() {
    let e = err(r#""arrangement": "token_major""#, r#""arrangement": 3"#);
    assert!(
        e.starts_with(
            "buffers[0] (kv).arrangement: invalid type: integer `3`, expected token_major, \
             section_major, head_major or {\"planes\": [[section names], ...]}"
        ),
        "{e}"
    );
    let e = err(r#""arrangement": "token_major""#, r#""arrangement": {}"#);
    assert!(e.contains("got an empty object {}"), "{e}");
    let e = err(r#""arrangement": "token_major""#, r#""arrangement": "nhd""#);
    assert!(
        e.starts_with(
            "buffers[0] (kv).arrangement: unknown variant `nhd`, expected one of `token_major`"
        ),
        "{e}"
    );
    let e = err(r#""layer_first""#, "1");
    assert!(
        e.starts_with("memory_layout: invalid type: integer `1`, expected layer_first, page_first"),
        "{e}"
    );
    let e = err(r#""split": "heads""#, r#""split": "rows""#);
    assert!(
        e.starts_with(
            "buffers[0] (kv).shard.split: unknown variant `rows`, expected `heads` or `replicated`"
        ),
        "{e}"
    );
    let e = err(r#""kvlayout.geometry/v2""#, r#""kvlayout.geometry/v9""#);
    assert!(
        e.starts_with("schema: unknown variant `kvlayout.geometry/v9`"),
        "{e}"
    );
    let e = err(
        r#"{"sliding_window_tokens": 128}"#,
        r#"{"sliding_window_tokens": -1}"#,
    );
    assert!(
        e.starts_with(
            "buffers[0] (kv).attention.sliding_window_tokens: invalid value: integer `-1`, expected u64"
        ),
        "{e}"
    );
    // `null` attention is absent (full), as before.
    let g =
        file::from_json(&BASE.replacen(r#"{"sliding_window_tokens": 128}"#, "null", 1)).unwrap();
    assert_eq!(g.buffers[0].attention, kvlayout_core::Attention::Full);
}

#[test]
fn syntax_errors_come_before_any_field_and_a_config_is_named_as_one() {
    // A broken file is reported as broken even when an earlier field is also wrong.
    let e = err(r#""kvlayout.geometry/v2""#, r#""kvlayout.geometry/v9""#);
    assert!(e.starts_with("schema"), "{e}");
    let text = BASE.replacen(r#""kvlayout.geometry/v2""#, r#""kvlayout.geometry/v9""#, 1);
    let e = file::from_json(&text[..text.len() - 3])
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("json: EOF while parsing"), "{e}");
    for top in ["[1]", "null", "5", "\"kvlayout\""] {
        let e = file::from_json(top).unwrap_err().to_string();
        assert!(
            e.starts_with("json: invalid type: ")
                && e.contains("expected a geometry file: an object"),
            "{e}"
        );
    }
    let e = file::from_json(r#"{"model_type": "llama", "num_hidden_layers": 32}"#)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("looks like a model config.json (model_type \"llama\") (it has model_type, num_hidden_layers)"),
        "{e}"
    );
    let e = file::from_json("{}").unwrap_err().to_string();
    assert!(e.starts_with("schema: missing"), "{e}");
}
