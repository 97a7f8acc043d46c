//! Compare levels: what two pools must share to exchange data at that level.
//!
//! - `pool` (default): whole pages move between the two pools (HiCache device <-> host). The
//!   v1 rules (page size, buffer set, per buffer layers, arrangement, page stride, sections by
//!   dtype, shape and scale relation in order) plus per buffer the effective page size,
//!   `attention` (kind and W or C), `layer_ids` when both sides give them, `shard`, and each
//!   section's `order`. Not compared: `name`, section labels, `pages`, `memory_layout`.
//! - `storage`: `pool` plus `memory_layout`: two stored page objects (a storage backend's
//!   blobs) are interchangeable only if serialized in the same byte order (cross-layer packed
//!   `page_first_direct` vs per layer).
//! - `token`: what a transfer engine needs to convert between two different pools (prefill TP1
//!   -> decode TP2): per buffer layers, `layer_ids` when both give them, attention, arrangement,
//!   and per head the sections' dtypes, shapes (without the head axis on a heads split),
//!   scale relations and orders; a heads split on both sides with equal `heads_total`.
//!   Ignores page size, pages, page stride, memory layout, tp_size and rank — except that a
//!   `section_major` or `planes` page cannot be cut or glued, so those buffers still need equal
//!   page sizes.

use std::fmt;
use std::str::FromStr;

/// A compare level (`kvlayout check --level`).
///
/// With the feature `clap`, a `clap::ValueEnum` taking [`Self::name`] (`pool`, `storage`,
/// `token`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Level {
    /// Whole pages are exchanged between the pools.
    #[default]
    Pool,
    /// Stored page objects are interchangeable (adds `memory_layout`).
    Storage,
    /// Tokens can be converted between the pools (per head, any page size).
    Token,
}

impl Level {
    /// Every level, in order.
    pub const ALL: [Level; 3] = [Level::Pool, Level::Storage, Level::Token];

    /// `pool`, `storage` or `token`.
    pub const fn name(self) -> &'static str {
        match self {
            Level::Pool => "pool",
            Level::Storage => "storage",
            Level::Token => "token",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown level name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown level {0:?} (expected pool, storage or token)")]
pub struct UnknownLevel(pub String);

impl FromStr for Level {
    type Err = UnknownLevel;

    fn from_str(s: &str) -> Result<Level, UnknownLevel> {
        Level::ALL
            .into_iter()
            .find(|l| l.name() == s)
            .ok_or_else(|| UnknownLevel(s.to_string()))
    }
}
