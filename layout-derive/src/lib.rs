//! # kvlayout-derive
//!
//! `#[derive(KvLayout)]`: a token-row struct becomes a compile-time KV-cache layout
//! descriptor. Each named field is one section, in byte order; its type is an array, possibly
//! nested, of an element type: `[F8E4M3; 128]` is 128 fp8 values, `[[bf16; 128]; 8]` is shape
//! `[8, 128]` (outermost first, `[heads, head_dim]`). The element's dtype comes from the trait
//! `Element` (`<T as Element>::DTYPE`), so type aliases work and an unsupported type is an
//! error on that field. Use it through the `kvlayout` facade, which re-exports it.
//!
//! ```
//! use kvlayout_core::KvLayout;
//! use kvlayout_core::elem::F8E4M3;
//! use kvlayout_derive::KvLayout;
//!
//! /// DeepSeek-V3.2 indexer cache (SGLang `index_buf_accessor.py`): 128 e4m3 values, then one
//! /// f32 scale per 128 values; a 64-token page is `[64 x 128 B][64 x 4 B]`.
//! #[derive(KvLayout)]
//! #[kv(arrangement = "section_major", crate = kvlayout_core)] // `crate` only outside the facade
//! struct IndexKFp8 {
//!     values: [F8E4M3; 128],
//!     #[kv(scales = values, block_elems = 128)]
//!     scale: [f32; 1],
//! }
//!
//! assert_eq!(IndexKFp8::BYTES_PER_TOKEN, 128 + 4);
//! // Section-major: token 3's scale sits after the 64 x 128 value bytes: 8192 + 3 x 4.
//! assert_eq!(IndexKFp8::LAYOUT.offset_bytes(1, 3, 0, 64), Ok(8192 + 12));
//! kvlayout_core::assert_bytes_per_token!(IndexKFp8, 132);
//! ```
//!
//! ## Attributes
//! On the struct, `#[kv(...)]`:
//! - `arrangement = "token_major"` (default), `"section_major"` or `"head_major"`;
//! - `planes = [[nope, rope], [scale, pad]]`: explicit planes (groups of fields, token-major
//!   inside a group, group after group; DeepSeek-V4), each field in exactly one plane;
//! - `page_align_bytes = N`: page stride rounded up to a multiple of `N` bytes;
//! - `page_stride_bytes = N`: explicit page stride, at least the page payload (checked against
//!   the payload when a page size is given, since the payload depends on it) and a multiple of
//!   `page_align_bytes` when both are given;
//! - `crate = path`: where the layout model lives (default `::kvlayout`, the facade; inside
//!   `kvlayout-core`, `crate`).
//!
//! On a field: `#[kv(scales = values, block_elems = 128)]`: this field holds one scale per 128
//! elements of field `values`; its element count must be `values`' count / 128.
//!
//! ## Guarantees
//! - Rules knowable from the syntax (integer-literal lengths) are checked by the macro, one
//!   error per problem, all reported at once, each pointing at the offending field or key:
//!   a scale target that is missing, itself, or another scale; a block of 0, one that does
//!   not divide the target's count, a scale count other than count / block; planes that miss
//!   or repeat a field; an odd count of `F4E2M1`; an empty struct, a tuple struct, an enum,
//!   generics; unknown or repeated keys.
//! - Everything else (lengths given by constants, dtypes known only through the `Element`
//!   trait, overflow) is checked by evaluating `TokenLayout::validate` in a `const` the
//!   expansion always emits: a broken layout fails to compile even when nothing uses it, and
//!   the message names the rule broken.
//! - On error the expansion still emits a stub impl, so uses of the type do not cascade.
//!
//! The generated impl (of the sealed trait `KvLayout`) provides `NAME`, `LAYOUT`
//! (`TokenLayout`), `BYTES_PER_TOKEN` and `FINGERPRINT` as associated constants.

mod ast;
mod attr;
mod expand;
mod fallback;
mod valid;

#[cfg(test)]
mod output_tests;

use proc_macro::TokenStream;
use syn::{DeriveInput, parse_macro_input};

/// Derives `KvLayout` for a token-row struct; see the [crate docs](crate) for the attributes.
#[proc_macro_derive(KvLayout, attributes(kv))]
pub fn derive_kv_layout(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand::derive(&input).into()
}
