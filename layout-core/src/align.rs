//! Aligning two buffers' sections for a diff: by name first (a longest common subsequence of
//! labels, so one inserted section is one line, not a cascade of shifted positions), then,
//! between two aligned names, the remaining sections pair up in order when they play the same
//! role (both value sections, or both scales of aligned sections); what is left is on one side
//! only.
//!
//! Alignment only shapes the diff lines. Whether two layouts are equal is decided by position
//! (labels are never compared), in [`crate::diff`].

use crate::section::Section;

/// One row of an alignment: a section of A, of B, or of both.
type Pair = (Option<usize>, Option<usize>);

/// Index pairs in byte order of both sides.
pub(crate) fn align(a: &[Section], b: &[Section]) -> Vec<Pair> {
    let anchors = lcs(a, b);
    let mut out = Vec::with_capacity(a.len().max(b.len()));
    let (mut i, mut j) = (0, 0);
    for &(ai, bj) in anchors.iter().chain(std::iter::once(&(a.len(), b.len()))) {
        gap(a, b, i..ai, j..bj, &anchors, &mut out);
        if ai < a.len() && bj < b.len() {
            out.push((Some(ai), Some(bj)));
        }
        (i, j) = (ai + 1, bj + 1);
    }
    out
}

/// Longest common subsequence of labels, as index pairs.
fn lcs(a: &[Section], b: &[Section]) -> Vec<(usize, usize)> {
    let (n, m) = (a.len(), b.len());
    // len[i][j] = LCS of a[i..] and b[j..].
    let mut len = vec![0u32; (n + 1) * (m + 1)];
    let at = |i: usize, j: usize| i * (m + 1) + j;
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            len[at(i, j)] = if a[i].name() == b[j].name() {
                len[at(i + 1, j + 1)] + 1
            } else {
                len[at(i + 1, j)].max(len[at(i, j + 1)])
            };
        }
    }
    let mut pairs = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n && j < m {
        if a[i].name() == b[j].name() {
            pairs.push((i, j));
            i += 1;
            j += 1;
        } else if len[at(i + 1, j)] >= len[at(i, j + 1)] {
            i += 1;
        } else {
            j += 1;
        }
    }
    pairs
}

/// Whether `x` (of A) and `y` (of B) play the same role: both value sections, or both scales of
/// sections that are aligned by name.
fn same_role(x: &Section, y: &Section, anchors: &[(usize, usize)]) -> bool {
    match (x.scale, y.scale) {
        (None, None) => true,
        (Some(rx), Some(ry)) => anchors.contains(&(rx.target, ry.target)),
        _ => false,
    }
}

/// The unaligned sections between two anchors: paired in order by role, the rest one-sided.
fn gap(
    a: &[Section],
    b: &[Section],
    ra: std::ops::Range<usize>,
    rb: std::ops::Range<usize>,
    anchors: &[(usize, usize)],
    out: &mut Vec<Pair>,
) {
    let mut js: Vec<usize> = rb.clone().collect();
    for i in ra {
        match js.iter().position(|&j| same_role(&a[i], &b[j], anchors)) {
            Some(k) => {
                // B sections before the partner are B-only, in order.
                for j in js.drain(..k) {
                    out.push((None, Some(j)));
                }
                out.push((Some(i), Some(js.remove(0))));
            }
            None => out.push((Some(i), None)),
        }
    }
    for j in js {
        out.push((None, Some(j)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dtype;

    fn s(name: &str) -> Section {
        Section::owned(name, Dtype::Bf16, vec![8])
    }

    #[test]
    fn one_inserted_section_is_one_row() {
        let a = [s("nope"), s("pad"), s("rope")];
        let b = [s("nope"), s("rope_scale"), s("pad"), s("rope")];
        assert_eq!(
            align(&a, &b),
            vec![
                (Some(0), Some(0)),
                (None, Some(1)),
                (Some(1), Some(2)),
                (Some(2), Some(3))
            ]
        );
    }

    #[test]
    fn unnamed_matches_pair_in_order_and_leftovers_are_one_sided() {
        let a = [s("kv")];
        let b = [s("k"), s("v")];
        assert_eq!(align(&a, &b), vec![(Some(0), Some(0)), (None, Some(1))]);
        assert_eq!(align(&b, &a), vec![(Some(0), Some(0)), (Some(1), None)]);
    }

    #[test]
    fn a_scale_pairs_only_with_a_scale_of_the_aligned_section() {
        let a = [s("values"), s("x").with_scale(0, 8)];
        let b = [s("values"), s("y")];
        assert_eq!(
            align(&a, &b),
            vec![(Some(0), Some(0)), (Some(1), None), (None, Some(1))]
        );
    }
}
