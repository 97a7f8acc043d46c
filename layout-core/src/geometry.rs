//! Pool geometry: buffers with their layer counts, page size, page count, memory layout, and
//! the byte offset of every (buffer, layer, page).
//!
//! A pool is one byte space. Memory layouts (SGLang HiCache host layouts; device pools are
//! `layer_first`), with `L` layers, `P` pages and page stride `S` of buffer `b`:
//! - `layer_first`: each buffer a region `[layer][page][S]`; page at `base_b + (l * P + p) * S`.
//! - `page_first`: each buffer a region `[page][layer][S]`; page at `base_b + (p * L + l) * S`.
//! - `page_first_direct`: one region `[page][buffer][layer][S]`, so every page of the pool (all
//!   buffers, all layers) is one contiguous run for zero-copy storage I/O.
//! - `page_head` (MHA): each buffer a region `[page][head][layer][token][head row]`; a page of
//!   one layer is `heads` runs, and the layout needs every section shaped `[heads, ...]`.
//!   vLLM's `BHLNC` (`vllm/v1/kv_cache_layout.py`) is this layout.
//! - `layer_head` (vLLM's `LHBNC`): each buffer a region `[layer][head][page][token][head row]`.
//! - `page_head_token` (SGLang's MHA `page_head` host layout, `mem_cache/pool_host/mha.py`
//!   `(2, page_num, head_num, page_size, layer_num, head_dim)`): each buffer a region
//!   `[page][head][token][layer][head row]`; a head's page of one layer is one run a token.
//! - `page_unified` (SGLang's MHA `page_unified`, `mem_cache/pool_host/page_unified.py`): one
//!   region `[page][group][layer][buffer][token][group row]`, `G = heads / heads_per_group`
//!   groups; a group row is every section's bytes of the group's heads, section after section.
//!
//! A head row (`page_head`, `layer_head`) is every section's bytes of one head, in section
//! order; these layouts store a page of one layer as pieces (heads or groups) of
//! `rows x piece row` bytes each, with no page padding.

use std::fmt;

use crate::buffer::BufferGeometry;
use crate::error::LayoutError;
use crate::layout::{Arrangement, PageGeometry};

/// Where pages of a whole pool sit in memory; serde reads and writes the geometry-file names
/// (`layer_first`, `page_first`, `page_first_direct`, `page_head`, `layer_head`), and
/// `page_unified` with its parameter as `{"page_unified": {"heads_per_group": N}}`.
///
/// With the feature `clap`, a `clap::ValueEnum` over the layouts without a parameter
/// ([`Self::ALL`]), taking the geometry-file names ([`Self::name`]: `layer_first`, ...) and, as
/// aliases, the dashed spellings the CLI documented before (`layer-first`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum MemoryLayout {
    /// `[layer][page][...]` per buffer.
    LayerFirst,
    /// `[page][layer][...]` per buffer.
    PageFirst,
    /// `[page][buffer][layer][...]`: one contiguous run per page.
    PageFirstDirect,
    /// `[page][head][layer][token][head row]` per buffer (MHA; vLLM's `BHLNC` is this
    /// layout byte for byte).
    PageHead,
    /// `[page][head][token][layer][head row]` per buffer: SGLang's MHA `page_head` host layout
    /// (`mem_cache/pool_host/mha.py`: `(2, page_num, head_num, page_size, layer_num,
    /// head_dim)`); a head's page of one layer is one run a token, `layers` head rows apart.
    PageHeadToken,
    /// `[layer][head][page][token][head row]` per buffer: vLLM's `LHBNC`
    /// (`vllm/v1/kv_cache_layout.py`), heads outside the pages of a layer.
    LayerHead,
    /// `[page][head group][layer][buffer][token][group row]`, one region for the whole pool:
    /// SGLang's MHA `page_unified` host layout (`mem_cache/pool_host/page_unified.py`,
    /// `(page_num, head_group_num, layer_num, 2, page_size, heads_per_group, head_dim)` with
    /// the buffers `k`, `v`). A group row holds, section after section, `heads_per_group`
    /// heads' bytes of each section.
    PageUnified {
        /// Heads in one group (SGLang: `head_num // head_group_num`); at least 1, dividing
        /// every buffer's head count.
        heads_per_group: u64,
    },
}

impl MemoryLayout {
    /// Stable code hashed by the storage fingerprint (never renumber).
    pub const fn code(self) -> u8 {
        match self {
            MemoryLayout::LayerFirst => 1,
            MemoryLayout::PageFirst => 2,
            MemoryLayout::PageFirstDirect => 3,
            MemoryLayout::PageHead => 4,
            MemoryLayout::LayerHead => 5,
            MemoryLayout::PageUnified { .. } => 6,
            MemoryLayout::PageHeadToken => 7,
        }
    }

    /// Every memory layout without a parameter (`page_unified` takes `heads_per_group`).
    pub const ALL: [MemoryLayout; 6] = [
        MemoryLayout::LayerFirst,
        MemoryLayout::PageFirst,
        MemoryLayout::PageFirstDirect,
        MemoryLayout::PageHead,
        MemoryLayout::LayerHead,
        MemoryLayout::PageHeadToken,
    ];

    /// The geometry-file name (`page_unified` without its parameter).
    pub const fn name(self) -> &'static str {
        match self {
            MemoryLayout::LayerFirst => "layer_first",
            MemoryLayout::PageFirst => "page_first",
            MemoryLayout::PageFirstDirect => "page_first_direct",
            MemoryLayout::PageHead => "page_head",
            MemoryLayout::LayerHead => "layer_head",
            MemoryLayout::PageUnified { .. } => "page_unified",
            MemoryLayout::PageHeadToken => "page_head_token",
        }
    }

    /// Parses a geometry-file name of a layout without a parameter ([`Self::ALL`]);
    /// `page_unified` needs its `heads_per_group` and is `None` here.
    pub fn from_name(name: &str) -> Option<MemoryLayout> {
        MemoryLayout::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Whether a page of one layer is stored as several pieces (its heads, or head groups), each
    /// `[row][piece row]`, rather than as the page's own bytes: `page_head`, `layer_head`,
    /// `page_unified`. Such a layout stores no page padding.
    pub const fn splits_pages(self) -> bool {
        matches!(
            self,
            MemoryLayout::PageHead
                | MemoryLayout::LayerHead
                | MemoryLayout::PageUnified { .. }
                | MemoryLayout::PageHeadToken
        )
    }

    /// Whether the whole pool is one region ([`crate::POOL_REGION`]): `page_first_direct`,
    /// `page_unified`.
    pub const fn one_region(self) -> bool {
        matches!(
            self,
            MemoryLayout::PageFirstDirect | MemoryLayout::PageUnified { .. }
        )
    }
}

#[cfg(feature = "clap")]
impl clap::ValueEnum for MemoryLayout {
    fn value_variants<'a>() -> &'a [Self] {
        &MemoryLayout::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let dashed = match self {
            MemoryLayout::LayerFirst => "layer-first",
            MemoryLayout::PageFirst => "page-first",
            MemoryLayout::PageFirstDirect => "page-first-direct",
            MemoryLayout::PageHead => "page-head",
            MemoryLayout::LayerHead => "layer-head",
            MemoryLayout::PageHeadToken => "page-head-token",
            // Takes a parameter: not a command-line value (a geometry file gives it).
            MemoryLayout::PageUnified { .. } => return None,
        };
        Some(clap::builder::PossibleValue::new(self.name()).alias(dashed))
    }
}

/// The geometry-file name; `page_unified` with its parameter: `page_unified (2 heads per
/// group)`.
impl fmt::Display for MemoryLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryLayout::PageUnified { heads_per_group } => {
                write!(f, "page_unified ({heads_per_group} heads per group)")
            }
            _ => f.write_str(self.name()),
        }
    }
}

/// A pool: page size, page count, memory layout and buffers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolGeometry {
    /// Free text, never compared.
    pub name: String,
    /// Tokens per page (a buffer may override it: [`BufferGeometry::page_size_tokens`]).
    pub page_size_tokens: u64,
    /// Pages in the pool (capacity; not compared); for a `state` buffer, request slots.
    pub pages: u64,
    /// Placement of pages in memory (not compared).
    pub memory_layout: MemoryLayout,
    /// Component buffers.
    pub buffers: Vec<BufferGeometry>,
}

/// A geometry that breaks a rule: the field path (`buffers[1] (index_k).sections[0] (values).dtype`)
/// and what is wrong with it, with the values involved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct GeometryError {
    /// Path of the offending field.
    pub field: String,
    /// The rule broken and the values.
    pub problem: String,
}

impl GeometryError {
    /// An error on `field`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> GeometryError {
        GeometryError {
            field: field.into(),
            problem: problem.into(),
        }
    }
}

/// One contiguous piece of a page of one layer of one buffer: `len_bytes` bytes at
/// `page_offset_bytes` in the canonical page (the arrangement's byte order) sit at
/// `pool_offset_bytes` in the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Offset inside the canonical page of one layer.
    pub page_offset_bytes: u64,
    /// Offset in the pool's byte space.
    pub pool_offset_bytes: u64,
    /// Length in bytes.
    pub len_bytes: u64,
}

fn overflow(field: &str) -> GeometryError {
    GeometryError::new(field, "overflow computing pool byte offsets")
}

fn ck_mul(a: u64, b: u64, field: &str) -> Result<u64, GeometryError> {
    a.checked_mul(b).ok_or_else(|| overflow(field))
}

fn ck_add(a: u64, b: u64, field: &str) -> Result<u64, GeometryError> {
    a.checked_add(b).ok_or_else(|| overflow(field))
}

/// Path of buffer `b` for error messages: `buffers[1] (index_k)`.
pub fn buffer_path(index: usize, buffer: &BufferGeometry) -> String {
    format!("buffers[{index}] ({})", buffer.name())
}

/// Turns a [`LayoutError`] of buffer `b` into a [`GeometryError`] whose path names the section
/// (and the field inside it) the rule concerns.
pub fn layout_error(index: usize, buffer: &BufferGeometry, e: LayoutError) -> GeometryError {
    let b = buffer_path(index, buffer);
    let sections = buffer.layout.sections();
    let sec = |i: usize| match sections.get(i) {
        Some(s) => format!("{b}.sections[{i}] ({})", s.name()),
        None => format!("{b}.sections[{i}]"),
    };
    let field = match e {
        LayoutError::EmptyShape { section } | LayoutError::ZeroDim { section, .. } => {
            format!("{}.shape", sec(section))
        }
        LayoutError::SubByteCount { section, .. } | LayoutError::HeadRowSubByte { section } => {
            format!("{}.shape", sec(section))
        }
        LayoutError::ScaleTargetMissing { section, .. }
        | LayoutError::ScaleTargetIsScale { section, .. } => format!("{}.scales", sec(section)),
        LayoutError::ZeroBlock { section } | LayoutError::BlockDoesNotDivide { section, .. } => {
            format!("{}.block_elems", sec(section))
        }
        LayoutError::ScaleCount { section, .. } => format!("{}.shape", sec(section)),
        LayoutError::EmptyPlane { .. }
        | LayoutError::PlaneSectionMissing { .. }
        | LayoutError::PlaneSectionTwice { .. }
        | LayoutError::PlaneSectionUnplaced { .. } => format!("{b}.arrangement.planes"),
        LayoutError::ZeroAlign => format!("{b}.page_align_bytes"),
        LayoutError::StrideTooSmall { .. } | LayoutError::StrideNotAligned { .. } => {
            format!("{b}.page_stride_bytes")
        }
        LayoutError::NoSections => format!("{b}.sections"),
        LayoutError::ZeroPageSize => "page_size_tokens".to_string(),
        LayoutError::RatioDoesNotDivide { .. } => format!("{b}.compress_ratio"),
        LayoutError::Overflow { .. }
        | LayoutError::SectionIndex { .. }
        | LayoutError::TokenIndex { .. }
        | LayoutError::RunIndex { .. } => b,
    };
    GeometryError::new(field, e.to_string())
}

impl PoolGeometry {
    /// Checks every rule: page size and page count at least 1, at least one buffer, unique
    /// non-empty buffer names, at least one layer each, each token layout valid, page strides
    /// and the pool's total bytes computable without overflow, `page_head` only over buffers
    /// whose sections are all `[heads, ...]` with one head count (`layer_head` too), `page_unified`
    /// only over buffers of that kind with equal layer counts and head counts that
    /// `heads_per_group` (at least 1) divides.
    ///
    /// # Errors
    ///
    /// A [`GeometryError`] naming the field and its value for the first rule broken (the list
    /// above).
    pub fn validate(&self) -> Result<(), GeometryError> {
        if self.page_size_tokens == 0 {
            return Err(GeometryError::new(
                "page_size_tokens",
                "must be at least 1, got 0",
            ));
        }
        if self.pages == 0 {
            return Err(GeometryError::new("pages", "must be at least 1, got 0"));
        }
        if self.buffers.is_empty() {
            return Err(GeometryError::new(
                "buffers",
                "a pool needs at least one buffer",
            ));
        }
        let mut seen = std::collections::HashMap::with_capacity(self.buffers.len());
        for (i, b) in self.buffers.iter().enumerate() {
            if b.name().is_empty() {
                return Err(GeometryError::new(
                    format!("buffers[{i}].name"),
                    "must not be empty",
                ));
            }
            if let Some(j) = seen.insert(b.name(), i) {
                return Err(GeometryError::new(
                    format!("{}.name", buffer_path(i, b)),
                    format!("duplicate buffer name \"{}\" (also buffers[{j}])", b.name()),
                ));
            }
            if b.layers == 0 {
                return Err(GeometryError::new(
                    format!("{}.layers", buffer_path(i, b)),
                    "must be at least 1, got 0",
                ));
            }
            b.check_v2(i)?;
            b.layout
                .page_geometry_compressed(
                    b.effective_page_size_tokens(self.page_size_tokens),
                    b.compress_ratio,
                )
                .map_err(|e| layout_error(i, b, e))?;
            if self.memory_layout.splits_pages() {
                self.page_pieces(i)?;
            }
        }
        if let MemoryLayout::PageUnified { .. } = self.memory_layout {
            self.check_page_unified()?;
        }
        self.total_bytes()?;
        Ok(())
    }

    /// Whether some buffer has a token axis (is not `state`): only then does the pool's
    /// `page_size_tokens` describe any page, so only then is it compared and hashed at the
    /// pool and storage levels. Every v1 pool has one.
    pub const fn has_token_axis(&self) -> bool {
        let buffers = self.buffers.as_slice();
        let mut i = 0;
        while i < buffers.len() {
            if !matches!(buffers[i].attention, crate::buffer::Attention::State) {
                return true;
            }
            i += 1;
        }
        false
    }

    /// Sizes of a page of buffer `b` (at its effective page size: its own, the pool's, or one
    /// slot for a `state` buffer; `page_size_tokens / compress_ratio` rows).
    ///
    /// # Errors
    ///
    /// A [`GeometryError`] naming `buffers[b]` when `b` is out of range, the layout is invalid, the
    /// compress ratio does not divide the page size, or a size overflows.
    pub fn page_geometry(&self, b: usize) -> Result<PageGeometry, GeometryError> {
        let buf = self.buffer(b)?;
        buf.layout
            .page_geometry_compressed(self.buffer_page_size_tokens(b)?, buf.compress_ratio)
            .map_err(|e| layout_error(b, buf, e))
    }

    /// Rows in a page of buffer `b`: [`BufferGeometry::rows_per_page`] (its tokens per page
    /// when `compress_ratio` is 1). In-page indices of the layout arithmetic
    /// ([`crate::TokenLayout::offset_bytes`]) count these rows.
    ///
    /// # Errors
    ///
    /// As [`PoolGeometry::page_geometry`].
    pub fn buffer_page_rows(&self, b: usize) -> Result<u64, GeometryError> {
        Ok(self.page_geometry(b)?.rows_per_page)
    }

    /// Tokens per page of buffer `b`: [`BufferGeometry::effective_page_size_tokens`].
    ///
    /// # Errors
    ///
    /// A [`GeometryError`] naming `b` when it is out of range.
    pub fn buffer_page_size_tokens(&self, b: usize) -> Result<u64, GeometryError> {
        Ok(self
            .buffer(b)?
            .effective_page_size_tokens(self.page_size_tokens))
    }

    /// Buffer `b`, or an error naming the index.
    ///
    /// # Errors
    ///
    /// A [`GeometryError`] naming `b` and the buffer count when `b` is out of range.
    pub fn buffer(&self, b: usize) -> Result<&BufferGeometry, GeometryError> {
        self.buffers.get(b).ok_or_else(|| {
            GeometryError::new(
                "buffers",
                format!(
                    "buffer index {b} out of range ({} buffers)",
                    self.buffers.len()
                ),
            )
        })
    }

    /// Index of the buffer named `name`.
    pub fn buffer_index(&self, name: &str) -> Option<usize> {
        self.buffers.iter().position(|b| b.name() == name)
    }

    /// Bytes per token of one layer, all buffers that have that layer (buffers hold layers
    /// `0..layers`).
    ///
    /// # Errors
    /// A buffer storing one row per several tokens (`compress_ratio` > 1) has no whole bytes
    /// per token: refused naming it ([`PoolGeometry::totals`] gives its share exactly); an
    /// invalid layout; overflow.
    pub fn bytes_per_token_all_layers(&self) -> Result<u64, GeometryError> {
        let mut total = 0u64;
        for (i, b) in self.buffers.iter().enumerate() {
            if b.compress_ratio != 1 {
                return Err(GeometryError::new(
                    format!("{}.compress_ratio", buffer_path(i, b)),
                    format!(
                        "one row per {} tokens has no whole bytes per token (totals() gives compressed_bytes_per_token)",
                        b.compress_ratio
                    ),
                ));
            }
            let per = b
                .layout
                .bytes_per_token()
                .map_err(|e| layout_error(i, b, e))?;
            total = ck_add(
                total,
                ck_mul(per, b.layers, "bytes per token")?,
                "bytes per token",
            )?;
        }
        Ok(total)
    }

    /// Bytes one layer of one page occupies in this pool's memory for buffer `b`: the page
    /// stride, or the payload under a layout that splits pages (`page_head`, `layer_head`,
    /// `page_unified`: no padding stored).
    ///
    /// # Errors
    ///
    /// As [`PoolGeometry::page_geometry`].
    pub fn stored_page_bytes(&self, b: usize) -> Result<u64, GeometryError> {
        let g = self.page_geometry(b)?;
        Ok(match self.memory_layout.splits_pages() {
            true => g.page_payload_bytes,
            false => g.page_stride_bytes,
        })
    }

    /// Bytes of buffer `b` over all its layers and all pages.
    ///
    /// # Errors
    ///
    /// As [`PoolGeometry::page_geometry`], plus a product over layers and pages that overflows 64
    /// bits.
    pub fn buffer_bytes(&self, b: usize) -> Result<u64, GeometryError> {
        let per = self.stored_page_bytes(b)?;
        let buf = self.buffer(b)?;
        per.checked_mul(buf.layers)
            .and_then(|x| x.checked_mul(self.pages))
            .ok_or_else(|| {
                GeometryError::new(
                    buffer_path(b, buf),
                    format!(
                        "overflow: {per} B per page x {} layers x {} pages does not fit in 64 bits",
                        buf.layers, self.pages
                    ),
                )
            })
    }

    /// Bytes of one page of every buffer and layer (`page_first_direct`'s page run).
    ///
    /// # Errors
    ///
    /// As [`PoolGeometry::page_geometry`] for any buffer, plus a sum that overflows 64 bits.
    pub fn page_group_bytes(&self) -> Result<u64, GeometryError> {
        let mut total = 0u64;
        for b in 0..self.buffers.len() {
            let per = ck_mul(
                self.stored_page_bytes(b)?,
                self.buffers[b].layers,
                "page group",
            )?;
            total = ck_add(total, per, "page group")?;
        }
        Ok(total)
    }

    /// Total bytes of the pool.
    ///
    /// # Errors
    ///
    /// As [`PoolGeometry::buffer_bytes`] for any buffer, plus a sum that overflows 64 bits.
    pub fn total_bytes(&self) -> Result<u64, GeometryError> {
        let mut total = 0u64;
        for b in 0..self.buffers.len() {
            let bytes = self.buffer_bytes(b)?;
            total = total.checked_add(bytes).ok_or_else(|| {
                GeometryError::new(
                    "buffers",
                    format!("overflow: the pool's total bytes do not fit in 64 bits (at buffers[{b}], {bytes} B)"),
                )
            })?;
        }
        Ok(total)
    }

    /// Start of buffer `b`: its region (`page_first_direct`: its offset inside a page run;
    /// `page_unified`: inside a (page, group, layer) cell).
    pub(crate) fn buffer_base_bytes(&self, b: usize) -> Result<u64, GeometryError> {
        let mut base = 0u64;
        for i in 0..b {
            let size = match self.memory_layout {
                MemoryLayout::PageFirstDirect => {
                    ck_mul(self.stored_page_bytes(i)?, self.buffers[i].layers, "base")?
                }
                MemoryLayout::PageUnified { .. } => self.piece_bytes(i)?,
                _ => self.buffer_bytes(i)?,
            };
            base = ck_add(base, size, "buffer base")?;
        }
        Ok(base)
    }

    fn check_index(
        &self,
        b: usize,
        layer: u64,
        page: u64,
    ) -> Result<&BufferGeometry, GeometryError> {
        let buf = self.buffer(b)?;
        // Every offset and offset + length inside the pool then fits in 64 bits.
        self.total_bytes()?;
        if layer >= buf.layers {
            return Err(GeometryError::new(
                format!("{}.layers", buffer_path(b, buf)),
                format!("layer {layer} out of range ({} layers)", buf.layers),
            ));
        }
        if page >= self.pages {
            return Err(GeometryError::new(
                "pages",
                format!("page {page} out of range ({} pages)", self.pages),
            ));
        }
        Ok(buf)
    }

    /// Byte offset of page `page` of layer `layer` of buffer `b`. Under a layout that splits
    /// pages (`page_head`, `page_head_token`, `layer_head`, `page_unified`) this is the start of piece 0 (head or
    /// group 0); use [`PoolGeometry::page_segments`] for the whole page.
    ///
    /// # Errors
    ///
    /// A [`GeometryError`] naming the index and its bound when `b`, `layer` or `page` is out of
    /// range; the errors of [`PoolGeometry::page_geometry`]; an offset that overflows 64 bits.
    pub fn page_offset_bytes(&self, b: usize, layer: u64, page: u64) -> Result<u64, GeometryError> {
        let buf = self.check_index(b, layer, page)?;
        let per = self.stored_page_bytes(b)?;
        let base = self.buffer_base_bytes(b)?;
        let f = "page offset";
        let slot = match self.memory_layout {
            MemoryLayout::LayerFirst => ck_add(ck_mul(layer, self.pages, f)?, page, f)?,
            MemoryLayout::PageFirst => ck_add(ck_mul(page, buf.layers, f)?, layer, f)?,
            MemoryLayout::PageFirstDirect => {
                let group = ck_mul(page, self.page_group_bytes()?, f)?;
                return ck_add(ck_add(group, base, f)?, ck_mul(layer, per, f)?, f);
            }
            MemoryLayout::PageHead => {
                let heads = self.page_head_heads(b)?;
                let chunk = per / heads;
                let slot = ck_mul(ck_mul(page, heads, f)?, buf.layers, f)?;
                return ck_add(base, ck_mul(ck_add(slot, layer, f)?, chunk, f)?, f);
            }
            MemoryLayout::PageHeadToken => {
                // (p * H + 0) * L * C + l * (head row), C = rows x head row
                let heads = self.page_head_heads(b)?;
                let chunk = per / heads;
                let head_row = chunk / self.buffer_page_rows(b)?.max(1);
                let slot = ck_mul(ck_mul(page, heads, f)?, buf.layers, f)?;
                let at = ck_add(ck_mul(slot, chunk, f)?, ck_mul(layer, head_row, f)?, f)?;
                return ck_add(base, at, f);
            }
            MemoryLayout::LayerHead => {
                // ((l * H + 0) * P + p) * C
                let heads = self.page_head_heads(b)?;
                let chunk = per / heads;
                let slot = ck_mul(ck_mul(layer, heads, f)?, self.pages, f)?;
                return ck_add(base, ck_mul(ck_add(slot, page, f)?, chunk, f)?, f);
            }
            MemoryLayout::PageUnified { .. } => {
                // p * (page run) + (group 0) + l * cell + (buffers before b in the cell)
                let group = ck_mul(page, self.page_group_bytes()?, f)?;
                let cell = ck_mul(layer, self.unified_cell_bytes()?, f)?;
                return ck_add(ck_add(group, cell, f)?, base, f);
            }
        };
        ck_add(base, ck_mul(slot, per, f)?, f)
    }

    /// Head count shared by every section of buffer `b`, required by the layouts that split
    /// pages (`page_head`, `page_head_token`, `layer_head`, `page_unified`).
    ///
    /// # Errors
    ///
    /// A [`GeometryError`] naming `b` when it is out of range; naming `memory_layout` when a
    /// section is not `[heads, ...]` with the head count of the others or splits into partial
    /// bytes per head.
    pub fn page_head_heads(&self, b: usize) -> Result<u64, GeometryError> {
        let buf = self.buffer(b)?;
        let sections = buf.layout.sections();
        let heads = sections.first().map(|s| s.heads()).unwrap_or(1);
        for (i, s) in sections.iter().enumerate() {
            if s.shape().len() < 2 || s.heads() != heads || heads == 0 {
                return Err(GeometryError::new(
                    "memory_layout",
                    format!(
                        "{} needs every section of {} shaped [heads, ...] with one head count \
                         of at least 1; sections[{i}] ({}) has shape {:?}",
                        self.memory_layout.name(),
                        buffer_path(b, buf),
                        s.name(),
                        s.shape()
                    ),
                ));
            }
            let bytes = s.bytes(i).map_err(|e| layout_error(b, buf, e))?;
            if bytes % heads != 0 {
                return Err(GeometryError::new(
                    "memory_layout",
                    format!(
                        "{}: sections[{i}] ({}) splits into partial bytes per head",
                        self.memory_layout.name(),
                        s.name()
                    ),
                ));
            }
        }
        Ok(heads)
    }

    /// Pieces a page of one layer of buffer `b` is stored in, and heads per piece: `(heads, 1)`
    /// under `page_head` and `layer_head`, `(heads / heads_per_group, heads_per_group)` under
    /// `page_unified`, `(1, 1)` under the layouts that store a page whole.
    ///
    /// # Errors
    ///
    /// As [`PoolGeometry::page_head_heads`]; under `page_unified` a `heads_per_group` of 0 or one
    /// that does not divide the buffer's head count, naming both.
    pub fn page_pieces(&self, b: usize) -> Result<(u64, u64), GeometryError> {
        match self.memory_layout {
            MemoryLayout::PageHead | MemoryLayout::LayerHead | MemoryLayout::PageHeadToken => {
                Ok((self.page_head_heads(b)?, 1))
            }
            MemoryLayout::PageUnified { heads_per_group } => {
                let heads = self.page_head_heads(b)?;
                let field = "memory_layout.page_unified.heads_per_group";
                if heads_per_group == 0 {
                    return Err(GeometryError::new(field, "must be at least 1, got 0"));
                }
                if !heads.is_multiple_of(heads_per_group) {
                    return Err(GeometryError::new(
                        field,
                        format!(
                            "{heads_per_group} does not divide the {heads} heads of {}",
                            buffer_path(b, self.buffer(b)?)
                        ),
                    ));
                }
                Ok((heads / heads_per_group, heads_per_group))
            }
            _ => Ok((1, 1)),
        }
    }

    /// Bytes of one piece (head or group: [`PoolGeometry::page_pieces`]) of a page of one layer
    /// of buffer `b`: the stored page / pieces.
    ///
    /// # Errors
    ///
    /// As [`PoolGeometry::page_pieces`] and [`PoolGeometry::stored_page_bytes`].
    pub fn piece_bytes(&self, b: usize) -> Result<u64, GeometryError> {
        let (pieces, _) = self.page_pieces(b)?;
        Ok(self.stored_page_bytes(b)? / pieces)
    }

    /// `page_unified`: bytes of one (page, group, layer) cell, every buffer's piece one after
    /// another.
    fn unified_cell_bytes(&self) -> Result<u64, GeometryError> {
        let mut cell = 0u64;
        for b in 0..self.buffers.len() {
            cell = ck_add(cell, self.piece_bytes(b)?, "page_unified cell")?;
        }
        Ok(cell)
    }

    /// `page_unified`'s pool rules: every buffer has the layers and the group count of buffer 0
    /// (the layer and group axes are shared by all buffers).
    fn check_page_unified(&self) -> Result<(), GeometryError> {
        let Some(first) = self.buffers.first() else {
            return Ok(());
        };
        let (groups, _) = self.page_pieces(0)?;
        for (i, b) in self.buffers.iter().enumerate().skip(1) {
            if b.layers != first.layers {
                return Err(GeometryError::new(
                    format!("{}.layers", buffer_path(i, b)),
                    format!(
                        "page_unified shares the layer axis: {} layers, {} has {}",
                        b.layers,
                        buffer_path(0, first),
                        first.layers
                    ),
                ));
            }
            let (g, _) = self.page_pieces(i)?;
            if g != groups {
                return Err(GeometryError::new(
                    "memory_layout.page_unified.heads_per_group",
                    format!(
                        "page_unified shares the group axis: {} has {g} groups, {} has {groups}",
                        buffer_path(i, b),
                        buffer_path(0, first)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The contiguous pieces of page `page` of layer `layer` of buffer `b`: one piece of the
    /// page stride for every memory layout that stores a page whole; under `page_head`,
    /// `layer_head` and `page_unified` one per (head or group, row, section) run of the canonical
    /// page mapped to its place in `[piece][row][piece row]` (merged where both sides continue).
    ///
    /// Every offset is checked: a geometry whose byte offsets do not fit in 64 bits (say
    /// `layers = 2^61`, never validated) is an error naming the overflow, never a wrap.
    ///
    /// # Errors
    ///
    /// As [`PoolGeometry::page_offset_bytes`], plus the errors of [`PoolGeometry::page_pieces`]
    /// under a layout that splits pages.
    pub fn page_segments(
        &self,
        b: usize,
        layer: u64,
        page: u64,
    ) -> Result<Vec<Segment>, GeometryError> {
        let start = self.page_offset_bytes(b, layer, page)?;
        if !self.memory_layout.splits_pages() {
            return Ok(vec![Segment {
                page_offset_bytes: 0,
                pool_offset_bytes: start,
                len_bytes: self.stored_page_bytes(b)?,
            }]);
        }
        let buf = self.buffer(b)?;
        let layout = &buf.layout;
        let (pieces, per_piece) = self.page_pieces(b)?;
        let heads = pieces * per_piece;
        let t_count = self.buffer_page_rows(b)?;
        let chunk = self.piece_bytes(b)?; // rows x piece row, all sections
        let placement = self.placement(b)?;
        let step = placement.head_step_bytes;
        // Between rows of a piece: the piece row, or under page_head_token every layer's.
        let piece_row = placement.run_step_bytes;
        let err = |e| layout_error(b, buf, e);
        let f = "page segments";
        // The last byte of the last piece must be addressable: checks every product below.
        let span = ck_mul(piece_row, t_count, f)?.max(chunk);
        ck_add(ck_add(start, ck_mul(pieces - 1, step, f)?, f)?, span, f)?;
        let mut out: Vec<Segment> = Vec::new();
        for g in 0..pieces {
            let piece_base = ck_add(start, ck_mul(g, step, f)?, f)?;
            for t in 0..t_count {
                let mut prefix = 0u64;
                for s in 0..layout.sections().len() {
                    let part = layout.section_bytes(s).map_err(err)? / heads;
                    for h in g * per_piece..(g + 1) * per_piece {
                        let page_off = match layout.arrangement {
                            Arrangement::HeadMajor => {
                                layout.offset_bytes(s, t, h, t_count).map_err(err)?
                            }
                            _ => ck_add(
                                layout.offset_bytes(s, t, 0, t_count).map_err(err)?,
                                ck_mul(h, part, f)?,
                                f,
                            )?,
                        };
                        let pool_off =
                            ck_add(ck_add(piece_base, ck_mul(t, piece_row, f)?, f)?, prefix, f)?;
                        let seg = Segment {
                            page_offset_bytes: page_off,
                            pool_offset_bytes: pool_off,
                            len_bytes: part,
                        };
                        prefix = ck_add(prefix, part, f)?;
                        match out.last_mut() {
                            Some(last)
                                if last.page_offset_bytes.checked_add(last.len_bytes)
                                    == Some(seg.page_offset_bytes)
                                    && last.pool_offset_bytes.checked_add(last.len_bytes)
                                        == Some(seg.pool_offset_bytes) =>
                            {
                                last.len_bytes = ck_add(last.len_bytes, seg.len_bytes, f)?
                            }
                            _ => out.push(seg),
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}
