//! # kvlayout
//!
//! KV-cache buffer layouts as one source of truth, checked at compile time and asserted at run
//! time. This facade re-exports the layout model ([`kvlayout_core`]), the derive, and the pools.

pub use kvlayout_core::*;
// `pub use kvlayout_derive::KvLayout;` lands with the derive.

/// The layout model crate, for paths the derive generates.
pub use kvlayout_core as core;
/// Device and host pools, HiCache transfers, the shim.
pub use kvlayout_pool as pool;
