//! The checked description of a copy: which bytes of an item move, and where every item of every
//! layer sits on each side.
//!
//! Item `idx` of layer `layer` on a side starts at
//!
//! ```text
//! base_bytes + layer * layer_stride_bytes
//!            + (idx / items_per_page) * page_stride_bytes
//!            + (idx % items_per_page) * item_stride_bytes
//! ```
//!
//! and is `item_bytes` long. With items of a page (items_per_page = 1) or of a token
//! (items_per_page = page size), this covers SGLang HiCache's host layouts against the
//! layer-first device pool (`L` layers, `P` pages, page stride `S`):
//! - `layer_first` `[layer][page]`: `layer_stride = P * S`, `page_stride = S`;
//! - `page_first` `[page][layer]`: `layer_stride = S`, `page_stride = L * S`;
//! - `page_first_direct` `[page][buffer][layer]`: `layer_stride = S`, `page_stride` = the page
//!   group of all buffers, `base` = the buffer's offset inside the group.
//!
//! `page_head` is not affine in (layer, page) and is refused ([`KernelError::Unsupported`]).
//! Build specs from pool geometries with [`CopySpec::for_pool_buffer`] rather than by hand: the
//! strides are then read off [`PoolGeometry::page_offset_bytes`], never recomputed.

use std::ops::Range;

use kvlayout_core::{Arrangement, MemoryLayout, PoolGeometry, compare};

use crate::error::{KernelError, Side};

/// Where the items of one side of a copy sit. All fields in bytes except `layers`, `pages`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SideSpec {
    /// Offset of item 0 of page 0 of layer 0 in the side's buffer.
    pub base_bytes: u64,
    /// Distance between the same item of consecutive layers.
    pub layer_stride_bytes: u64,
    /// Distance between the first items of consecutive pages of one layer.
    pub page_stride_bytes: u64,
    /// Distance between consecutive items of one page (ignored when `items_per_page` is 1).
    pub item_stride_bytes: u64,
    /// Layers the side holds (`layers` of [`CopySpec`] must lie inside `0..layers`).
    pub layers: u64,
    /// Pages the side holds: indices run over `0..pages * items_per_page`.
    pub pages: u64,
    /// Bytes of the side's buffer the description may touch (every item of every layer and
    /// page lies inside `0..total_bytes`).
    pub total_bytes: u64,
}

/// One copy: `item_bytes` from each source item to the matching destination item, for every
/// layer in `layers`, for every position of the index lists.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CopySpec {
    /// Bytes of one item (a token row of one layer: 132, 256, 656, 1152 B; or a whole page of
    /// one layer: 8448, 41984 B; or one section of a token in a `section_major` page).
    pub item_bytes: u64,
    /// Items per page (1 for page-granular copies, the page size for token-granular ones).
    pub items_per_page: u64,
    /// Layers copied.
    pub layers: Range<u64>,
    /// The side read.
    pub src: SideSpec,
    /// The side written.
    pub dst: SideSpec,
}

/// What one item of a copy planned from pool geometries is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// One token of one layer (one spec per contiguous part of the token's entry: one for
    /// `token_major`, one per section for `section_major`).
    Token,
    /// One page of one layer (the stored page bytes, padding included).
    Page,
}

fn mul(a: u64, b: u64, field: &str) -> Result<u64, KernelError> {
    a.checked_mul(b)
        .ok_or_else(|| KernelError::spec(field, format!("overflow: {a} * {b}")))
}

fn add(a: u64, b: u64, field: &str) -> Result<u64, KernelError> {
    a.checked_add(b)
        .ok_or_else(|| KernelError::spec(field, format!("overflow: {a} + {b}")))
}

impl SideSpec {
    /// One past the last byte any item of any layer and page of this side can touch.
    pub fn end_bytes(&self, item_bytes: u64, items_per_page: u64) -> Result<u64, KernelError> {
        let f = "end of the last item";
        let mut end = self.base_bytes;
        end = add(
            end,
            mul(self.layers.saturating_sub(1), self.layer_stride_bytes, f)?,
            f,
        )?;
        end = add(
            end,
            mul(self.pages.saturating_sub(1), self.page_stride_bytes, f)?,
            f,
        )?;
        end = add(
            end,
            mul(items_per_page.saturating_sub(1), self.item_stride_bytes, f)?,
            f,
        )?;
        add(end, item_bytes, f)
    }
}

impl CopySpec {
    /// The side `side`.
    pub fn side(&self, side: Side) -> &SideSpec {
        match side {
            Side::Src => &self.src,
            Side::Dst => &self.dst,
        }
    }

    /// Checks every rule: `item_bytes`, `items_per_page`, each side's `layers` and `pages` at
    /// least 1; a non-empty layer range inside both sides' layers; items of one page not
    /// overlapping (`item_stride_bytes >= item_bytes` when a page has several items); every
    /// item of every layer and page inside `total_bytes`, computed without overflow.
    pub fn validate(&self) -> Result<(), KernelError> {
        if self.item_bytes == 0 {
            return Err(KernelError::spec("item_bytes", "must be at least 1, got 0"));
        }
        if self.items_per_page == 0 {
            return Err(KernelError::spec(
                "items_per_page",
                "must be at least 1, got 0",
            ));
        }
        if self.layers.start >= self.layers.end {
            return Err(KernelError::spec(
                "layers",
                format!(
                    "empty layer range {}..{}",
                    self.layers.start, self.layers.end
                ),
            ));
        }
        for side in [Side::Src, Side::Dst] {
            let s = self.side(side);
            if s.layers == 0 {
                return Err(KernelError::spec(
                    format!("{side}.layers"),
                    "must be at least 1, got 0",
                ));
            }
            if s.pages == 0 {
                return Err(KernelError::spec(
                    format!("{side}.pages"),
                    "must be at least 1, got 0",
                ));
            }
            if self.layers.end > s.layers {
                return Err(KernelError::spec(
                    "layers",
                    format!(
                        "layer range {}..{} exceeds {side}.layers {}",
                        self.layers.start, self.layers.end, s.layers
                    ),
                ));
            }
            if self.items_per_page > 1 && s.item_stride_bytes < self.item_bytes {
                return Err(KernelError::spec(
                    format!("{side}.item_stride_bytes"),
                    format!(
                        "{} is smaller than item_bytes {}: items of one page would overlap",
                        s.item_stride_bytes, self.item_bytes
                    ),
                ));
            }
            let end = s.end_bytes(self.item_bytes, self.items_per_page)?;
            if end > s.total_bytes {
                return Err(KernelError::spec(
                    format!("{side}.total_bytes"),
                    format!(
                        "the last item ends at byte {end}, past total_bytes {}",
                        s.total_bytes
                    ),
                ));
            }
            self.index_limit(side)?;
        }
        Ok(())
    }

    /// Indices valid on `side`: `pages * items_per_page`.
    pub fn index_limit(&self, side: Side) -> Result<u64, KernelError> {
        mul(
            self.side(side).pages,
            self.items_per_page,
            &format!("{side}.pages"),
        )
    }

    /// Layers copied.
    pub fn layer_count(&self) -> u64 {
        self.layers.end.saturating_sub(self.layers.start)
    }

    /// Offset of item `index` of layer `layer` on `side` (checked: the layer and index must be
    /// in range).
    pub fn offset_bytes(&self, side: Side, layer: u64, index: u64) -> Result<u64, KernelError> {
        let s = self.side(side);
        if layer >= s.layers {
            return Err(KernelError::spec(
                format!("{side}.layers"),
                format!("layer {layer} out of range ({} layers)", s.layers),
            ));
        }
        let limit = self.index_limit(side)?;
        if index >= limit {
            return Err(KernelError::spec(
                format!("{side}.pages"),
                format!("index {index} out of range ({limit} items)"),
            ));
        }
        let f = "item offset";
        let mut off = add(s.base_bytes, mul(layer, s.layer_stride_bytes, f)?, f)?;
        off = add(
            off,
            mul(index / self.items_per_page, s.page_stride_bytes, f)?,
            f,
        )?;
        add(
            off,
            mul(index % self.items_per_page, s.item_stride_bytes, f)?,
            f,
        )
    }

    /// Bytes moved by a copy of `items` index positions (every layer of the range).
    pub fn bytes_moved(&self, items: u64) -> Result<u64, KernelError> {
        mul(
            mul(items, self.item_bytes, "bytes moved")?,
            self.layer_count(),
            "bytes moved",
        )
    }

    /// The widest access (16, 8, 4, 2 or 1 bytes) that divides the item size, every base,
    /// stride, and the two buffers' start addresses (`src_addr`, `dst_addr`).
    pub fn vector_bytes(&self, src_addr: u64, dst_addr: u64) -> u64 {
        let mut all = self.item_bytes | src_addr | dst_addr;
        for s in [&self.src, &self.dst] {
            all |= s.base_bytes | s.layer_stride_bytes | s.page_stride_bytes;
            if self.items_per_page > 1 {
                all |= s.item_stride_bytes;
            }
        }
        [16u64, 8, 4, 2, 1]
            .into_iter()
            .find(|w| all.is_multiple_of(*w))
            .unwrap_or(1)
    }

    /// Plans copies of buffer `buffer` (by index) between two pools, for the layer range
    /// `layers`: one spec for page granularity; for token granularity one spec per contiguous
    /// part of a token's entry (one for `token_major`, one per section for `section_major`,
    /// one per plane for planes), all driven by the same index lists.
    ///
    /// The pools must be compatible ([`kvlayout_core::compare`]); each side's base and strides
    /// are read off [`PoolGeometry::page_offset_bytes`] and checked to be affine in (layer,
    /// page). Refused: `page_head` memory layouts and token granularity of `head_major` pages
    /// (a token is not one run per section there).
    pub fn for_pool_buffer(
        src: &PoolGeometry,
        dst: &PoolGeometry,
        buffer: usize,
        granularity: Granularity,
        layers: Range<u64>,
    ) -> Result<Vec<CopySpec>, KernelError> {
        src.validate()?;
        dst.validate()?;
        compare(src, dst)?;
        let buf = src.buffer(buffer)?;
        let page_size = src.page_size_tokens;
        // (offset inside the page, bytes, stride between tokens) of each contiguous part.
        let parts: Vec<(u64, u64, u64)> = match granularity {
            Granularity::Page => vec![(0, src.stored_page_bytes(buffer)?, 0)],
            Granularity::Token => {
                if buf.layout.arrangement == Arrangement::HeadMajor {
                    return Err(KernelError::Unsupported(format!(
                        "token-granular copy of head_major buffer {}: a token is one run per \
                         head; copy pages instead",
                        buf.name()
                    )));
                }
                let lay = &buf.layout;
                let le = |e| KernelError::Geometry(format!("buffer {}: {e}", buf.name()));
                let mut parts: Vec<(u64, u64, u64)> = Vec::new();
                for s in 0..lay.sections().len() {
                    let off = lay.offset_bytes(s, 0, 0, page_size).map_err(le)?;
                    let bytes = lay.section_bytes(s).map_err(le)?;
                    let stride = if page_size > 1 {
                        lay.offset_bytes(s, 1, 0, page_size).map_err(le)? - off
                    } else {
                        bytes
                    };
                    match parts.last_mut() {
                        Some(last) if last.0 + last.1 == off && last.2 == stride => last.1 += bytes,
                        _ => parts.push((off, bytes, stride)),
                    }
                }
                parts
            }
        };
        let items_per_page = match granularity {
            Granularity::Page => 1,
            Granularity::Token => page_size,
        };
        parts
            .into_iter()
            .map(|(off, bytes, stride)| {
                let spec = CopySpec {
                    item_bytes: bytes,
                    items_per_page,
                    layers: layers.clone(),
                    src: side_of_pool(src, buffer, off, stride)?,
                    dst: side_of_pool(dst, buffer, off, stride)?,
                };
                spec.validate()?;
                Ok(spec)
            })
            .collect()
    }
}

/// The side description of buffer `b` of `pool`, for the part at `part_offset_bytes` inside a
/// page with `item_stride_bytes` between tokens.
fn side_of_pool(
    pool: &PoolGeometry,
    b: usize,
    part_offset_bytes: u64,
    item_stride_bytes: u64,
) -> Result<SideSpec, KernelError> {
    if pool.memory_layout == MemoryLayout::PageHead {
        return Err(KernelError::Unsupported(
            "page_head memory layout: a page of one layer is one run per head, not affine in \
             (layer, page); use PoolGeometry::page_segments"
                .to_string(),
        ));
    }
    let layers = pool.buffer(b)?.layers;
    let pages = pool.pages;
    let origin = pool.page_offset_bytes(b, 0, 0)?;
    let layer_stride_bytes = if layers > 1 {
        pool.page_offset_bytes(b, 1, 0)? - origin
    } else {
        0
    };
    let page_stride_bytes = if pages > 1 {
        pool.page_offset_bytes(b, 0, 1)? - origin
    } else {
        0
    };
    // The far corner must sit where the strides put it (the layout is affine).
    let f = "pool corner";
    let predicted = add(
        add(origin, mul(layers - 1, layer_stride_bytes, f)?, f)?,
        mul(pages - 1, page_stride_bytes, f)?,
        f,
    )?;
    let corner = pool.page_offset_bytes(b, layers - 1, pages - 1)?;
    if corner != predicted {
        return Err(KernelError::Unsupported(format!(
            "{} memory layout of buffer {b} is not affine in (layer, page): corner at {corner}, \
             strides predict {predicted}",
            pool.memory_layout
        )));
    }
    Ok(SideSpec {
        base_bytes: add(origin, part_offset_bytes, "base_bytes")?,
        layer_stride_bytes,
        page_stride_bytes,
        item_stride_bytes,
        layers,
        pages,
        total_bytes: pool.total_bytes()?,
    })
}
