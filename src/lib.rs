//! # kvlayout
//!
//! KV-cache buffer layouts as one source of truth, checked at compile time and asserted at run
//! time. This facade re-exports the layout model ([`kvlayout_core`]), the derive, and the pools.
//!
//! A token row is declared once, as a struct; `#[derive(KvLayout)]` turns it into a
//! [`TokenLayout`] evaluated (and validated) at compile time, from which both the device and
//! the host pool are built:
//!
//! ```
//! use kvlayout::KvLayout;
//! use kvlayout::elem::F8E4M3;
//!
//! /// DeepSeek-V3.2 indexer cache (SGLang `index_buf_accessor.py`): 128 e4m3 values, then one
//! /// f32 scale per 128 values, section-major: a 64-token page is `[64 x 128 B][64 x 4 B]`.
//! #[derive(KvLayout)]
//! #[kv(arrangement = "section_major")]
//! struct IndexKFp8 {
//!     values: [F8E4M3; 128],
//!     #[kv(scales = values, block_elems = 128)]
//!     scale: [f32; 1],
//! }
//!
//! // 128 x 1 B + 1 x 4 B = 132; fails to compile if the layout ever changes size.
//! kvlayout::assert_bytes_per_token!(IndexKFp8, 132);
//! assert_eq!(IndexKFp8::LAYOUT.page_stride_bytes(64), Ok(64 * 132));
//! // Token 1's scale: after the 64 x 128 value bytes, then one 4-byte scale: 8192 + 4.
//! assert_eq!(IndexKFp8::LAYOUT.offset_bytes(1, 1, 0, 64), Ok(8196));
//! ```
//!
//! A layout that breaks a rule does not compile: a block that does not divide the scaled
//! field, a scale count other than count / block, an odd fp4 count, planes that miss a field,
//! an element type that is not an [`Element`] — each reported at the offending field.

pub use kvlayout_core::*;
pub use kvlayout_derive::KvLayout;

/// The layout model crate, for paths the derive generates.
pub use kvlayout_core as core;
/// Hugging Face `config.json` to pool geometry (feature `models`).
#[cfg(feature = "models")]
pub use kvlayout_models as models;
/// Device and host pools, HiCache transfers, the shim.
pub use kvlayout_pool as pool;
