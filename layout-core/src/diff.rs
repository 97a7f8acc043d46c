//! The compatibility check: can two pools exchange pages?
//!
//! Compatible iff equal `page_size_tokens`, the same set of buffer names, and per buffer equal
//! `layers`, arrangement, page stride, and sections equal in order by dtype, shape and scale
//! relation. `name`, section labels, `pages` and `memory_layout` are not compared.
//! A mismatch lists every differing field, `buffer.field: A value, B value`, plus both sides'
//! bytes per token and per page where sizes differ.

use std::collections::HashMap;
use std::fmt;

use crate::buffer::BufferGeometry;
use crate::geometry::PoolGeometry;
use crate::layout::{Arrangement, TokenLayout};
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

fn shape_text(s: &Section) -> String {
    let dims: Vec<String> = s.shape().iter().map(u64::to_string).collect();
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

/// Compares two geometries; `Ok(())` when pages can be exchanged.
pub fn compare(a: &PoolGeometry, b: &PoolGeometry) -> Result<(), Mismatch> {
    let mut diffs = Vec::new();
    let mut push = |field: String, x: String, y: String| {
        if x != y {
            diffs.push(FieldDiff { field, a: x, b: y });
        }
    };
    push(
        "page_size_tokens".into(),
        a.page_size_tokens.to_string(),
        b.page_size_tokens.to_string(),
    );
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
            push(ba.name().to_string(), "present".into(), "missing".into());
        }
    }
    for bb in &b.buffers {
        if !ia.contains_key(bb.name()) {
            push(bb.name().to_string(), "missing".into(), "present".into());
        }
    }
    for ba in &a.buffers {
        let Some(&j) = ib.get(ba.name()) else {
            continue;
        };
        compare_buffer(ba, &b.buffers[j], a, b, &mut push);
    }
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(Mismatch { diffs })
    }
}

fn compare_buffer(
    ba: &BufferGeometry,
    bb: &BufferGeometry,
    a: &PoolGeometry,
    b: &PoolGeometry,
    push: &mut impl FnMut(String, String, String),
) {
    let n = ba.name();
    let (la, lb) = (&ba.layout, &bb.layout);
    push(
        format!("{n}.layers"),
        ba.layers.to_string(),
        bb.layers.to_string(),
    );
    // Planes are compared by section position; their text also shows labels, which are not
    // compared, so compare structurally and only then print.
    if la.arrangement != lb.arrangement {
        push(
            format!("{n}.arrangement"),
            arrangement_text(la),
            arrangement_text(lb),
        );
    }
    let (sa, sb) = (la.sections(), lb.sections());
    push(
        format!("{n}.sections.count"),
        sa.len().to_string(),
        sb.len().to_string(),
    );
    for (i, (x, y)) in sa.iter().zip(sb.iter()).enumerate() {
        push(
            format!("{n}.sections[{i}].dtype"),
            x.dtype.name().into(),
            y.dtype.name().into(),
        );
        push(
            format!("{n}.sections[{i}].shape"),
            shape_text(x),
            shape_text(y),
        );
        let (rx, ry) = (x.scale, y.scale);
        if rx != ry {
            push(
                format!("{n}.sections[{i}].scale"),
                scale_text(la, x),
                scale_text(lb, y),
            );
        }
    }
    let describe = |s: &Section| format!("{} {} ({})", s.dtype.name(), shape_text(s), s.name());
    for (i, s) in sa.iter().enumerate().skip(sb.len()) {
        push(format!("{n}.sections[{i}]"), describe(s), "missing".into());
    }
    for (i, s) in sb.iter().enumerate().skip(sa.len()) {
        push(format!("{n}.sections[{i}]"), "missing".into(), describe(s));
    }
    push(
        format!("{n}.page_stride_bytes"),
        num(la.page_stride_bytes(a.page_size_tokens)),
        num(lb.page_stride_bytes(b.page_size_tokens)),
    );
    push(
        format!("{n}.bytes_per_token"),
        num(la.bytes_per_token()),
        num(lb.bytes_per_token()),
    );
    push(
        format!("{n}.bytes_per_page"),
        num(la.page_payload_bytes(a.page_size_tokens)),
        num(lb.page_payload_bytes(b.page_size_tokens)),
    );
}
