//! Token-layout arithmetic against numbers worked by hand from the engines' sources
//! (docs/DESIGN-facts.md, with the public engine files each number comes from). Each expected value is written out as its formula.

use kvlayout_core::formats::{
    DSA_MLA_FP8, DSV4_MLA_FP8, INDEX_K_BF16, INDEX_K_FP4, INDEX_K_FP8, MHA_MXFP8_8X128, MLA_BF16,
};
use kvlayout_core::{Arrangement, Cow, Dtype, LayoutError, Section, TokenLayout, sections};

#[test]
fn dtype_bits_and_names() {
    let expect = [
        ("f32", 32),
        ("f16", 16),
        ("bf16", 16),
        ("f8e4m3", 8),
        ("f8e4m3fnuz", 8),
        ("f8e5m2", 8),
        ("f8e5m2fnuz", 8),
        ("ue8m0", 8),
        ("u8", 8),
        ("i8", 8),
        ("f4e2m1", 4),
        ("i32", 32),
        ("i64", 64),
    ];
    for (name, bits) in expect {
        let d = Dtype::from_name(name).expect(name);
        assert_eq!(d.bits(), bits, "{name}");
        assert_eq!(d.name(), name);
    }
    assert_eq!(Dtype::from_name("fp8"), None);
    assert_eq!(Dtype::from_name("float8"), None);
    assert_eq!(Dtype::from_name(""), None);
}

/// The torch / ml_dtypes spellings (torch.float8_e4m3fn, ml_dtypes.float8_e8m0fnu, ...) name the
/// same dtypes, ASCII case-insensitively, with or without `torch.`.
#[test]
fn dtype_torch_spellings_and_case() {
    let torch = [
        ("float8_e4m3fn", Dtype::F8E4M3),
        ("float8_e4m3fnuz", Dtype::F8E4M3Fnuz),
        ("float8_e5m2", Dtype::F8E5M2),
        ("float8_e5m2fnuz", Dtype::F8E5M2Fnuz),
        ("float8_e8m0fnu", Dtype::Ue8m0),
        ("float4_e2m1fn", Dtype::F4E2M1),
        ("bfloat16", Dtype::Bf16),
        ("float16", Dtype::F16),
        ("float32", Dtype::F32),
        ("uint8", Dtype::U8),
        ("int8", Dtype::I8),
        ("int32", Dtype::I32),
        ("int64", Dtype::I64),
        ("torch.bfloat16", Dtype::Bf16),
        ("BF16", Dtype::Bf16),
        ("Float8_E4M3FN", Dtype::F8E4M3),
        ("TORCH.float8_e4m3fn", Dtype::F8E4M3),
    ];
    for (name, d) in torch {
        assert_eq!(Dtype::from_name(name), Some(d), "{name}");
    }
    // The file name stays canonical.
    assert_eq!(Dtype::from_name("bfloat16").map(Dtype::name), Some("bf16"));
    assert_eq!(Dtype::from_name("torch."), None);
}

#[test]
fn index_k_fp8_matches_sglang_indexer_page() {
    // 128 e4m3 (128 B) + 1 f32 scale (4 B) = 132 B/token.
    assert_eq!(INDEX_K_FP8.bytes_per_token(), Ok(132));
    assert_eq!(INDEX_K_FP8.value_bytes_per_token(), Ok(128));
    assert_eq!(INDEX_K_FP8.scale_bytes_per_token(), Ok(4));
    // Page of 64: [64 x 128 = 8192][64 x 4 = 256] = 8448 B.
    assert_eq!(INDEX_K_FP8.page_stride_bytes(64), Ok(8448));
    // Token t's values at 128 t, its scale at 8192 + 4 t.
    assert_eq!(INDEX_K_FP8.offset_bytes(0, 5, 0, 64), Ok(5 * 128));
    assert_eq!(INDEX_K_FP8.offset_bytes(1, 0, 0, 64), Ok(8192));
    assert_eq!(INDEX_K_FP8.offset_bytes(1, 63, 0, 64), Ok(8192 + 4 * 63));
}

#[test]
fn index_k_bf16_is_256_bytes_and_has_no_scale() {
    // 128 x 2 B = 256 B/token; the seed bug's host formula gave 132.
    assert_eq!(INDEX_K_BF16.bytes_per_token(), Ok(256));
    assert_eq!(INDEX_K_BF16.scale_bytes_per_token(), Ok(0));
    assert_eq!(INDEX_K_BF16.page_stride_bytes(64), Ok(64 * 256));
}

#[test]
fn index_k_fp4_packs_two_per_byte() {
    // 128 x 4 bits = 64 B + 4 ue8m0 (one per 32) = 68 B/token.
    assert_eq!(INDEX_K_FP4.bytes_per_token(), Ok(68));
    assert_eq!(INDEX_K_FP4.offset_bytes(1, 2, 0, 64), Ok(64 * 64 + 2 * 4));
}

#[test]
fn dsa_mla_fp8_row_matches_flashmla() {
    // [0,512) e4m3 NoPE, [512,528) 4 f32 scales, [528,656) 64 bf16 RoPE.
    assert_eq!(DSA_MLA_FP8.bytes_per_token(), Ok(656));
    assert_eq!(DSA_MLA_FP8.offset_bytes(1, 0, 0, 64), Ok(512));
    assert_eq!(DSA_MLA_FP8.offset_bytes(2, 0, 0, 64), Ok(528));
    // Token 1 starts one row later: 656 + 528.
    assert_eq!(DSA_MLA_FP8.offset_bytes(2, 1, 0, 64), Ok(1184));
    assert_eq!(DSA_MLA_FP8.page_stride_bytes(64), Ok(64 * 656));
    assert_eq!(MLA_BF16.bytes_per_token(), Ok((512 + 64) * 2));
}

#[test]
fn dsv4_planes_and_alignment() {
    // Plane 1: 448 + 128 = 576 B/token; plane 2: 7 + 1 = 8 B/token; 584 B/token.
    assert_eq!(DSV4_MLA_FP8.bytes_per_token(), Ok(584));
    // 64 x 584 = 37376 -> next multiple of 576 is 65 x 576 = 37440.
    assert_eq!(DSV4_MLA_FP8.page_payload_bytes(64), Ok(37376));
    assert_eq!(DSV4_MLA_FP8.page_stride_bytes(64), Ok(37440));
    // rope of token 2: 2 x 576 + 448; scale of token 2: 64 x 576 + 2 x 8; pad: + 7.
    assert_eq!(DSV4_MLA_FP8.offset_bytes(1, 2, 0, 64), Ok(2 * 576 + 448));
    assert_eq!(DSV4_MLA_FP8.offset_bytes(2, 2, 0, 64), Ok(64 * 576 + 16));
    assert_eq!(
        DSV4_MLA_FP8.offset_bytes(3, 2, 0, 64),
        Ok(64 * 576 + 16 + 7)
    );
}

#[test]
fn mxfp8_scales_add_64_bytes() {
    // 2 x 8 x 128 e4m3 = 2048 + 2 x 8 x 4 ue8m0 = 64 -> 2112.
    assert_eq!(MHA_MXFP8_8X128.bytes_per_token(), Ok(2112));
    assert_eq!(MHA_MXFP8_8X128.scale_bytes_per_token(), Ok(64));
}

#[test]
fn head_major_places_heads_outermost() {
    // K [2 heads, 4] bf16 (16 B/token, 8 B per head row), V the same, page of 3 tokens:
    // K section = 3 x 16 = 48 B: head h token t at (h x 3 + t) x 8; V starts at 48.
    const HND: TokenLayout = TokenLayout::new(
        Arrangement::HeadMajor,
        sections![
            Section::new("k", Dtype::Bf16, &[2, 4]),
            Section::new("v", Dtype::Bf16, &[2, 4]),
        ],
    );
    assert_eq!(HND.runs(0), Ok(2));
    assert_eq!(HND.run_bytes(0), Ok(8));
    assert_eq!(HND.offset_bytes(0, 2, 1, 3), Ok((3 + 2) * 8));
    assert_eq!(HND.offset_bytes(1, 0, 1, 3), Ok(48 + 3 * 8));
    assert_eq!(
        HND.offset_bytes(0, 0, 2, 3),
        Err(LayoutError::RunIndex {
            section: 0,
            run: 2,
            runs: 2
        })
    );
}

fn layout(sections: Vec<Section>, arrangement: Arrangement) -> TokenLayout {
    TokenLayout {
        arrangement,
        sections: Cow::Owned(sections),
        page_align_bytes: None,
        page_stride_bytes: None,
    }
}

#[test]
fn every_rule_is_enforced() {
    let v = |n: u64| Section::new("values", Dtype::F8E4M3, Box::leak(Box::new([n])));
    let s = |n: u64, target, block| {
        Section::scale_of("scale", Dtype::F32, Box::leak(Box::new([n])), target, block)
    };
    let sm = Arrangement::SectionMajor;
    // 100 values with block 128: 128 does not divide 100.
    assert_eq!(
        layout(vec![v(100), s(1, 0, 128)], sm.clone()).validate(),
        Err(LayoutError::BlockDoesNotDivide {
            section: 1,
            target_elems: 100,
            block_elems: 128
        })
    );
    // 256 values / 128 = 2 scales expected, 1 given.
    assert_eq!(
        layout(vec![v(256), s(1, 0, 128)], sm.clone()).validate(),
        Err(LayoutError::ScaleCount {
            section: 1,
            scale_elems: 1,
            expected_elems: 2
        })
    );
    assert_eq!(
        layout(vec![v(128), s(1, 5, 128)], sm.clone()).validate(),
        Err(LayoutError::ScaleTargetMissing {
            section: 1,
            target: 5
        })
    );
    assert_eq!(
        layout(vec![v(128), s(1, 1, 128)], sm.clone()).validate(),
        Err(LayoutError::ScaleTargetIsScale {
            section: 1,
            target: 1
        })
    );
    assert_eq!(
        layout(vec![v(128), s(1, 0, 0)], sm.clone()).validate(),
        Err(LayoutError::ZeroBlock { section: 1 })
    );
    // 3 fp4 elements = 12 bits: not whole bytes.
    let odd = Section::new("values", Dtype::F4E2M1, &[3]);
    assert_eq!(
        layout(vec![odd], sm.clone()).validate(),
        Err(LayoutError::SubByteCount {
            section: 0,
            elems: 3,
            bits: 4
        })
    );
    assert_eq!(
        layout(vec![v(0)], sm.clone()).validate(),
        Err(LayoutError::ZeroDim { section: 0, dim: 0 })
    );
    assert_eq!(
        layout(vec![], sm.clone()).validate(),
        Err(LayoutError::NoSections)
    );
    let planes = |p: Vec<Vec<usize>>| {
        Arrangement::Planes(Cow::Owned(p.into_iter().map(Cow::Owned).collect()))
    };
    assert_eq!(
        layout(vec![v(128), s(1, 0, 128)], planes(vec![vec![0]])).validate(),
        Err(LayoutError::PlaneSectionUnplaced { section: 1 })
    );
    assert_eq!(
        layout(
            vec![v(128), s(1, 0, 128)],
            planes(vec![vec![0, 1], vec![1]])
        )
        .validate(),
        Err(LayoutError::PlaneSectionTwice { section: 1 })
    );
}

#[test]
fn strides_explicit_and_aligned() {
    let mut l = INDEX_K_FP8.clone();
    l.page_stride_bytes = Some(8000);
    // 64 x 132 = 8448 > 8000.
    assert_eq!(
        l.page_stride_bytes(64),
        Err(LayoutError::StrideTooSmall {
            stride_bytes: 8000,
            payload_bytes: 8448
        })
    );
    l.page_stride_bytes = Some(9000);
    assert_eq!(l.page_stride_bytes(64), Ok(9000));
    l.page_align_bytes = Some(512);
    // 9000 is not a multiple of 512.
    assert!(matches!(
        l.page_stride_bytes(64),
        Err(LayoutError::StrideNotAligned { .. })
    ));
    l.page_stride_bytes = None;
    // 8448 rounded up to 512: 17 x 512 = 8704.
    assert_eq!(l.page_stride_bytes(64), Ok(8704));
    assert_eq!(l.page_stride_bytes(0), Err(LayoutError::ZeroPageSize));
}

#[test]
fn overflow_is_an_error_not_a_wrap() {
    let huge = Section::new("values", Dtype::F32, &[u64::MAX / 2, 3]);
    let e = layout(vec![huge], Arrangement::TokenMajor)
        .bytes_per_token()
        .unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
    let big = Section::new("values", Dtype::U8, &[1 << 40]);
    let e = layout(vec![big], Arrangement::TokenMajor)
        .page_payload_bytes(1 << 30)
        .unwrap_err();
    assert!(e.to_string().contains("overflow"), "{e}");
}

#[test]
fn validation_runs_at_compile_time() {
    // Evaluated by the compiler: a broken layout here would not build.
    const BYTES: u64 = kvlayout_core::__private::bytes_per_token_of(INDEX_K_FP8);
    const FP: u64 = kvlayout_core::__private::fingerprint_of(INDEX_K_FP8);
    assert_eq!(BYTES, 132);
    assert_eq!(FP, INDEX_K_FP8.fingerprint());
}
