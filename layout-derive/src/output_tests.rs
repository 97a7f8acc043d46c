//! Expansion tests in the style of zerocopy's `output_tests.rs`: each test feeds one input to
//! the derive and compares the generated tokens with the expansion written out by hand, so a
//! change to the generated code is a reviewed change to this file (not a snapshot re-blessed
//! by a tool). The compile-fail behaviour is covered by `tests/ui` (one case per rule).

use proc_macro2::TokenStream;
use quote::quote;
use syn::parse_quote;

/// `input` through the derive must give exactly `expected` (compared token by token, spacing
/// ignored).
fn assert_expands_to(input: syn::DeriveInput, expected: TokenStream) {
    let actual = crate::expand::derive(&input).to_string();
    let expected = expected.to_string();
    assert_eq!(
        actual, expected,
        "\nexpansion differs\n  actual:   {actual}\n  expected: {expected}"
    );
}

/// DeepSeek-V3.2 indexer cache (SGLang `index_buf_accessor.py`): 128 e4m3 values then one f32
/// scale per 128 values, section-major. Literal lengths are re-typed as `u64`; the scale names
/// its target by position (0) and its block (128).
#[test]
fn index_k_fp8_section_major() {
    assert_expands_to(
        parse_quote! {
            #[kv(arrangement = "section_major")]
            struct IndexKFp8 {
                values: [F8E4M3; 128],
                #[kv(scales = values, block_elems = 128)]
                scale: [f32; 1],
            }
        },
        quote! {
            #[doc(hidden)]
            #[allow(non_upper_case_globals, unused_qualifications, clippy::all)]
            const _: () = {
                const __SECTIONS: &[::kvlayout::Section] = &[
                    ::kvlayout::Section::new("values", <F8E4M3 as ::kvlayout::Element>::DTYPE, &[128u64]),
                    ::kvlayout::Section::scale_of("scale", <f32 as ::kvlayout::Element>::DTYPE, &[1u64], 0usize, 128u64)
                ];
                const __LAYOUT: ::kvlayout::TokenLayout = ::kvlayout::TokenLayout {
                    arrangement: ::kvlayout::Arrangement::SectionMajor,
                    sections: ::kvlayout::Cow::Borrowed(__SECTIONS),
                    page_align_bytes: ::core::option::Option::None,
                    page_stride_bytes: ::core::option::Option::None,
                };

                #[automatically_derived]
                impl ::kvlayout::__private::Sealed for IndexKFp8 {}

                #[automatically_derived]
                impl ::kvlayout::KvLayout for IndexKFp8 {
                    const NAME: &'static str = "IndexKFp8";
                    const LAYOUT: ::kvlayout::TokenLayout = __LAYOUT;
                    const BYTES_PER_TOKEN: u64 = ::kvlayout::__private::bytes_per_token_or_panic(&__LAYOUT);
                    const FINGERPRINT: u64 = __LAYOUT.fingerprint();
                }

                const _: () = {
                    let _: u64 = <IndexKFp8 as ::kvlayout::KvLayout>::BYTES_PER_TOKEN;
                };

                const _: fn(&IndexKFp8) = |row| {
                    let _ = (&row.values, &row.scale,);
                };
            };
        },
    );
}

/// DeepSeek-V4 MLA fp8 (SGLang `deepseek_v4_memory_pool.py`): planes `[nope, rope]` then
/// `[scale, pad]`, the page padded to a multiple of 576 B; a nested array is shape
/// `[outer, inner]`; a length given by a constant is cast, not re-typed; `crate = path` moves
/// every path.
#[test]
fn planes_alignment_nested_shape_and_crate_path() {
    assert_expands_to(
        parse_quote! {
            #[kv(planes = [[nope, rope], [scale]], page_align_bytes = 576, crate = kvlayout_core)]
            struct Planes {
                nope: [[F8E4M3; 64]; 7],
                rope: [bf16; ROPE],
                scale: [Ue8m0; 8],
            }
        },
        quote! {
            #[doc(hidden)]
            #[allow(non_upper_case_globals, unused_qualifications, clippy::all)]
            const _: () = {
                const __SECTIONS: &[kvlayout_core::Section] = &[
                    kvlayout_core::Section::new("nope", <F8E4M3 as kvlayout_core::Element>::DTYPE, &[7u64, 64u64]),
                    kvlayout_core::Section::new("rope", <bf16 as kvlayout_core::Element>::DTYPE, &[((ROPE) as u64)]),
                    kvlayout_core::Section::new("scale", <Ue8m0 as kvlayout_core::Element>::DTYPE, &[8u64])
                ];
                const __PLANES: &[kvlayout_core::Cow<'static, [usize]>] = &[
                    kvlayout_core::Cow::Borrowed(&[0usize, 1usize]),
                    kvlayout_core::Cow::Borrowed(&[2usize])
                ];
                const __LAYOUT: kvlayout_core::TokenLayout = kvlayout_core::TokenLayout {
                    arrangement: kvlayout_core::Arrangement::Planes(kvlayout_core::Cow::Borrowed(__PLANES)),
                    sections: kvlayout_core::Cow::Borrowed(__SECTIONS),
                    page_align_bytes: ::core::option::Option::Some(576u64),
                    page_stride_bytes: ::core::option::Option::None,
                };

                #[automatically_derived]
                impl kvlayout_core::__private::Sealed for Planes {}

                #[automatically_derived]
                impl kvlayout_core::KvLayout for Planes {
                    const NAME: &'static str = "Planes";
                    const LAYOUT: kvlayout_core::TokenLayout = __LAYOUT;
                    const BYTES_PER_TOKEN: u64 = kvlayout_core::__private::bytes_per_token_or_panic(&__LAYOUT);
                    const FINGERPRINT: u64 = __LAYOUT.fingerprint();
                }

                const _: () = {
                    let _: u64 = <Planes as kvlayout_core::KvLayout>::BYTES_PER_TOKEN;
                };

                const _: fn(&Planes) = |row| {
                    let _ = (&row.nope, &row.rope, &row.scale,);
                };
            };
        },
    );
}

/// A rule broken (block 3 does not divide 128): the error, then a stub impl with no sections
/// and zero bytes so that uses of the type do not cascade.
#[test]
fn error_expands_to_the_error_and_a_stub() {
    let input: syn::DeriveInput = parse_quote! {
        struct Bad {
            values: [u8; 128],
            #[kv(scales = values, block_elems = 3)]
            scale: [f32; 1],
        }
    };
    let actual = crate::expand::derive(&input).to_string();
    assert!(
        actual.starts_with(":: core :: compile_error !"),
        "the expansion starts with the error: {actual}"
    );
    let stub = quote! {
        #[doc(hidden)]
        const _: () = {
            #[automatically_derived]
            impl ::kvlayout::__private::Sealed for Bad {}

            #[automatically_derived]
            impl ::kvlayout::KvLayout for Bad {
                const NAME: &'static str = "Bad";
                const LAYOUT: ::kvlayout::TokenLayout =
                    ::kvlayout::TokenLayout::new(::kvlayout::Arrangement::TokenMajor, &[]);
                const BYTES_PER_TOKEN: u64 = 0;
                const FINGERPRINT: u64 = 0;
            }
        };
    }
    .to_string();
    assert!(
        actual.ends_with(&stub),
        "the expansion ends with the stub\n  actual: {actual}\n  stub:   {stub}"
    );
}
