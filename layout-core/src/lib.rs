//! # kvlayout-core
//!
//! The KV-cache layout model: [`Dtype`]s, [`Section`]s, [`TokenLayout`] (one token's entry
//! and the arrangement of a page), [`PageGeometry`], [`BufferGeometry`] (with the v2 fields:
//! own page size, [`Attention`] full / sliding window / chunked / state, layer ids,
//! tensor-parallel [`Shard`]), [`PoolGeometry`] (buffers, page size, memory layout, byte
//! offsets), the compatibility check [`compare_at`] at a [`Level`] (`pool`, `storage`,
//! `token`) with a field-by-field [`Mismatch`], stable const [`fingerprint`]s, parametric
//! [`formats`] builders, the geometry file module [`mod@file`]
//! (`kvlayout.geometry/v1` and `/v2`), and the page content [`checksum`] bound to the layout.
//!
//! Every size carries its unit in its name (`_bytes`, `_elems`, `_bits`, `_tokens`, `_pages`),
//! every computation is checked (an overflow is [`LayoutError::Overflow`], never a wrap), and
//! the token-layout arithmetic is `const fn`, so `#[derive(KvLayout)]` descriptors are
//! evaluated — and rejected — at compile time.
//!
//! ```
//! use kvlayout_core::{Arrangement, Cow, Dtype, Section, TokenLayout, sections};
//! // DeepSeek-V3.2 indexer cache (SGLang index_buf_accessor.py): 128 e4m3 values, then one f32
//! // scale per 128 values; a 64-token page is [64 x 128 B][64 x 4 B].
//! const INDEX_K_FP8: TokenLayout = TokenLayout {
//!     arrangement: Arrangement::SectionMajor,
//!     sections: Cow::Borrowed(sections![
//!         Section::new("values", Dtype::F8E4M3, &[128]),
//!         Section::scale_of("scale", Dtype::F32, &[1], 0, 128),
//!     ]),
//!     page_align_bytes: None,
//!     page_stride_bytes: None,
//! };
//! // Evaluated by the compiler:
//! const BYTES: u64 = match INDEX_K_FP8.bytes_per_token() { Ok(b) => b, Err(_) => 0 };
//! assert_eq!(BYTES, 128 + 4);
//! assert_eq!(INDEX_K_FP8.page_stride_bytes(64), Ok(64 * 132));
//! assert_eq!(INDEX_K_FP8.offset_bytes(1, 3, 0, 64), Ok(64 * 128 + 3 * 4));
//! ```

#![warn(clippy::missing_errors_doc)]

mod align;
mod buffer;
pub mod checksum;
mod diff;
mod dtype;
mod duplicate_keys;
pub mod elem;
mod error;
pub mod file;
pub mod fingerprint;
pub mod formats;
mod geometry;
mod layout;
pub mod level;
pub mod plan;
pub mod quant;
mod regions;
mod section;
mod totals;

pub use buffer::{Attention, BufferGeometry, Shard, ShardSplit};
pub use diff::{FieldDiff, Mismatch, arrangement_text, buffer_summary, compare, compare_at};
pub use dtype::Dtype;
pub use duplicate_keys::{DuplicateKey, check_unique_keys, find_duplicate_key};
pub use elem::Element;
pub use error::LayoutError;
pub use geometry::{GeometryError, MemoryLayout, PoolGeometry, Segment, buffer_path, layout_error};
pub use layout::{Arrangement, PageGeometry, TokenLayout};
pub use level::Level;
pub use regions::{POOL_REGION, Placement, Region};
pub use section::{ScaleOf, Section};
pub use totals::Totals;

pub use std::borrow::Cow;

/// A token-row type with a compile-time layout descriptor. Implemented by
/// `#[derive(KvLayout)]` only (the supertrait is sealed by convention: it lives in a hidden
/// module that the derive names).
///
/// In `const` context use [`KvLayout::BYTES_PER_TOKEN`] and [`KvLayout::FINGERPRINT`]:
/// calling a method on `<T as KvLayout>::LAYOUT` inside a `const` initializer is rejected
/// (E0493), because a `TokenLayout` may own `Cow` data whose destructor cannot run in `const`.
/// At run time `T::LAYOUT` is an ordinary value.
pub trait KvLayout: __private::Sealed {
    /// The type's name.
    const NAME: &'static str;
    /// The descriptor: sections, arrangement, alignment.
    const LAYOUT: TokenLayout;
    /// Bytes of one token's entry; evaluating it validates the layout at compile time.
    const BYTES_PER_TOKEN: u64;
    /// [`TokenLayout::fingerprint`] of [`KvLayout::LAYOUT`].
    const FINGERPRINT: u64;
}

/// Compile-time carrier of a byte count, so a failed assertion prints both numbers:
/// "expected `BytesPerToken<128>`, found `BytesPerToken<132>`".
pub struct BytesPerToken<const N: u64>;

/// Fails to compile unless `$ty`'s layout has `$bytes` bytes per token; the error shows both
/// numbers ("expected `BytesPerToken<128>`, found `BytesPerToken<132>`"). See the compile-fail
/// tests in `tests/ui/`.
#[macro_export]
macro_rules! assert_bytes_per_token {
    ($ty:ty, $bytes:expr) => {
        const _: () = {
            let _: $crate::BytesPerToken<{ $bytes }> =
                $crate::BytesPerToken::<{ <$ty as $crate::KvLayout>::BYTES_PER_TOKEN }>;
        };
    };
}

/// A `&'static [Section]` usable in `const` items (a `Section` owns `Cow`s, so a plain
/// `&[Section::new(..)]` is not promoted to `'static`).
#[macro_export]
macro_rules! sections {
    ($($s:expr),* $(,)?) => {{
        const SECTIONS: &[$crate::Section] = &[$($s),*];
        SECTIONS
    }};
}

#[doc(hidden)]
pub mod __private {
    use crate::TokenLayout;

    /// Implemented by the derive next to `KvLayout`.
    pub trait Sealed {}

    /// A derive attribute's number, typed `u64` (a float, bool or wider integer does not
    /// compile, instead of being cast).
    pub const fn attr_u64(value: u64) -> u64 {
        value
    }

    /// [`bytes_per_token_or_panic`] on a layout taken by value, for associated consts
    /// (`&Self::LAYOUT` is not promoted in a trait impl, and a `TokenLayout` owns `Cow`s whose
    /// destructor cannot run in `const`: the value is forgotten instead, which frees nothing
    /// since a const layout only borrows `'static` data).
    pub const fn bytes_per_token_of(layout: TokenLayout) -> u64 {
        let b = bytes_per_token_or_panic(&layout);
        std::mem::forget(layout);
        b
    }

    /// [`TokenLayout::fingerprint`] on a layout taken by value (see [`bytes_per_token_of`]).
    pub const fn fingerprint_of(layout: TokenLayout) -> u64 {
        let f = layout.fingerprint();
        std::mem::forget(layout);
        f
    }

    /// Validates at compile time (panicking with the rule broken) and returns bytes per token.
    pub const fn bytes_per_token_or_panic(layout: &TokenLayout) -> u64 {
        if let Err(e) = layout.validate() {
            panic!("{}", e.message());
        }
        match layout.bytes_per_token() {
            Ok(b) => b,
            Err(e) => panic!("{}", e.message()),
        }
    }
}
