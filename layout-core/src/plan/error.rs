//! Why a plan was refused. Every message names the field and both values; nothing was planned.

use std::fmt;

use crate::geometry::GeometryError;
use crate::level::Level;

/// Which pool of a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlanSide {
    /// The pool read from (prefill).
    Source,
    /// The pool written to (decode).
    Destination,
}

impl PlanSide {
    /// `source` or `destination`.
    pub const fn name(self) -> &'static str {
        match self {
            PlanSide::Source => "source",
            PlanSide::Destination => "destination",
        }
    }

    /// The page list's name: `src_pages` or `dst_pages`.
    pub const fn pages_name(self) -> &'static str {
        match self {
            PlanSide::Source => "src_pages",
            PlanSide::Destination => "dst_pages",
        }
    }
}

impl fmt::Display for PlanSide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A plan refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// One pool breaks a geometry rule.
    #[error("{side} pool: {error}")]
    Geometry {
        /// Which pool.
        side: PlanSide,
        /// The rule broken.
        error: GeometryError,
    },
    /// The pools differ at the plan's level: the diff lines of [`crate::compare_at`].
    #[error("incompatible at level {level}: {}", lines.join("; "))]
    Incompatible {
        /// The level compared (`pool` for a page plan, `token` for a token plan).
        level: Level,
        /// `field: source value, destination value`, one per differing field.
        lines: Vec<String>,
    },
    /// A page list names a page the pool does not have.
    #[error("{}[{index}]: page {page} out of range (the {side} pool has {pages} pages)", side.pages_name())]
    PageOutOfRange {
        /// Which list.
        side: PlanSide,
        /// Position in the list.
        index: usize,
        /// The page named.
        page: u64,
        /// Pages of that pool.
        pages: u64,
    },
    /// A destination page listed twice (two sources would land on one page).
    #[error("dst_pages[{index}]: page {page} listed twice (also dst_pages[{first}])")]
    DuplicateDestination {
        /// Second position.
        index: usize,
        /// First position.
        first: usize,
        /// The page.
        page: u64,
    },
    /// A page plan's lists differ in length.
    #[error("page lists: {src_pages} source pages, {dst_pages} destination pages")]
    PageCount {
        /// Source pages listed.
        src_pages: usize,
        /// Destination pages listed.
        dst_pages: usize,
    },
    /// A token plan's lists hold different token (row) counts for a buffer.
    #[error(
        "{buffer}: {src_pages} source pages x {src_page_rows} {unit} != {dst_pages} destination pages x {dst_page_rows} {unit}",
        unit = row_unit(*tokens_per_row)
    )]
    TokenCount {
        /// The buffer.
        buffer: String,
        /// Source pages listed.
        src_pages: usize,
        /// Rows (tokens, when `tokens_per_row` is 1) per source page.
        src_page_rows: u64,
        /// Destination pages listed.
        dst_pages: usize,
        /// Rows per destination page.
        dst_page_rows: u64,
        /// The buffer's `compress_ratio`.
        tokens_per_row: u64,
    },
    /// A section's bytes per token (`what` = `token`) or per head (`head`) differ.
    #[error(
        "{buffer}.{section}: {src_bytes} bytes per {what} at the source, {dst_bytes} at the destination"
    )]
    SectionBytes {
        /// The buffer.
        buffer: String,
        /// The section.
        section: String,
        /// `token` or `head`.
        what: &'static str,
        /// Source bytes.
        src_bytes: u64,
        /// Destination bytes.
        dst_bytes: u64,
    },
    /// A section whose heads are moved one by one holds different head counts on the sides.
    #[error("{buffer}.{section}: {src_heads} heads at the source, {dst_heads} at the destination")]
    HeadCount {
        /// The buffer.
        buffer: String,
        /// The section.
        section: String,
        /// Heads moved from the source.
        src_heads: u64,
        /// Heads the destination takes.
        dst_heads: u64,
    },
    /// One side splits the buffer by heads, the other does not.
    #[error("{buffer}.shard.split: source {src}, destination {dst} (heads split on one side only)")]
    SplitOneSide {
        /// The buffer.
        buffer: String,
        /// The source's split.
        src: String,
        /// The destination's split.
        dst: String,
    },
    /// A `state` buffer beside buffers with a token axis.
    #[error(
        "{buffer}.attention: a state buffer holds one slot per request, not pages: plan a pool of state buffers alone (its pages are slots)"
    )]
    State {
        /// The buffer.
        buffer: String,
    },
    /// A byte offset past 64 bits.
    #[error("{buffer}: overflow computing the {what}")]
    Overflow {
        /// The buffer.
        buffer: String,
        /// What was computed.
        what: &'static str,
    },
}

fn row_unit(tokens_per_row: u64) -> String {
    match tokens_per_row {
        1 => "tokens".to_string(),
        r => format!("rows of {r} tokens"),
    }
}

impl PlanError {
    pub(crate) fn overflow(buffer: &str, what: &'static str) -> PlanError {
        PlanError::Overflow {
            buffer: buffer.to_string(),
            what,
        }
    }

    /// A short class of the refusal: `geometry`, `incompatible`, `page_out_of_range`,
    /// `duplicate_destination`, `length`, `heads`, `state`, `overflow`.
    pub const fn kind(&self) -> &'static str {
        match self {
            PlanError::Geometry { .. } => "geometry",
            PlanError::Incompatible { .. } => "incompatible",
            PlanError::PageOutOfRange { .. } => "page_out_of_range",
            PlanError::DuplicateDestination { .. } => "duplicate_destination",
            PlanError::PageCount { .. } | PlanError::TokenCount { .. } => "length",
            PlanError::SectionBytes { .. }
            | PlanError::HeadCount { .. }
            | PlanError::SplitOneSide { .. } => "heads",
            PlanError::State { .. } => "state",
            PlanError::Overflow { .. } => "overflow",
        }
    }
}
