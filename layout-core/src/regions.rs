//! Regions: the contiguous pieces of memory a pool occupies, and where each buffer's pages sit
//! inside them (its [`Placement`]).
//!
//! A transfer engine registers regions (a NIXL memory descriptor, a Mooncake segment) and
//! addresses bytes as (region, offset). The memory layouts of [`crate::geometry`] give, with
//! `L` layers, `P` pages, page stride `S` and `H` heads of buffer `b`:
//! - `layer_first`: one region per buffer, `L * P * S` bytes; page `p` of layer `l` at
//!   `(l * P + p) * S`;
//! - `page_first`: one region per buffer; page `p` of layer `l` at `(p * L + l) * S`;
//! - `page_first_direct`: one region for the whole pool, named [`POOL_REGION`], a run of
//!   `G` = (sum over buffers of `L_b * S_b`) bytes per page; page `p` of layer `l` of buffer `b`
//!   at `p * G + (sum over buffers before b of L * S) + l * S`;
//! - `page_head`: one region per buffer of `[page][head][layer][token][head row]`, no padding:
//!   with the page payload `T * bytes_per_token` cut into `H` chunks `C` = payload / H, head
//!   `h` of page `p` of layer `l` at `((p * H + h) * L + l) * C`;
//! - `page_head_token`: one region per buffer of `[page][head][token][layer][head row]`: row
//!   `t` of head `h` of page `p` of layer `l` at `((p * H + h) * T + t) * L * R + l * R`, head row
//!   `R` = C / T;
//! - `layer_head`: one region per buffer of `[layer][head][page][token][head row]`: head `h` of
//!   page `p` of layer `l` at `((l * H + h) * P + p) * C`;
//! - `page_unified`: one region for the whole pool ([`POOL_REGION`]) of `[page][group][layer]
//!   [buffer][token][group row]`, `G = H / heads_per_group` groups; with `C_b` = buffer `b`'s
//!   payload / G and the cell `K` = sum over buffers of `C_b`, group `g` of page `p` of layer
//!   `l` of buffer `b` at `((p * G + g) * L + l) * K + (sum over buffers before b of C)`.
//!
//! Every offset is `offset_bytes + p * page_step_bytes + l * layer_step_bytes + h *
//! head_step_bytes`, which [`Placement`] states once; the pool's byte space
//! ([`PoolGeometry::page_offset_bytes`]) is the regions one after another.

use crate::geometry::{GeometryError, MemoryLayout, PoolGeometry, buffer_path};

/// Name of the one region of a `page_first_direct` pool (its buffers share each page's run).
pub const POOL_REGION: &str = "pool";

/// One contiguous piece of memory of a pool.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer's name, or [`POOL_REGION`] under `page_first_direct`.
    pub name: String,
    /// Where the region starts in the pool's byte space (the regions one after another).
    pub pool_offset_bytes: u64,
    /// Bytes of the region.
    pub len_bytes: u64,
    /// Indices of the buffers it holds, in buffer order.
    pub buffers: Vec<usize>,
}

/// Where the pages of one buffer sit inside its region: head `h` of page `p` of layer `l`
/// starts at `offset_bytes + p * page_step_bytes + l * layer_step_bytes + h * head_step_bytes`
/// and is `run_bytes` long (`heads` is 1 except under `page_head` and `layer_head`, where it is
/// the heads, and `page_unified`, where it is the head groups).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Placement {
    /// Index of the region (in [`PoolGeometry::regions`]) holding the buffer.
    pub region: usize,
    /// Start of page 0 of layer 0 inside the region.
    pub offset_bytes: u64,
    /// Distance between page `p` and page `p + 1` of one layer.
    pub page_step_bytes: u64,
    /// Distance between layer `l` and layer `l + 1` of one page.
    pub layer_step_bytes: u64,
    /// Distance between piece `h` and piece `h + 1` of one page of one layer (a head under
    /// `page_head` / `layer_head`, a head group under `page_unified`), else 0.
    pub head_step_bytes: u64,
    /// Contiguous pieces one page of one layer is stored in: its heads under `page_head` and
    /// `layer_head`, its head groups under `page_unified`, else 1.
    pub heads: u64,
    /// Bytes of one run of a piece: the page stride, or under a layout that splits pages the
    /// payload / `heads` (one run a piece), or under `page_head_token` one head row (`runs`
    /// runs a piece, one a token).
    pub run_bytes: u64,
    /// Runs one piece is stored in: 1, or under `page_head_token` the page's rows.
    pub runs: u64,
    /// Distance between run `r` and run `r + 1` of one piece (`page_head_token`: `layers` head
    /// rows); where `runs` is 1, the piece's rows are `run_bytes / rows` apart, which this
    /// holds too (the row step inside a piece).
    pub run_step_bytes: u64,
    /// Layers of the buffer.
    pub layers: u64,
    /// Pages of the pool.
    pub pages: u64,
}

impl Placement {
    /// Offset inside the region of piece `head` (0 unless the layout splits pages) of page `page` of layer
    /// `layer`.
    ///
    /// # Errors
    /// A layer, page or head out of range, naming it and the count; an offset past 64 bits.
    pub fn offset(&self, layer: u64, page: u64, head: u64) -> Result<u64, GeometryError> {
        for (what, value, count) in [
            ("layer", layer, self.layers),
            ("page", page, self.pages),
            ("head", head, self.heads),
        ] {
            if value >= count {
                return Err(GeometryError::new(
                    format!("{what}s"),
                    format!("{what} {value} out of range ({count} {what}s)"),
                ));
            }
        }
        self.offset_unchecked_range(layer, page, head)
    }

    /// [`Placement::offset`] without the range checks (the planner checked them once).
    #[inline]
    pub(crate) fn offset_unchecked_range(
        &self,
        layer: u64,
        page: u64,
        head: u64,
    ) -> Result<u64, GeometryError> {
        let sum = page
            .checked_mul(self.page_step_bytes)
            .and_then(|x| x.checked_add(layer.checked_mul(self.layer_step_bytes)?))
            .and_then(|x| x.checked_add(head.checked_mul(self.head_step_bytes)?))
            .and_then(|x| x.checked_add(self.offset_bytes));
        sum.ok_or_else(|| {
            GeometryError::new(
                "region offset",
                format!("overflow: layer {layer}, page {page}, head {head} past 64 bits"),
            )
        })
    }
}

fn ck_mul(a: u64, b: u64, field: &str) -> Result<u64, GeometryError> {
    a.checked_mul(b)
        .ok_or_else(|| GeometryError::new(field, format!("overflow: {a} x {b} past 64 bits")))
}

fn ck_add(a: u64, b: u64, field: &str) -> Result<u64, GeometryError> {
    a.checked_add(b)
        .ok_or_else(|| GeometryError::new(field, format!("overflow: {a} + {b} past 64 bits")))
}

impl PoolGeometry {
    /// The regions of the pool, in buffer order: one per buffer, or one ([`POOL_REGION`]) for
    /// the whole pool under `page_first_direct` and `page_unified`.
    ///
    /// # Errors
    /// A size past 64 bits, naming the buffer (see [`PoolGeometry::total_bytes`]).
    pub fn regions(&self) -> Result<Vec<Region>, GeometryError> {
        let total = self.total_bytes()?;
        if self.memory_layout.one_region() {
            return Ok(vec![Region {
                name: POOL_REGION.to_string(),
                pool_offset_bytes: 0,
                len_bytes: total,
                buffers: (0..self.buffers.len()).collect(),
            }]);
        }
        let mut out = Vec::with_capacity(self.buffers.len());
        let mut start = 0u64;
        for (b, buf) in self.buffers.iter().enumerate() {
            let len = self.buffer_bytes(b)?;
            out.push(Region {
                name: buf.name().to_string(),
                pool_offset_bytes: start,
                len_bytes: len,
                buffers: vec![b],
            });
            start = ck_add(start, len, "regions")?;
        }
        Ok(out)
    }

    /// Where the pages of buffer `b` sit inside its region.
    ///
    /// # Errors
    /// `b` out of range; a layout that breaks a rule (`page_head` over a buffer without one
    /// head count); a size past 64 bits.
    pub fn placement(&self, b: usize) -> Result<Placement, GeometryError> {
        let buf = self.buffer(b)?;
        // Every offset inside the pool then fits in 64 bits.
        self.total_bytes()?;
        let per = self.stored_page_bytes(b)?;
        let layers = buf.layers;
        let f = buffer_path(b, buf);
        let mut p = Placement {
            region: b,
            offset_bytes: 0,
            page_step_bytes: per,
            layer_step_bytes: per,
            head_step_bytes: 0,
            heads: 1,
            run_bytes: per,
            runs: 1,
            run_step_bytes: 0,
            layers,
            pages: self.pages,
        };
        match self.memory_layout {
            MemoryLayout::LayerFirst => p.layer_step_bytes = ck_mul(self.pages, per, &f)?,
            MemoryLayout::PageFirst => p.page_step_bytes = ck_mul(layers, per, &f)?,
            MemoryLayout::PageFirstDirect => {
                p.region = 0;
                p.page_step_bytes = self.page_group_bytes()?;
                for i in 0..b {
                    let before = ck_mul(self.stored_page_bytes(i)?, self.buffers[i].layers, &f)?;
                    p.offset_bytes = ck_add(p.offset_bytes, before, &f)?;
                }
            }
            MemoryLayout::PageHead => {
                let heads = self.page_head_heads(b)?;
                let chunk = per / heads;
                p.heads = heads;
                p.run_bytes = chunk;
                p.layer_step_bytes = chunk;
                p.head_step_bytes = ck_mul(layers, chunk, &f)?;
                p.page_step_bytes = ck_mul(heads, p.head_step_bytes, &f)?;
            }
            MemoryLayout::PageHeadToken => {
                let heads = self.page_head_heads(b)?;
                let chunk = per / heads;
                let rows = self.buffer_page_rows(b)?.max(1);
                let head_row = chunk / rows;
                p.heads = heads;
                p.run_bytes = head_row;
                p.runs = rows;
                p.run_step_bytes = ck_mul(layers, head_row, &f)?;
                p.layer_step_bytes = head_row;
                p.head_step_bytes = ck_mul(layers, chunk, &f)?;
                p.page_step_bytes = ck_mul(heads, p.head_step_bytes, &f)?;
            }
            MemoryLayout::LayerHead => {
                let heads = self.page_head_heads(b)?;
                let chunk = per / heads;
                p.heads = heads;
                p.run_bytes = chunk;
                p.page_step_bytes = chunk;
                p.head_step_bytes = ck_mul(self.pages, chunk, &f)?;
                p.layer_step_bytes = ck_mul(heads, p.head_step_bytes, &f)?;
            }
            MemoryLayout::PageUnified { .. } => {
                let (groups, _) = self.page_pieces(b)?;
                let mut cell = 0u64;
                for i in 0..self.buffers.len() {
                    cell = ck_add(cell, self.piece_bytes(i)?, &f)?;
                }
                p.region = 0;
                p.heads = groups;
                p.run_bytes = self.piece_bytes(b)?;
                p.offset_bytes = self.buffer_base_bytes(b)?;
                p.layer_step_bytes = cell;
                p.head_step_bytes = ck_mul(layers, cell, &f)?;
                p.page_step_bytes = ck_mul(groups, p.head_step_bytes, &f)?;
            }
        }
        if p.runs == 1 {
            p.run_step_bytes = p.run_bytes / self.buffer_page_rows(b)?.max(1);
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arrangement, BufferGeometry, Dtype, Section, TokenLayout};

    /// Two buffers: `kv` 3 layers of 8 bf16 heads x 16 (256 B/token), `ik` 2 layers of 132 B
    /// tokens; 4-token pages, 5 pages.
    fn pool(memory_layout: MemoryLayout) -> PoolGeometry {
        let kv = TokenLayout {
            arrangement: Arrangement::TokenMajor,
            sections: vec![Section::owned("k", Dtype::Bf16, vec![8, 16])].into(),
            page_align_bytes: None,
            page_stride_bytes: None,
        };
        let ik = TokenLayout {
            arrangement: Arrangement::SectionMajor,
            sections: vec![
                Section::owned("values", Dtype::F8E4M3, vec![128]),
                Section::owned("scale", Dtype::F32, vec![1]).with_scale(0, 128),
            ]
            .into(),
            page_align_bytes: None,
            page_stride_bytes: None,
        };
        PoolGeometry {
            name: "t".into(),
            page_size_tokens: 4,
            pages: 5,
            memory_layout,
            buffers: vec![
                BufferGeometry::new("kv", 3, kv),
                BufferGeometry::new("ik", 2, ik),
            ],
        }
    }

    const KV_PAGE: u64 = 4 * 8 * 16 * 2; // 1024
    const IK_PAGE: u64 = 4 * (128 + 4); // 528

    #[test]
    fn layer_first_and_page_first_have_one_region_per_buffer() {
        let g = pool(MemoryLayout::LayerFirst);
        let r = g.regions().unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[1].name.as_str(), r[1].pool_offset_bytes, r[1].len_bytes),
            ("ik", 3 * 5 * KV_PAGE, 2 * 5 * IK_PAGE)
        );
        // layer_first: (l * P + p) * S
        assert_eq!(
            g.placement(0).unwrap().offset(2, 3, 0).unwrap(),
            (2 * 5 + 3) * KV_PAGE
        );
        // page_first: (p * L + l) * S
        let g = pool(MemoryLayout::PageFirst);
        assert_eq!(
            g.placement(1).unwrap().offset(1, 3, 0).unwrap(),
            (3 * 2 + 1) * IK_PAGE
        );
    }

    #[test]
    fn page_first_direct_is_one_region_of_page_groups() {
        let g = pool(MemoryLayout::PageFirstDirect);
        let r = g.regions().unwrap();
        assert_eq!(r.len(), 1);
        let group = 3 * KV_PAGE + 2 * IK_PAGE;
        assert_eq!(
            (r[0].name.as_str(), r[0].len_bytes),
            (POOL_REGION, 5 * group)
        );
        // page p of layer l of ik: p * G + (kv's 3 layers) + l * S
        let p = g.placement(1).unwrap();
        assert_eq!(p.region, 0);
        assert_eq!(
            p.offset(1, 3, 0).unwrap(),
            3 * group + 3 * KV_PAGE + IK_PAGE
        );
    }

    #[test]
    fn page_head_places_each_head_of_a_page() {
        let g = pool(MemoryLayout::PageHead);
        // kv alone qualifies for page_head; ik has one-entry shapes
        let g = PoolGeometry {
            buffers: vec![g.buffers[0].clone()],
            ..g
        };
        let p = g.placement(0).unwrap();
        let chunk = KV_PAGE / 8; // 4 tokens x 16 bf16
        // ((p * H + h) * L + l) * C
        assert_eq!(p.offset(2, 3, 5).unwrap(), ((3 * 8 + 5) * 3 + 2) * chunk);
        assert_eq!(p.run_bytes, chunk);
        assert_eq!(
            p.offset(0, 0, 8).unwrap_err().problem,
            "head 8 out of range (8 heads)"
        );
    }

    #[test]
    fn placements_agree_with_the_pool_byte_space() {
        for m in MemoryLayout::ALL {
            let mut g = pool(m);
            if m.splits_pages() {
                g.buffers.truncate(1);
            }
            let regions = g.regions().unwrap();
            for b in 0..g.buffers.len() {
                let p = g.placement(b).unwrap();
                let base = regions[p.region].pool_offset_bytes;
                for l in 0..g.buffers[b].layers {
                    for page in 0..g.pages {
                        assert_eq!(
                            base + p.offset(l, page, 0).unwrap(),
                            g.page_offset_bytes(b, l, page).unwrap(),
                            "{m} buffer {b} layer {l} page {page}"
                        );
                    }
                }
            }
        }
    }
}
