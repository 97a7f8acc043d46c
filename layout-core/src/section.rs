//! Sections: the named parts of one token's entry in a buffer.

use std::borrow::Cow;

use crate::Dtype;
use crate::error::{LayoutError, mul, tri};

/// A scale relation: this section holds one scale per `block_elems` elements of section
/// `target` (an index into the same layout's sections).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScaleOf {
    /// Index of the scaled (value) section.
    pub target: usize,
    /// Elements of the scaled section covered by one scale.
    pub block_elems: u64,
}

/// One named part of a token's entry: a dtype and a per-token shape (e.g. `[heads, head_dim]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Section {
    /// Label (`values`, `scale`, `k`, `v`, `rope`); never compared between geometries.
    pub name: Cow<'static, str>,
    /// Element type.
    pub dtype: Dtype,
    /// Per-token shape, outermost first; every dimension at least 1.
    pub shape: Cow<'static, [u64]>,
    /// Present on a scale section.
    pub scale: Option<ScaleOf>,
    /// `kvlayout.geometry/v2`: a named non-linear order of this section's elements across the
    /// page (a swizzle of scale rows, say); `None` is linear. Compared as a name.
    pub order: Option<Cow<'static, str>>,
    /// `kvlayout.geometry/v3`: over the whole model, the leading axis is the concatenation of
    /// groups of `G1, G2, ...` entries (a gated-delta-net conv state: q, k, v channels; Mamba2:
    /// x, B, C), and tensor parallelism splits each group on its own: a rank of `N` holds
    /// `G1/N, G2/N, ...` entries, in group order. Only under a heads split, whose
    /// `heads_total` is then the sum of the groups. `None`: the axis is split as one block.
    pub split_groups: Option<Cow<'static, [u64]>>,
}

/// A `Cow` slice as a plain slice, in `const` context.
#[allow(clippy::ptr_arg)] // `Deref` is not const: the match is the point
pub(crate) const fn cow_slice<'a, T: Clone>(c: &'a Cow<'static, [T]>) -> &'a [T] {
    match c {
        Cow::Borrowed(b) => b,
        Cow::Owned(v) => v.as_slice(),
    }
}

/// A `Cow` str as `&str`, in `const` context.
#[allow(clippy::ptr_arg)] // as above
pub(crate) const fn cow_str<'a>(c: &'a Cow<'static, str>) -> &'a str {
    match c {
        Cow::Borrowed(b) => b,
        Cow::Owned(s) => s.as_str(),
    }
}

impl Section {
    /// A value section from static data (for descriptors and tests).
    pub const fn new(name: &'static str, dtype: Dtype, shape: &'static [u64]) -> Section {
        Section {
            name: Cow::Borrowed(name),
            dtype,
            shape: Cow::Borrowed(shape),
            scale: None,
            order: None,
            split_groups: None,
        }
    }

    /// A scale section: one scale per `block_elems` elements of section `target`.
    pub const fn scale_of(
        name: &'static str,
        dtype: Dtype,
        shape: &'static [u64],
        target: usize,
        block_elems: u64,
    ) -> Section {
        Section {
            name: Cow::Borrowed(name),
            dtype,
            shape: Cow::Borrowed(shape),
            scale: Some(ScaleOf {
                target,
                block_elems,
            }),
            order: None,
            split_groups: None,
        }
    }

    /// A section with owned data (what readers of files and configs build); no scale, no order.
    pub fn owned(name: impl Into<String>, dtype: Dtype, shape: Vec<u64>) -> Section {
        Section {
            name: Cow::Owned(name.into()),
            dtype,
            shape: Cow::Owned(shape),
            scale: None,
            order: None,
            split_groups: None,
        }
    }

    /// This section as a scale of section `target`, one scale per `block_elems` elements.
    pub fn with_scale(mut self, target: usize, block_elems: u64) -> Section {
        self.scale = Some(ScaleOf {
            target,
            block_elems,
        });
        self
    }

    /// This section with the named element order (`kvlayout.geometry/v2`); `"linear"` is the
    /// default order, which [`Section::order`] reads as absent (one fingerprint for both
    /// spellings).
    pub fn with_order(mut self, order: impl Into<String>) -> Section {
        self.order = Some(Cow::Owned(order.into()));
        self
    }

    /// This section with its leading axis made of tensor-parallel groups of `groups` entries
    /// each over the whole model (`kvlayout.geometry/v3` `split_groups`).
    pub fn with_split_groups(mut self, groups: Vec<u64>) -> Section {
        self.split_groups = Some(Cow::Owned(groups));
        self
    }

    /// The split groups (whole-model entries of each group), `None` when absent.
    pub const fn split_groups(&self) -> Option<&[u64]> {
        match &self.split_groups {
            Some(g) => Some(cow_slice(g)),
            None => None,
        }
    }

    /// The order's name, `None` when linear: absent, or `"linear"` set on the public field
    /// (every comparison and fingerprint reads the order through here, so both spellings are
    /// one layout).
    pub const fn order(&self) -> Option<&str> {
        match &self.order {
            Some(o) if !is_linear(cow_str(o)) => Some(cow_str(o)),
            _ => None,
        }
    }

    /// The shape as a slice.
    pub const fn shape(&self) -> &[u64] {
        cow_slice(&self.shape)
    }

    /// The label as `&str`.
    pub const fn name(&self) -> &str {
        cow_str(&self.name)
    }

    /// Elements per token (product of the shape). `index` is this section's position, for errors.
    ///
    /// # Errors
    ///
    /// [`LayoutError::Overflow`] when the shape's product overflows 64 bits.
    pub const fn elems(&self, index: usize) -> Result<u64, LayoutError> {
        let shape = self.shape();
        if shape.is_empty() {
            return Err(LayoutError::EmptyShape { section: index });
        }
        let mut elems = 1u64;
        let mut d = 0;
        while d < shape.len() {
            if shape[d] == 0 {
                return Err(LayoutError::ZeroDim {
                    section: index,
                    dim: d,
                });
            }
            elems = tri!(mul(elems, shape[d], "section elements"));
            d += 1;
        }
        Ok(elems)
    }

    /// Bytes per token; the bits must fill whole bytes.
    ///
    /// # Errors
    ///
    /// As [`Section::elems`], plus [`LayoutError::SubByteCount`] when the elements' bits do not
    /// fill whole bytes.
    pub const fn bytes(&self, index: usize) -> Result<u64, LayoutError> {
        let elems = tri!(self.elems(index));
        bits_to_bytes(elems, self.dtype.bits(), index)
    }

    /// Heads of this section: the leading dimension when the shape has two or more, else 1.
    pub const fn heads(&self) -> u64 {
        let shape = self.shape();
        if shape.len() >= 2 { shape[0] } else { 1 }
    }
}

/// `elems` elements of `bits` bits as whole bytes, or [`LayoutError::SubByteCount`].
pub(crate) const fn bits_to_bytes(elems: u64, bits: u64, index: usize) -> Result<u64, LayoutError> {
    let total_bits = tri!(mul(elems, bits, "section bits"));
    if total_bits % 8 != 0 {
        return Err(LayoutError::SubByteCount {
            section: index,
            elems,
            bits,
        });
    }
    Ok(total_bits / 8)
}

/// `name == "linear"`, in `const`.
const fn is_linear(name: &str) -> bool {
    let (a, b) = (name.as_bytes(), b"linear".as_slice());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}
