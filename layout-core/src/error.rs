//! Errors of the layout model.
//!
//! [`LayoutError`] is `Copy` and built in `const fn`s, so a bad layout fails at compile time
//! with the same words it fails with at run time. Section positions are indices; the geometry
//! file reader ([`crate::file`]) turns them into field paths with names.

use std::fmt;

/// A rule of the layout model that a token layout or pool geometry breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// Checked arithmetic overflowed while computing `what`.
    Overflow { what: &'static str },
    /// A layout with no sections.
    NoSections,
    /// A section with an empty shape.
    EmptyShape { section: usize },
    /// A zero dimension in a section's shape.
    ZeroDim { section: usize, dim: usize },
    /// A sub-byte section whose bits do not fill whole bytes (fp4 needs an even count).
    SubByteCount {
        section: usize,
        elems: u64,
        bits: u64,
    },
    /// A scale section names a section index that does not exist.
    ScaleTargetMissing { section: usize, target: usize },
    /// A scale section names itself or another scale section.
    ScaleTargetIsScale { section: usize, target: usize },
    /// `block_elems` is zero.
    ZeroBlock { section: usize },
    /// The block length does not divide the scaled section's element count.
    BlockDoesNotDivide {
        section: usize,
        target_elems: u64,
        block_elems: u64,
    },
    /// The scale section's element count is not scaled elements / block.
    ScaleCount {
        section: usize,
        scale_elems: u64,
        expected_elems: u64,
    },
    /// `planes` is empty, or one plane is empty.
    EmptyPlane { plane: usize },
    /// A plane names a section index that does not exist.
    PlaneSectionMissing { plane: usize, section: usize },
    /// A section appears in more than one plane, or twice in one.
    PlaneSectionTwice { section: usize },
    /// A section appears in no plane.
    PlaneSectionUnplaced { section: usize },
    /// In `head_major`, a section's per-head row does not fill whole bytes.
    HeadRowSubByte { section: usize },
    /// `page_align_bytes` is zero.
    ZeroAlign,
    /// An explicit page stride is smaller than the page payload.
    StrideTooSmall {
        stride_bytes: u64,
        payload_bytes: u64,
    },
    /// An explicit page stride that is not a multiple of `page_align_bytes`.
    StrideNotAligned { stride_bytes: u64, align_bytes: u64 },
    /// A page of zero tokens.
    ZeroPageSize,
    /// A `compress_ratio` of 0, or one that does not divide the page's tokens.
    RatioDoesNotDivide {
        compress_ratio: u64,
        page_size_tokens: u64,
    },
    /// A section index past the end of the layout.
    SectionIndex { section: usize, sections: usize },
    /// A token index past the end of the page.
    TokenIndex { token: u64, page_size_tokens: u64 },
    /// A head (run) index past the section's run count.
    RunIndex { section: usize, run: u64, runs: u64 },
}

impl LayoutError {
    /// The rule broken, in words (usable in `const` panics, which cannot format numbers).
    pub const fn message(&self) -> &'static str {
        match self {
            LayoutError::Overflow { .. } => "overflow in layout arithmetic",
            LayoutError::NoSections => "a layout needs at least one section",
            LayoutError::EmptyShape { .. } => "a section shape needs at least one dimension",
            LayoutError::ZeroDim { .. } => "a section shape has a zero dimension",
            LayoutError::SubByteCount { .. } => {
                "a sub-byte section must fill whole bytes (fp4 needs an even element count)"
            }
            LayoutError::ScaleTargetMissing { .. } => "a scale section names a missing section",
            LayoutError::ScaleTargetIsScale { .. } => {
                "a scale section must scale a value section (not itself or another scale)"
            }
            LayoutError::ZeroBlock { .. } => "block_elems must be at least 1",
            LayoutError::BlockDoesNotDivide { .. } => {
                "block_elems does not divide the scaled section's element count"
            }
            LayoutError::ScaleCount { .. } => {
                "a scale section's element count must equal the scaled count / block_elems"
            }
            LayoutError::EmptyPlane { .. } => "planes must be non-empty groups of sections",
            LayoutError::PlaneSectionMissing { .. } => "a plane names a missing section",
            LayoutError::PlaneSectionTwice { .. } => {
                "a section appears in more than one plane slot"
            }
            LayoutError::PlaneSectionUnplaced { .. } => "a section appears in no plane",
            LayoutError::HeadRowSubByte { .. } => {
                "head_major: a section's per-head row must fill whole bytes"
            }
            LayoutError::ZeroAlign => "page_align_bytes must be at least 1",
            LayoutError::StrideTooSmall { .. } => {
                "page_stride_bytes is smaller than the page payload"
            }
            LayoutError::StrideNotAligned { .. } => {
                "page_stride_bytes is not a multiple of page_align_bytes"
            }
            LayoutError::ZeroPageSize => "page_size_tokens must be at least 1",
            LayoutError::RatioDoesNotDivide { .. } => {
                "compress_ratio must be at least 1 and divide the page's tokens (a page holds whole rows)"
            }
            LayoutError::SectionIndex { .. } => "section index out of range",
            LayoutError::TokenIndex { .. } => "token index out of range for the page",
            LayoutError::RunIndex { .. } => "head index out of range for the section",
        }
    }
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())?;
        match *self {
            LayoutError::Overflow { what } => write!(f, " ({what})"),
            LayoutError::EmptyShape { section } => write!(f, " (section {section})"),
            LayoutError::ZeroDim { section, dim } => {
                write!(f, " (section {section}, dimension {dim} is 0)")
            }
            LayoutError::SubByteCount {
                section,
                elems,
                bits,
            } => write!(
                f,
                " (section {section}: {elems} elems x {bits} bits = {} bits)",
                elems.saturating_mul(bits)
            ),
            LayoutError::ScaleTargetMissing { section, target }
            | LayoutError::ScaleTargetIsScale { section, target } => {
                write!(f, " (section {section} scales section {target})")
            }
            LayoutError::ZeroBlock { section } => write!(f, " (section {section})"),
            LayoutError::BlockDoesNotDivide {
                section,
                target_elems,
                block_elems,
            } => write!(
                f,
                " (section {section}: block_elems {block_elems}, scaled section has {target_elems} elems)"
            ),
            LayoutError::ScaleCount {
                section,
                scale_elems,
                expected_elems,
            } => write!(
                f,
                " (section {section}: {scale_elems} scale elems, expected {expected_elems})"
            ),
            LayoutError::EmptyPlane { plane } => write!(f, " (plane {plane})"),
            LayoutError::PlaneSectionMissing { plane, section } => {
                write!(f, " (plane {plane} names section {section})")
            }
            LayoutError::PlaneSectionTwice { section }
            | LayoutError::PlaneSectionUnplaced { section }
            | LayoutError::HeadRowSubByte { section } => write!(f, " (section {section})"),
            LayoutError::StrideTooSmall {
                stride_bytes,
                payload_bytes,
            } => write!(
                f,
                " (page_stride_bytes {stride_bytes}, payload {payload_bytes} bytes)"
            ),
            LayoutError::StrideNotAligned {
                stride_bytes,
                align_bytes,
            } => write!(
                f,
                " (page_stride_bytes {stride_bytes}, page_align_bytes {align_bytes})"
            ),
            LayoutError::SectionIndex { section, sections } => {
                write!(f, " (section {section} of {sections})")
            }
            LayoutError::TokenIndex {
                token,
                page_size_tokens,
            } => write!(f, " (token {token}, page of {page_size_tokens} tokens)"),
            LayoutError::RatioDoesNotDivide {
                compress_ratio,
                page_size_tokens,
            } => write!(
                f,
                " (compress_ratio {compress_ratio}, page_size_tokens {page_size_tokens})"
            ),
            LayoutError::RunIndex { section, run, runs } => {
                write!(f, " (section {section}: head {run} of {runs})")
            }
            LayoutError::NoSections | LayoutError::ZeroAlign | LayoutError::ZeroPageSize => Ok(()),
        }
    }
}

impl std::error::Error for LayoutError {}

/// `?` for `const fn`s (the `?` operator is not const).
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Err(e),
        }
    };
}
pub(crate) use tri;

/// Checked `a * b`, an [`LayoutError::Overflow`] naming `what` on overflow.
pub(crate) const fn mul(a: u64, b: u64, what: &'static str) -> Result<u64, LayoutError> {
    match a.checked_mul(b) {
        Some(v) => Ok(v),
        None => Err(LayoutError::Overflow { what }),
    }
}

/// Checked `a + b`.
pub(crate) const fn add(a: u64, b: u64, what: &'static str) -> Result<u64, LayoutError> {
    match a.checked_add(b) {
        Some(v) => Ok(v),
        None => Err(LayoutError::Overflow { what }),
    }
}
