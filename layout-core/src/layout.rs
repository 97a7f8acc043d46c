//! Token layouts: the sections of one token's entry and how a page of tokens is arranged.
//!
//! Arrangements (inside one page of one layer, `T` = `page_size_tokens`):
//! - `token_major`: a row per token holding every section in order (NHD for `[heads, dim]`
//!   shapes): section `s` of token `t` at `t * bytes_per_token + sum(bytes of sections < s)`.
//!   Mirrors FlashMLA / vLLM `fp8_ds_mla` (one 656-B row per token) and SGLang MLA pools.
//! - `section_major`: each section's rows for all tokens, section after section:
//!   `T * sum(bytes of sections < s) + t * bytes(s)`. Mirrors the DeepSeek-V3.2 indexer cache
//!   (SGLang `index_buf_accessor.py`): a 64-token page is `[64 x 128 B values][64 x 4 B scales]`,
//!   token t's scale at byte 8192 + 4t.
//! - `head_major` (HND): section after section, heads outermost inside a section: head `h` of
//!   token `t` at `T * sum(bytes of sections < s) + (h * T + t) * head_row_bytes(s)`.
//! - `planes`: groups of sections, token-major inside a group, group after group. Mirrors
//!   SGLang's DeepSeek-V4 pool: `[64 x (448 e4m3 + 128 B rope)][64 x (7 ue8m0 + 1 pad)]`.
//!
//! Every arrangement is dense: the page payload is `T * bytes_per_token`. The page stride is
//! the payload, rounded up to `page_align_bytes`, or the explicit `page_stride_bytes`.

use std::borrow::Cow;

use crate::error::{LayoutError, add, mul, tri};
use crate::section::{Section, bits_to_bytes, cow_slice};

/// How the sections of a page's tokens are laid out inside one page of one layer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Arrangement {
    /// A row per token holding all sections.
    TokenMajor,
    /// All tokens' first section, then all tokens' second section, ...
    SectionMajor,
    /// Like `SectionMajor`, with heads outermost inside each section (HND).
    HeadMajor,
    /// Groups of section indices: token-major inside a group, group after group.
    Planes(Cow<'static, [Cow<'static, [usize]>]>),
}

impl Arrangement {
    /// The geometry-file name (`planes` for explicit planes).
    pub const fn name(&self) -> &'static str {
        match self {
            Arrangement::TokenMajor => "token_major",
            Arrangement::SectionMajor => "section_major",
            Arrangement::HeadMajor => "head_major",
            Arrangement::Planes(_) => "planes",
        }
    }

    /// Stable code hashed by the fingerprint.
    pub const fn code(&self) -> u8 {
        match self {
            Arrangement::TokenMajor => 1,
            Arrangement::SectionMajor => 2,
            Arrangement::HeadMajor => 3,
            Arrangement::Planes(_) => 4,
        }
    }

    /// The planes, or an empty slice for the named arrangements.
    pub const fn planes(&self) -> &[Cow<'static, [usize]>] {
        match self {
            Arrangement::Planes(p) => cow_slice(p),
            _ => &[],
        }
    }
}

/// The layout of one token's entry in one buffer, and the arrangement of a page of them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenLayout {
    /// Arrangement inside one page of one layer.
    pub arrangement: Arrangement,
    /// Sections in byte order (for `token_major`, the order inside a row).
    pub sections: Cow<'static, [Section]>,
    /// Page stride rounded up to a multiple of this many bytes (DeepSeek-V4: 576).
    pub page_align_bytes: Option<u64>,
    /// Explicit page stride in bytes, at least the page payload.
    pub page_stride_bytes: Option<u64>,
}

/// The sizes of one page of one layer of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PageGeometry {
    /// Tokens per page.
    pub page_size_tokens: u64,
    /// Tokens per row R (v3 `compress_ratio`; 1: a row per token).
    pub compress_ratio: u64,
    /// Rows per page: `page_size_tokens / compress_ratio`.
    pub rows_per_page: u64,
    /// Bytes of one row (all sections): one token's entry when `compress_ratio` is 1, one
    /// row of `compress_ratio` tokens otherwise.
    pub bytes_per_token: u64,
    /// `rows_per_page * bytes_per_token` (row bytes).
    pub page_payload_bytes: u64,
    /// Distance between consecutive pages: payload plus alignment padding.
    pub page_stride_bytes: u64,
}

impl TokenLayout {
    /// A layout from static data, no alignment.
    pub const fn new(arrangement: Arrangement, sections: &'static [Section]) -> TokenLayout {
        TokenLayout {
            arrangement,
            sections: Cow::Borrowed(sections),
            page_align_bytes: None,
            page_stride_bytes: None,
        }
    }

    /// The sections as a slice.
    pub const fn sections(&self) -> &[Section] {
        cow_slice(&self.sections)
    }

    /// Section `index`, or [`LayoutError::SectionIndex`].
    ///
    /// # Errors
    ///
    /// [`LayoutError::SectionIndex`] when `index` is not below the section count.
    pub const fn section(&self, index: usize) -> Result<&Section, LayoutError> {
        let s = self.sections();
        if index >= s.len() {
            return Err(LayoutError::SectionIndex {
                section: index,
                sections: s.len(),
            });
        }
        Ok(&s[index])
    }

    /// Checks every rule of the model that does not need a page size.
    ///
    /// # Errors
    ///
    /// The [`LayoutError`] of the first rule broken: no sections, an empty shape or zero dimension,
    /// bits that do not fill whole bytes, a scale section whose target is missing or is a scale, a
    /// zero or non-dividing block, a scale count that does not match, planes that miss, repeat or
    /// leave out a section, a zero alignment, a stride below the payload or off the alignment, or a
    /// size that overflows.
    pub const fn validate(&self) -> Result<(), LayoutError> {
        let s = self.sections();
        if s.is_empty() {
            return Err(LayoutError::NoSections);
        }
        let mut i = 0;
        while i < s.len() {
            tri!(s[i].bytes(i));
            if let Some(rel) = s[i].scale {
                if rel.target >= s.len() {
                    return Err(LayoutError::ScaleTargetMissing {
                        section: i,
                        target: rel.target,
                    });
                }
                if rel.target == i || s[rel.target].scale.is_some() {
                    return Err(LayoutError::ScaleTargetIsScale {
                        section: i,
                        target: rel.target,
                    });
                }
                if rel.block_elems == 0 {
                    return Err(LayoutError::ZeroBlock { section: i });
                }
                let target_elems = tri!(s[rel.target].elems(rel.target));
                if target_elems % rel.block_elems != 0 {
                    return Err(LayoutError::BlockDoesNotDivide {
                        section: i,
                        target_elems,
                        block_elems: rel.block_elems,
                    });
                }
                let scale_elems = tri!(s[i].elems(i));
                if scale_elems != target_elems / rel.block_elems {
                    return Err(LayoutError::ScaleCount {
                        section: i,
                        scale_elems,
                        expected_elems: target_elems / rel.block_elems,
                    });
                }
            }
            i += 1;
        }
        match &self.arrangement {
            Arrangement::HeadMajor => {
                let mut i = 0;
                while i < s.len() {
                    tri!(self.run_bytes(i));
                    i += 1;
                }
            }
            Arrangement::Planes(_) => tri!(self.validate_planes()),
            Arrangement::TokenMajor | Arrangement::SectionMajor => {}
        }
        if let Some(0) = self.page_align_bytes {
            return Err(LayoutError::ZeroAlign);
        }
        tri!(self.bytes_per_token());
        Ok(())
    }

    const fn validate_planes(&self) -> Result<(), LayoutError> {
        let planes = self.arrangement.planes();
        let n = self.sections().len();
        if planes.is_empty() {
            return Err(LayoutError::EmptyPlane { plane: 0 });
        }
        // Each section must appear exactly once over all planes.
        let mut s = 0;
        while s < n {
            let mut seen = 0;
            let mut p = 0;
            while p < planes.len() {
                let plane = cow_slice(&planes[p]);
                let mut k = 0;
                while k < plane.len() {
                    if plane[k] == s {
                        seen += 1;
                    }
                    k += 1;
                }
                p += 1;
            }
            if seen > 1 {
                return Err(LayoutError::PlaneSectionTwice { section: s });
            }
            if seen == 0 {
                return Err(LayoutError::PlaneSectionUnplaced { section: s });
            }
            s += 1;
        }
        let mut p = 0;
        while p < planes.len() {
            let plane = cow_slice(&planes[p]);
            if plane.is_empty() {
                return Err(LayoutError::EmptyPlane { plane: p });
            }
            let mut k = 0;
            while k < plane.len() {
                if plane[k] >= n {
                    return Err(LayoutError::PlaneSectionMissing {
                        plane: p,
                        section: plane[k],
                    });
                }
                k += 1;
            }
            p += 1;
        }
        Ok(())
    }

    /// Elements per token of section `index`.
    ///
    /// # Errors
    ///
    /// [`LayoutError::SectionIndex`] for an `index` out of range; [`LayoutError::Overflow`] when
    /// the shape's product overflows.
    pub const fn section_elems(&self, index: usize) -> Result<u64, LayoutError> {
        tri!(self.section(index)).elems(index)
    }

    /// Bytes per token of section `index`.
    ///
    /// # Errors
    ///
    /// As [`TokenLayout::section_elems`], plus bits that do not fill whole bytes
    /// ([`LayoutError::SubByteCount`]).
    pub const fn section_bytes(&self, index: usize) -> Result<u64, LayoutError> {
        tri!(self.section(index)).bytes(index)
    }

    /// Bytes of one token's entry: the sum of every section's bytes.
    ///
    /// # Errors
    ///
    /// A section's [`TokenLayout::section_bytes`] error, or a sum that overflows
    /// ([`LayoutError::Overflow`]).
    pub const fn bytes_per_token(&self) -> Result<u64, LayoutError> {
        self.bytes_per_token_where(0)
    }

    /// Bytes per token of the value (non-scale) sections.
    ///
    /// # Errors
    ///
    /// As [`TokenLayout::bytes_per_token`].
    pub const fn value_bytes_per_token(&self) -> Result<u64, LayoutError> {
        self.bytes_per_token_where(1)
    }

    /// Bytes per token of the scale sections.
    ///
    /// # Errors
    ///
    /// As [`TokenLayout::bytes_per_token`].
    pub const fn scale_bytes_per_token(&self) -> Result<u64, LayoutError> {
        self.bytes_per_token_where(2)
    }

    /// 0: all sections, 1: value sections, 2: scale sections.
    const fn bytes_per_token_where(&self, which: u8) -> Result<u64, LayoutError> {
        let s = self.sections();
        let mut total = 0u64;
        let mut i = 0;
        while i < s.len() {
            let is_scale = s[i].scale.is_some();
            if which == 0 || (which == 1 && !is_scale) || (which == 2 && is_scale) {
                total = tri!(add(total, tri!(s[i].bytes(i)), "bytes per token"));
            }
            i += 1;
        }
        Ok(total)
    }

    /// `page_size_tokens * bytes_per_token`.
    ///
    /// # Errors
    ///
    /// [`LayoutError::ZeroPageSize`] for a `page_size_tokens` of 0; the errors of
    /// [`TokenLayout::bytes_per_token`]; a product that overflows.
    pub const fn page_payload_bytes(&self, page_size_tokens: u64) -> Result<u64, LayoutError> {
        if page_size_tokens == 0 {
            return Err(LayoutError::ZeroPageSize);
        }
        mul(
            page_size_tokens,
            tri!(self.bytes_per_token()),
            "page payload bytes",
        )
    }

    /// Distance between consecutive pages: the explicit stride, or the payload rounded up to
    /// `page_align_bytes` (DeepSeek-V4: 64 x 584 = 37376 -> 37440, a multiple of 576).
    ///
    /// # Errors
    ///
    /// As [`TokenLayout::page_payload_bytes`], plus a zero alignment, an explicit stride below the
    /// payload or off the alignment, or a rounding that overflows.
    pub const fn page_stride_bytes(&self, page_size_tokens: u64) -> Result<u64, LayoutError> {
        let payload = tri!(self.page_payload_bytes(page_size_tokens));
        if let Some(stride) = self.page_stride_bytes {
            if stride < payload {
                return Err(LayoutError::StrideTooSmall {
                    stride_bytes: stride,
                    payload_bytes: payload,
                });
            }
            if let Some(align) = self.page_align_bytes {
                if align == 0 {
                    return Err(LayoutError::ZeroAlign);
                }
                if stride % align != 0 {
                    return Err(LayoutError::StrideNotAligned {
                        stride_bytes: stride,
                        align_bytes: align,
                    });
                }
            }
            return Ok(stride);
        }
        match self.page_align_bytes {
            None => Ok(payload),
            Some(0) => Err(LayoutError::ZeroAlign),
            Some(align) => {
                let rem = payload % align;
                if rem == 0 {
                    Ok(payload)
                } else {
                    add(payload, align - rem, "aligned page stride")
                }
            }
        }
    }

    /// All sizes of a page of `page_size_tokens` tokens, a row per token, after validating
    /// the layout.
    ///
    /// # Errors
    ///
    /// Any [`TokenLayout::validate`] error, and those of [`TokenLayout::page_stride_bytes`].
    pub const fn page_geometry(&self, page_size_tokens: u64) -> Result<PageGeometry, LayoutError> {
        self.page_geometry_compressed(page_size_tokens, 1)
    }

    /// All sizes of a page of `page_size_tokens` tokens stored one row per `compress_ratio`
    /// tokens (v3): the layout's sections describe one row, and the page holds
    /// `page_size_tokens / compress_ratio` rows.
    ///
    /// # Errors
    /// The layout's own rule broken; [`LayoutError::ZeroPageSize`] when the ratio is 0;
    /// [`LayoutError::RatioDoesNotDivide`] when it does not divide the page size; overflow.
    pub const fn page_geometry_compressed(
        &self,
        page_size_tokens: u64,
        compress_ratio: u64,
    ) -> Result<PageGeometry, LayoutError> {
        tri!(self.validate());
        if page_size_tokens == 0 {
            return Err(LayoutError::ZeroPageSize);
        }
        if compress_ratio == 0 || !page_size_tokens.is_multiple_of(compress_ratio) {
            return Err(LayoutError::RatioDoesNotDivide {
                compress_ratio,
                page_size_tokens,
            });
        }
        let rows_per_page = page_size_tokens / compress_ratio;
        let bytes_per_token = tri!(self.bytes_per_token());
        let page_payload_bytes = tri!(self.page_payload_bytes(rows_per_page));
        let page_stride_bytes = tri!(self.page_stride_bytes(rows_per_page));
        Ok(PageGeometry {
            page_size_tokens,
            compress_ratio,
            rows_per_page,
            bytes_per_token,
            page_payload_bytes,
            page_stride_bytes,
        })
    }

    /// Contiguous runs one token's section is split into: its heads under `head_major`, else 1.
    ///
    /// # Errors
    ///
    /// [`LayoutError::SectionIndex`] for an `index` out of range.
    pub const fn runs(&self, index: usize) -> Result<u64, LayoutError> {
        let s = tri!(self.section(index));
        match self.arrangement {
            Arrangement::HeadMajor => Ok(s.heads()),
            _ => Ok(1),
        }
    }

    /// Bytes of one run of section `index` (the whole section unless `head_major`).
    ///
    /// # Errors
    ///
    /// As [`TokenLayout::section_bytes`]; under `head_major`, a head row that is not whole bytes
    /// ([`LayoutError::HeadRowSubByte`]).
    pub const fn run_bytes(&self, index: usize) -> Result<u64, LayoutError> {
        let s = tri!(self.section(index));
        match self.arrangement {
            Arrangement::HeadMajor => {
                let elems = tri!(s.elems(index));
                let per_head = elems / s.heads();
                match bits_to_bytes(per_head, s.dtype.bits(), index) {
                    Ok(b) => Ok(b),
                    Err(_) => Err(LayoutError::HeadRowSubByte { section: index }),
                }
            }
            _ => s.bytes(index),
        }
    }

    /// Byte offset, inside one page of one layer, of run `run` (a head under `head_major`,
    /// else 0) of section `index` of token `token`.
    ///
    /// # Errors
    ///
    /// [`LayoutError::ZeroPageSize`]; [`LayoutError::TokenIndex`] when `token >= page_size_tokens`;
    /// [`LayoutError::SectionIndex`] or [`LayoutError::RunIndex`] for an index out of range; any
    /// size error of the layout, or an offset that overflows.
    pub const fn offset_bytes(
        &self,
        index: usize,
        token: u64,
        run: u64,
        page_size_tokens: u64,
    ) -> Result<u64, LayoutError> {
        if page_size_tokens == 0 {
            return Err(LayoutError::ZeroPageSize);
        }
        if token >= page_size_tokens {
            return Err(LayoutError::TokenIndex {
                token,
                page_size_tokens,
            });
        }
        let runs = tri!(self.runs(index));
        if run >= runs {
            return Err(LayoutError::RunIndex {
                section: index,
                run,
                runs,
            });
        }
        let t = page_size_tokens;
        match &self.arrangement {
            Arrangement::TokenMajor => {
                let row = tri!(self.bytes_per_token());
                let before = tri!(self.bytes_before(index));
                add(tri!(mul(token, row, "token offset")), before, "offset")
            }
            Arrangement::SectionMajor | Arrangement::HeadMajor => {
                let base = tri!(mul(t, tri!(self.bytes_before(index)), "section base"));
                let run_bytes = tri!(self.run_bytes(index));
                let slot = tri!(add(tri!(mul(run, t, "run slot")), token, "run slot"));
                add(
                    base,
                    tri!(mul(slot, run_bytes, "run offset")),
                    "section offset",
                )
            }
            Arrangement::Planes(_) => {
                let planes = self.arrangement.planes();
                let mut base = 0u64;
                let mut p = 0;
                while p < planes.len() {
                    let plane = cow_slice(&planes[p]);
                    let mut row = 0u64;
                    let mut within = 0u64;
                    let mut found = false;
                    let mut k = 0;
                    while k < plane.len() {
                        if plane[k] == index {
                            found = true;
                            within = row;
                        }
                        row = tri!(add(row, tri!(self.section_bytes(plane[k])), "plane row"));
                        k += 1;
                    }
                    if found {
                        let token_off = tri!(mul(token, row, "plane token offset"));
                        return add(
                            base,
                            tri!(add(token_off, within, "plane offset")),
                            "plane offset",
                        );
                    }
                    base = tri!(add(base, tri!(mul(t, row, "plane bytes")), "plane base"));
                    p += 1;
                }
                Err(LayoutError::PlaneSectionUnplaced { section: index })
            }
        }
    }

    /// Sum of the bytes of the sections before `index`.
    const fn bytes_before(&self, index: usize) -> Result<u64, LayoutError> {
        let mut total = 0u64;
        let mut i = 0;
        while i < index {
            total = tri!(add(
                total,
                tri!(self.section_bytes(i)),
                "bytes before section"
            ));
            i += 1;
        }
        Ok(total)
    }
}
