//! The compatibility check at a [`Level`]: can two pools exchange pages (or stored objects, or
//! tokens)?
//!
//! A mismatch lists every differing field, `buffer.field: A value, B value`. Sections are
//! compared by position (labels are never compared); when they differ, the lines align them by
//! name and scale relation ([`crate::align`]), so one inserted section is one line. A buffer
//! with a differing field also gets both sides' bytes per token and per page where they
//! differ, and a buffer on one side only prints its bytes per token and per page.

use std::collections::HashMap;
use std::fmt;

use crate::align::align;
use crate::buffer::{Attention, BufferGeometry, ShardSplit};
use crate::geometry::PoolGeometry;
use crate::layout::{Arrangement, TokenLayout};
use crate::level::Level;
use crate::section::{Section, cow_slice};

/// One differing field: its path and both sides' values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldDiff {
    /// `page_size_tokens`, `index_k.sections[0].dtype`, `kv.bytes_per_token`, ...
    pub field: String,
    /// Side A's value.
    pub a: String,
    /// Side B's value.
    pub b: String,
}

impl fmt::Display for FieldDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}, {}", self.field, self.a, self.b)
    }
}

/// Every difference between two incompatible geometries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The differing fields, in check order.
    pub diffs: Vec<FieldDiff>,
}

impl Mismatch {
    /// Whether a line names `field` exactly.
    pub fn names(&self, field: &str) -> bool {
        self.diffs.iter().any(|d| d.field == field)
    }

    /// The diff lines, `field: A, B` each.
    pub fn lines(&self) -> Vec<String> {
        self.diffs.iter().map(FieldDiff::to_string).collect()
    }
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.diffs.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Mismatch {}

/// How an arrangement is shown in a diff line; planes by section position and label.
pub fn arrangement_text(layout: &TokenLayout) -> String {
    match &layout.arrangement {
        Arrangement::Planes(planes) => {
            let groups: Vec<String> = planes
                .iter()
                .map(|p| {
                    let names: Vec<String> = cow_slice(p)
                        .iter()
                        .map(|&i| match layout.sections().get(i) {
                            Some(s) => format!("{i}:{}", s.name()),
                            None => i.to_string(),
                        })
                        .collect();
                    format!("[{}]", names.join(", "))
                })
                .collect();
            format!("planes [{}]", groups.join(", "))
        }
        other => other.name().to_string(),
    }
}

fn groups_text(groups: Option<&[u64]>) -> String {
    match groups {
        None => "none".to_string(),
        Some(g) => dims_text(g),
    }
}

fn dims_text(dims: &[u64]) -> String {
    let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

fn scale_text(layout: &TokenLayout, s: &Section) -> String {
    match s.scale {
        None => "none".to_string(),
        Some(rel) => {
            let target = layout
                .sections()
                .get(rel.target)
                .map(|t| t.name().to_string())
                .unwrap_or_default();
            format!(
                "scales sections[{}] ({target}) per {} elems",
                rel.target, rel.block_elems
            )
        }
    }
}

fn num<T: fmt::Display, E: fmt::Display>(r: Result<T, E>) -> String {
    match r {
        Ok(v) => v.to_string(),
        Err(e) => format!("invalid ({e})"),
    }
}

/// One side's bytes per token and per page of buffer `b`, for a buffer the other side lacks:
/// `present (2048 B/token, 32768 B/page of 16 tokens)`, or per slot for a `state` buffer.
pub fn buffer_summary(pool: &PoolGeometry, b: &BufferGeometry) -> String {
    let page = b.effective_page_size_tokens(pool.page_size_tokens);
    let rows = b.rows_per_page(pool.page_size_tokens);
    let per = row_text(b);
    match b.attention {
        Attention::State => format!(
            "present (state, {} B/slot, {} layers)",
            num(b.layout.bytes_per_token()),
            b.layers
        ),
        Attention::Full => format!(
            "present ({per}, {} B/page of {page} tokens, {} layers)",
            num(b.layout.page_stride_bytes(rows)),
            b.layers
        ),
        windowed => format!(
            "present ({windowed}, {per}, {} B/page of {page} tokens, {} layers)",
            num(b.layout.page_stride_bytes(rows)),
            b.layers
        ),
    }
}

/// A buffer's row: `132 B/token`, or `584 B per 4 tokens` when it stores one row per R
/// tokens (v3 `compress_ratio`).
fn row_text(b: &BufferGeometry) -> String {
    let per = num(b.layout.bytes_per_token());
    match b.compress_ratio {
        1 => format!("{per} B/token"),
        r => format!("{per} B per {r} tokens"),
    }
}

/// Compares two geometries at the `pool` level; `Ok(())` when pages can be exchanged.
///
/// # Errors
///
/// A [`Mismatch`] listing every field in which the geometries differ at the `pool` level, each with
/// both values.
pub fn compare(a: &PoolGeometry, b: &PoolGeometry) -> Result<(), Mismatch> {
    compare_at(a, b, Level::Pool)
}

/// Compares two geometries at `level` (see [`crate::level`]); `Ok(())` when compatible.
///
/// # Errors
///
/// A [`Mismatch`] listing every field in which the geometries differ at `level`, each with both
/// values.
pub fn compare_at(a: &PoolGeometry, b: &PoolGeometry, level: Level) -> Result<(), Mismatch> {
    let mut diffs = Vec::new();
    let mut push = |field: String, x: String, y: String| {
        if x != y {
            diffs.push(FieldDiff { field, a: x, b: y });
        }
    };
    // A pool of state buffers only (slots, no token axis) has no use for its page size.
    if level != Level::Token && (a.has_token_axis() || b.has_token_axis()) {
        push(
            "page_size_tokens".into(),
            a.page_size_tokens.to_string(),
            b.page_size_tokens.to_string(),
        );
    }
    if level == Level::Storage {
        push(
            "memory_layout".into(),
            a.memory_layout.to_string(),
            b.memory_layout.to_string(),
        );
    }
    let index = |g: &PoolGeometry| -> HashMap<String, usize> {
        g.buffers
            .iter()
            .enumerate()
            .map(|(i, x)| (x.name().to_string(), i))
            .collect()
    };
    let (ia, ib) = (index(a), index(b));
    for ba in &a.buffers {
        if !ib.contains_key(ba.name()) {
            push(
                ba.name().to_string(),
                buffer_summary(a, ba),
                "missing".into(),
            );
        }
    }
    for bb in &b.buffers {
        if !ia.contains_key(bb.name()) {
            push(
                bb.name().to_string(),
                "missing".into(),
                buffer_summary(b, bb),
            );
        }
    }
    for ba in &a.buffers {
        let Some(&j) = ib.get(ba.name()) else {
            continue;
        };
        let lines = compare_buffer(ba, &b.buffers[j], a, b, level);
        for d in lines {
            push(d.field, d.a, d.b);
        }
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(Mismatch { diffs })
    }
}

/// Collects the lines of one buffer pair.
struct Lines(Vec<FieldDiff>);

impl Lines {
    fn push(&mut self, field: String, a: String, b: String) {
        if a != b {
            self.0.push(FieldDiff { field, a, b });
        }
    }
}

fn shard_text(b: &BufferGeometry) -> String {
    match b.shard {
        None => "none".into(),
        Some(s) => s.to_string(),
    }
}

/// `heads_total` of a heads split, `None` for an unsharded or replicated buffer.
fn heads_split(b: &BufferGeometry) -> Option<u64> {
    b.shard.and_then(|s| match s.split {
        ShardSplit::Heads { heads_total } => Some(heads_total),
        ShardSplit::Replicated => None,
    })
}

fn compare_buffer(
    ba: &BufferGeometry,
    bb: &BufferGeometry,
    a: &PoolGeometry,
    b: &PoolGeometry,
    level: Level,
) -> Vec<FieldDiff> {
    let n = ba.name();
    let (la, lb) = (&ba.layout, &bb.layout);
    let (pa, pb) = (
        ba.effective_page_size_tokens(a.page_size_tokens),
        bb.effective_page_size_tokens(b.page_size_tokens),
    );
    let mut out = Lines(Vec::new());
    out.push(
        format!("{n}.layers"),
        ba.layers.to_string(),
        bb.layers.to_string(),
    );
    if let (Some(x), Some(y)) = (ba.layer_ids(), bb.layer_ids()) {
        out.push(format!("{n}.layer_ids"), format!("{x:?}"), format!("{y:?}"));
    }
    out.push(
        format!("{n}.attention"),
        ba.attention.to_string(),
        bb.attention.to_string(),
    );
    // Compared at every level: rows of R tokens glue only with rows of R tokens.
    out.push(
        format!("{n}.compress_ratio"),
        ba.compress_ratio.to_string(),
        bb.compress_ratio.to_string(),
    );
    let page_bound = |l: &TokenLayout| {
        matches!(
            l.arrangement,
            Arrangement::SectionMajor | Arrangement::Planes(_)
        )
    };
    // At pool and storage level the pool's page size has its own line; a buffer's own page
    // size gets one when either side overrides it. At token level only page-bound buffers care.
    let own_page = ba.page_size_tokens.is_some() || bb.page_size_tokens.is_some();
    let page_line = match level {
        Level::Token => page_bound(la) || page_bound(lb),
        Level::Pool | Level::Storage => own_page,
    };
    if page_line {
        out.push(
            format!("{n}.page_size_tokens"),
            pa.to_string(),
            pb.to_string(),
        );
    }
    // Per-head shapes on a heads split (both sides), else whole shapes.
    let per_head = level == Level::Token && heads_split(ba).is_some() && heads_split(bb).is_some();
    if level == Level::Token {
        let split = |x: &BufferGeometry| match heads_split(x) {
            Some(h) => format!("heads of {h}"),
            None => "whole".into(),
        };
        out.push(format!("{n}.shard.split"), split(ba), split(bb));
        held_heads(n, ba, bb, &mut out);
    } else {
        out.push(format!("{n}.shard"), shard_text(ba), shard_text(bb));
    }
    // Planes are compared by section position; their text also shows labels, which are not
    // compared, so compare structurally and only then print.
    if la.arrangement != lb.arrangement {
        out.0.push(FieldDiff {
            field: format!("{n}.arrangement"),
            a: arrangement_text(la),
            b: arrangement_text(lb),
        });
    }
    compare_sections(n, la, lb, per_head, &mut out);
    let (ra, rb) = (
        ba.rows_per_page(a.page_size_tokens),
        bb.rows_per_page(b.page_size_tokens),
    );
    if level != Level::Token {
        out.push(
            format!("{n}.page_stride_bytes"),
            num(la.page_stride_bytes(ra)),
            num(lb.page_stride_bytes(rb)),
        );
    }
    if !out.0.is_empty() {
        // A row per token on both sides: bare numbers (the v1/v2 lines); else each side's row
        // bytes and R (`132 B per 4 tokens, 132 B per token`).
        let compressed = ba.compress_ratio != 1 || bb.compress_ratio != 1;
        let per = |x: &BufferGeometry| {
            if compressed {
                match x.compress_ratio {
                    1 => format!("{} B per token", num(x.layout.bytes_per_token())),
                    _ => row_text(x),
                }
            } else {
                num(x.layout.bytes_per_token())
            }
        };
        out.push(format!("{n}.bytes_per_token"), per(ba), per(bb));
        out.push(
            format!("{n}.bytes_per_page"),
            num(la.page_payload_bytes(ra)),
            num(lb.page_payload_bytes(rb)),
        );
    }
    out.0
}

/// Token level, a heads split on both sides with heads replicated over ranks on at least one
/// (`heads_total < tp_size`): the heads each side holds must overlap, or the pair shares no
/// byte of this buffer (SGLang #23746 mapped rank -> head as `r % nkv`, not `r / replicas`).
/// Plain splits on both sides are left to the plan, as before: a transfer engine pulls each
/// head from whichever rank holds it.
fn held_heads(n: &str, ba: &BufferGeometry, bb: &BufferGeometry, out: &mut Lines) {
    let (Some(sa), Some(sb)) = (ba.shard, bb.shard) else {
        return;
    };
    if !(sa.replicated_heads() || sb.replicated_heads()) {
        return;
    }
    let (Some((la, ha)), Some((lb, hb))) = (sa.heads_held(), sb.heads_held()) else {
        return;
    };
    if la.max(lb) < ha.min(hb) {
        return;
    }
    let text = |s: crate::Shard, lo: u64, hi: u64| {
        let heads = if hi - lo == 1 {
            format!("head {lo}")
        } else {
            format!("heads [{lo}, {hi})")
        };
        format!(
            "{heads} of {} (tp_size {} rank {}, {} replicas)",
            s.heads_total().unwrap_or(0),
            s.tp_size,
            s.rank,
            s.replicas()
        )
    };
    out.0.push(FieldDiff {
        field: format!("{n}.shard.heads_held"),
        a: text(sa, la, ha),
        b: text(sb, lb, hb),
    });
}

/// The shape compared: whole, or without the head axis (`per_head`).
fn shape_of(s: &Section, per_head: bool) -> &[u64] {
    let shape = s.shape();
    if per_head && !shape.is_empty() {
        &shape[1..]
    } else {
        shape
    }
}

/// Sections equal by position: dtype, shape, scale relation (by index), order.
fn equal_by_position(sa: &[Section], sb: &[Section], per_head: bool) -> bool {
    sa.len() == sb.len()
        && sa.iter().zip(sb).all(|(x, y)| {
            x.dtype == y.dtype
                && shape_of(x, per_head) == shape_of(y, per_head)
                && x.scale == y.scale
                && x.order() == y.order()
                && x.split_groups() == y.split_groups()
        })
}

fn compare_sections(n: &str, la: &TokenLayout, lb: &TokenLayout, per_head: bool, out: &mut Lines) {
    let (sa, sb) = (la.sections(), lb.sections());
    if equal_by_position(sa, sb, per_head) {
        return;
    }
    let before = out.0.len();
    out.push(
        format!("{n}.sections.count"),
        sa.len().to_string(),
        sb.len().to_string(),
    );
    let pairs = align(sa, sb);
    // A's index -> B's index, to compare scale relations across an insertion.
    let b_of: HashMap<usize, usize> = pairs
        .iter()
        .filter_map(|p| match *p {
            (Some(i), Some(j)) => Some((i, j)),
            _ => None,
        })
        .collect();
    let describe =
        |s: &Section| format!("{} {} ({})", s.dtype.name(), dims_text(s.shape()), s.name());
    for pair in &pairs {
        let (i, j) = match *pair {
            (Some(i), Some(j)) => (i, j),
            (Some(i), None) => {
                out.push(
                    format!("{n}.sections[{i}]"),
                    describe(&sa[i]),
                    "missing".into(),
                );
                continue;
            }
            (None, Some(j)) => {
                out.push(
                    format!("{n}.sections[{j}]"),
                    "missing".into(),
                    describe(&sb[j]),
                );
                continue;
            }
            (None, None) => continue,
        };
        let (x, y) = (&sa[i], &sb[j]);
        let path = if i == j {
            format!("{n}.sections[{i}]")
        } else {
            format!("{n}.sections[{i}->{j}] ({})", x.name())
        };
        out.push(
            format!("{path}.dtype"),
            x.dtype.name().into(),
            y.dtype.name().into(),
        );
        let shape_field = if per_head { "head_shape" } else { "shape" };
        out.push(
            format!("{path}.{shape_field}"),
            dims_text(shape_of(x, per_head)),
            dims_text(shape_of(y, per_head)),
        );
        let scale_equal = match (x.scale, y.scale) {
            (None, None) => true,
            (Some(rx), Some(ry)) => {
                rx.block_elems == ry.block_elems && b_of.get(&rx.target) == Some(&ry.target)
            }
            _ => false,
        };
        if !scale_equal {
            out.0.push(FieldDiff {
                field: format!("{path}.scale"),
                a: scale_text(la, x),
                b: scale_text(lb, y),
            });
        }
        out.push(
            format!("{path}.order"),
            x.order().unwrap_or("linear").into(),
            y.order().unwrap_or("linear").into(),
        );
        out.push(
            format!("{path}.split_groups"),
            groups_text(x.split_groups()),
            groups_text(y.split_groups()),
        );
    }
    if out.0.len() == before {
        // Equal after alignment but not by position (only labels moved): say so.
        out.0.push(FieldDiff {
            field: format!("{n}.sections"),
            a: section_list(sa),
            b: section_list(sb),
        });
    }
    fn section_list(s: &[Section]) -> String {
        let v: Vec<String> = s
            .iter()
            .map(|x| format!("{} {}", x.dtype.name(), dims_text(x.shape())))
            .collect();
        v.join(" | ")
    }
}
