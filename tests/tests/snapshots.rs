//! One JSON snapshot per built-in format (through serde, so they survive rustc updates): name,
//! sizes, arrangement, sections, the byte offset of every section of tokens 0 and 1 in a
//! 64-token page, and the fingerprint. Reviewed against docs/DESIGN-facts.md before acceptance;
//! the key figures are also asserted here, worked by hand.

use kvlayout::formats::{self, Format};
use kvlayout::{Arrangement, Section, TokenLayout};
use serde_json::{Value, json};

const PAGE_SIZE_TOKENS: u64 = 64;

fn section_json(layout: &TokenLayout, s: &Section) -> Value {
    let mut v = json!({
        "name": s.name(),
        "dtype": s.dtype.name(),
        "shape": s.shape(),
    });
    if let Some(rel) = s.scale {
        v["scales"] = json!(layout.sections()[rel.target].name());
        v["block_elems"] = json!(rel.block_elems);
    }
    v
}

fn arrangement_json(layout: &TokenLayout) -> Value {
    match &layout.arrangement {
        Arrangement::Planes(_) => {
            let planes: Vec<Vec<&str>> = layout
                .arrangement
                .planes()
                .iter()
                .map(|p| p.iter().map(|&i| layout.sections()[i].name()).collect())
                .collect();
            json!({ "planes": planes })
        }
        other => json!(other.name()),
    }
}

fn format_json(f: &Format) -> Value {
    let l = &f.layout;
    let offsets: Vec<Value> = (0..l.sections().len())
        .map(|i| {
            json!({
                "section": l.sections()[i].name(),
                "token_0_bytes": l.offset_bytes(i, 0, 0, PAGE_SIZE_TOKENS).unwrap(),
                "token_1_bytes": l.offset_bytes(i, 1, 0, PAGE_SIZE_TOKENS).unwrap(),
            })
        })
        .collect();
    json!({
        "name": f.name,
        "bytes_per_token": l.bytes_per_token().unwrap(),
        "value_bytes_per_token": l.value_bytes_per_token().unwrap(),
        "scale_bytes_per_token": l.scale_bytes_per_token().unwrap(),
        "page_size_tokens": PAGE_SIZE_TOKENS,
        "page_payload_bytes": l.page_payload_bytes(PAGE_SIZE_TOKENS).unwrap(),
        "page_stride_bytes": l.page_stride_bytes(PAGE_SIZE_TOKENS).unwrap(),
        "page_align_bytes": l.page_align_bytes,
        "arrangement": arrangement_json(l),
        "sections": l.sections().iter().map(|s| section_json(l, s)).collect::<Vec<_>>(),
        "offsets_in_page": offsets,
        "fingerprint": format!("{:#018x}", l.fingerprint()),
    })
}

#[test]
fn every_built_in_format() {
    let all = formats::all();
    assert_eq!(all.len(), 10);
    for f in &all {
        insta::assert_json_snapshot!(f.name, format_json(f));
    }
}

/// The figures the review checked, asserted outright (worked by hand from docs/DESIGN-facts.md).
#[test]
fn reviewed_figures() {
    let v = |name: &str| format_json(&formats::by_name(name).unwrap());
    // index_k_fp8, section-major: token 1's values at 1 x 128; its scale after 64 x 128 = 8192
    // value bytes, then one 4-byte scale: 8192 + 4 = 8196.
    let fp8 = v("index_k_fp8");
    assert_eq!(fp8["offsets_in_page"][0]["token_1_bytes"], 128);
    assert_eq!(fp8["offsets_in_page"][1]["token_1_bytes"], 8196);
    // dsa_mla_fp8, one 656-byte row per token: rope of token 1 at 656 + 512 + 16 = 1184.
    let dsa = v("dsa_mla_fp8");
    assert_eq!(dsa["offsets_in_page"][2]["token_1_bytes"], 1184);
    assert_eq!(dsa["offsets_in_page"][1]["token_0_bytes"], 512);
    // dsv4_mla_fp8: plane 2 starts after 64 x 576 = 36864; token 1's pad at 36864 + 8 + 7.
    let v4 = v("dsv4_mla_fp8");
    assert_eq!(v4["offsets_in_page"][3]["token_1_bytes"], 36879);
    assert_eq!(v4["page_stride_bytes"], 37440);
    // mha_mxfp8_8x128, section-major: k is 8 x 128 x 1 B = 1024 B/token, so v starts after
    // 64 x 1024 = 65536 B; v_scale after 64 x (1024 + 1024 + 32) = 133120 B, token 1 at + 32.
    let mx = v("mha_mxfp8_8x128");
    assert_eq!(mx["offsets_in_page"][1]["token_0_bytes"], 65536);
    assert_eq!(
        mx["offsets_in_page"][3]["token_1_bytes"],
        64 * (1024 + 1024 + 32) + 32
    );
}
