//! Pitched runs: consecutive runs of one length whose starts advance by a constant pitch on
//! both sides, moved by the copy engines as one 2D copy (`cuMemcpy2DAsync`: `lines` lines of
//! `len_bytes`, source pitch, destination pitch) instead of `lines` copies.
//!
//! Why: a copy engine pays a fixed cost per copy. On the H200 a batch of 8,448-byte index-K
//! page runs moved 0.245 of pinned memcpy alone and 41,984-byte MLA page runs 0.81 next to a
//! GEMM (BENCHMARKS.md, "Transfers next to the model"). A HiCache backup of all layers between
//! a `layer_first` device pool and a `page_first` host pool is, per page and buffer, 61 runs of
//! one length: device pitch = the layer stride (`pages x page bytes`), host pitch = the page's
//! per-layer bytes. As pitched runs it is one copy per page and buffer: 2,048 copies for 1,024
//! pages of DeepSeek-V3.2 instead of 124,928.
//!
//! Grouping never changes what moves: [`PitchedRun::runs`] of the groups, in order, is the
//! input list (tested), and the groups are formed from runs already checked against both
//! regions.

use crate::copy_runs::ByteRun;

/// `lines` runs of `len_bytes`: run `i` copies from `src_offset_bytes + i * src_pitch_bytes` to
/// `dst_offset_bytes + i * dst_pitch_bytes`. With one line the pitches are 0. Made only by
/// [`group_pitched`] (or [`PitchedRun::single`]), so every line is one of the runs it was given:
/// the fields are read through methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PitchedRun {
    /// Source offset of the first line.
    src_offset_bytes: u64,
    /// Destination offset of the first line.
    dst_offset_bytes: u64,
    /// Bytes per line.
    len_bytes: u64,
    /// Lines (at least 1).
    lines: u64,
    /// Source bytes from one line's start to the next (at least `len_bytes` with two lines or
    /// more).
    src_pitch_bytes: u64,
    /// Destination bytes from one line's start to the next (at least `len_bytes` with two
    /// lines or more).
    dst_pitch_bytes: u64,
}

impl PitchedRun {
    /// One line.
    pub const fn single(run: ByteRun) -> PitchedRun {
        PitchedRun {
            src_offset_bytes: run.src_offset_bytes,
            dst_offset_bytes: run.dst_offset_bytes,
            len_bytes: run.len_bytes,
            lines: 1,
            src_pitch_bytes: 0,
            dst_pitch_bytes: 0,
        }
    }

    /// Source offset of the first line.
    pub const fn src_offset_bytes(&self) -> u64 {
        self.src_offset_bytes
    }

    /// Destination offset of the first line.
    pub const fn dst_offset_bytes(&self) -> u64 {
        self.dst_offset_bytes
    }

    /// Bytes per line.
    pub const fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    /// Lines (at least 1).
    pub const fn lines(&self) -> u64 {
        self.lines
    }

    /// Source bytes from one line's start to the next (0 for one line).
    pub const fn src_pitch_bytes(&self) -> u64 {
        self.src_pitch_bytes
    }

    /// Destination bytes from one line's start to the next (0 for one line).
    pub const fn dst_pitch_bytes(&self) -> u64 {
        self.dst_pitch_bytes
    }

    /// The lines as runs, in order.
    pub fn runs(self) -> impl Iterator<Item = ByteRun> {
        // No overflow: every line is one of the runs given to `group_pitched` (its offsets are
        // u64 values that were passed in).
        (0..self.lines).map(move |i| {
            ByteRun::new(
                self.src_offset_bytes + i * self.src_pitch_bytes,
                self.dst_offset_bytes + i * self.dst_pitch_bytes,
                self.len_bytes,
            )
        })
    }

    /// Bytes moved (`lines * len_bytes`, as u128: the runs given need not fit one region).
    pub fn total_bytes(&self) -> u128 {
        u128::from(self.lines) * u128::from(self.len_bytes)
    }

    /// The start of line `lines` (the next line the group would take), if it fits in u64.
    fn next_line(&self) -> Option<(u64, u64)> {
        let src = self
            .src_pitch_bytes
            .checked_mul(self.lines)?
            .checked_add(self.src_offset_bytes)?;
        let dst = self
            .dst_pitch_bytes
            .checked_mul(self.lines)?
            .checked_add(self.dst_offset_bytes)?;
        Some((src, dst))
    }
}

/// Groups consecutive runs of `runs` into pitched runs: a run joins the group before it when it
/// has the group's length, and its starts continue the group's pitches on both sides (the
/// second run of a group sets them: each at least the length, so lines never overlap, and at
/// most `max_pitch_bytes`, the driver's limit, `CU_DEVICE_ATTRIBUTE_MAX_PITCH`). Zero-length
/// runs are kept as single lines. Expanding the result in order gives `runs` back.
pub fn group_pitched(runs: &[ByteRun], max_pitch_bytes: u64) -> Vec<PitchedRun> {
    let mut out: Vec<PitchedRun> = Vec::new();
    for &r in runs {
        if let Some(g) = out.last_mut()
            && g.len_bytes == r.len_bytes
            && r.len_bytes > 0
        {
            if g.lines == 1 {
                let pitches = (
                    r.src_offset_bytes.checked_sub(g.src_offset_bytes),
                    r.dst_offset_bytes.checked_sub(g.dst_offset_bytes),
                );
                if let (Some(sp), Some(dp)) = pitches {
                    let fits = |p: u64| p >= r.len_bytes && p <= max_pitch_bytes;
                    if fits(sp) && fits(dp) {
                        g.src_pitch_bytes = sp;
                        g.dst_pitch_bytes = dp;
                        g.lines = 2;
                        continue;
                    }
                }
            } else if g.next_line() == Some((r.src_offset_bytes, r.dst_offset_bytes)) {
                g.lines += 1;
                continue;
            }
        }
        out.push(PitchedRun::single(r));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(groups: &[PitchedRun]) -> Vec<ByteRun> {
        groups.iter().flat_map(|g| g.runs()).collect()
    }

    /// A backup of pages 7 and 2 of a DeepSeek-V3.2-like pool, worked by hand: device
    /// `layer_first` with 16 pages, 3 layers of 41,984-byte MLA pages (layer stride 16 x 41,984
    /// = 671,744 B); host `page_first`, one page = 3 x 41,984 = 125,952 B. Host order: page 0 of
    /// the host (device page 7) layers 0..3, then host page 1 (device page 2).
    #[test]
    fn a_backup_of_all_layers_is_one_copy_per_page() {
        let (page, layer_stride, host_page) = (41_984u64, 671_744u64, 125_952u64);
        let mut runs = Vec::new();
        for (host_p, dev_p) in [(0u64, 7u64), (1, 2)] {
            for l in 0..3 {
                runs.push(ByteRun::new(
                    l * layer_stride + dev_p * page,
                    host_p * host_page + l * page,
                    page,
                ));
            }
        }
        let groups = group_pitched(&runs, 1 << 31);
        assert_eq!(
            groups,
            vec![
                PitchedRun {
                    src_offset_bytes: 7 * 41_984,
                    dst_offset_bytes: 0,
                    len_bytes: 41_984,
                    lines: 3,
                    src_pitch_bytes: 671_744,
                    dst_pitch_bytes: 41_984,
                },
                PitchedRun {
                    src_offset_bytes: 2 * 41_984,
                    dst_offset_bytes: 125_952,
                    len_bytes: 41_984,
                    lines: 3,
                    src_pitch_bytes: 671_744,
                    dst_pitch_bytes: 41_984,
                },
            ]
        );
        assert_eq!(expand(&groups), runs);
        assert_eq!(
            groups.iter().map(PitchedRun::total_bytes).sum::<u128>(),
            6 * 41_984
        );
    }

    #[test]
    fn random_pages_of_one_layer_stay_single() {
        // Load of one layer: device pages 5, 1, 9 from host pages 0, 1, 2 (sorted by host).
        // Pitches 41,984 x (1 - 5) < 0 on the device: no group.
        let page = 41_984u64;
        let runs: Vec<ByteRun> = [(0u64, 5u64), (1, 1), (2, 9)]
            .iter()
            .map(|&(h, d)| ByteRun::new(h * 100_000, d * page, page))
            .collect();
        let groups = group_pitched(&runs, 1 << 31);
        assert_eq!(groups.len(), 2, "5 -> 1 is backwards; 1 -> 9 pairs up");
        assert_eq!(groups[0], PitchedRun::single(runs[0]));
        assert_eq!(groups[1].lines, 2);
        assert_eq!(groups[1].dst_pitch_bytes, 8 * page);
        assert_eq!(expand(&groups), runs);
    }

    #[test]
    fn pitch_limits_and_lengths_split_groups() {
        // A pitch over the limit, a pitch under the length (overlapping lines), a length
        // change, a zero-length run, and a run that breaks the pitch.
        let runs = [
            ByteRun::new(0, 0, 8),
            ByteRun::new(1_000, 16, 8), // src pitch 1,000 > limit 512: new group
            ByteRun::new(1_004, 32, 8), // src pitch 4 < len 8: new group
            ByteRun::new(1_100, 48, 8), // pitches 96, 16: joins
            ByteRun::new(1_196, 64, 8), // continues (1,100 + 96, 48 + 16)
            ByteRun::new(1_292, 80, 4), // length change: new group
            ByteRun::new(2_000, 96, 0), // zero length: single
            ByteRun::new(2_000, 96, 0), // zero length: single
            ByteRun::new(3_000, 200, 4),
            ByteRun::new(3_010, 210, 4), // pitches 10, 10: joins
            ByteRun::new(3_021, 220, 4), // breaks the pitch (3,020 expected): new group
        ];
        let groups = group_pitched(&runs, 512);
        let lines: Vec<u64> = groups.iter().map(|g| g.lines).collect();
        assert_eq!(lines, vec![1, 1, 3, 1, 1, 1, 2, 1]);
        assert_eq!(expand(&groups), runs.to_vec());
    }

    #[test]
    fn next_line_overflow_is_no_group() {
        // Pitch 10: the third line would start at u64::MAX - 15 + 20, past u64; a wrapping
        // sum (4) must not make the run at 4 join.
        let runs = [
            ByteRun::new(u64::MAX - 15, 0, 8),
            ByteRun::new(u64::MAX - 5, 10, 8),
            ByteRun::new(4, 20, 8),
        ];
        let groups = group_pitched(&runs, u64::MAX);
        assert_eq!(
            groups.iter().map(|g| g.lines).collect::<Vec<_>>(),
            vec![2, 1]
        );
        assert_eq!(expand(&groups), runs.to_vec());
    }

    proptest::proptest! {
        /// Any list: the groups expand to the list, every group of two or more lines has both
        /// pitches in [len, max], and no two neighbouring single runs could have formed a
        /// group (grouping is maximal for pairs).
        #[test]
        fn groups_expand_to_the_list(
            raw in proptest::collection::vec((0u64..64, 0u64..64, 0u64..4), 0..60),
            max_pitch in 1u64..40,
        ) {
            // Small offsets and lengths in units of 4 bytes make groups common.
            let runs: Vec<ByteRun> =
                raw.iter().map(|&(s, d, l)| ByteRun::new(s * 4, d * 4, l * 4)).collect();
            let groups = group_pitched(&runs, max_pitch * 4);
            proptest::prop_assert_eq!(expand(&groups), runs.clone());
            for g in &groups {
                proptest::prop_assert!(g.lines >= 1);
                if g.lines > 1 {
                    for p in [g.src_pitch_bytes, g.dst_pitch_bytes] {
                        proptest::prop_assert!(p >= g.len_bytes && p <= max_pitch * 4);
                    }
                    proptest::prop_assert!(g.len_bytes > 0);
                }
            }
            for w in groups.windows(2) {
                let (a, b) = (w[0], w[1]);
                if a.lines == 1 && b.len_bytes == a.len_bytes && a.len_bytes > 0 {
                    let sp = b.src_offset_bytes.checked_sub(a.src_offset_bytes);
                    let dp = b.dst_offset_bytes.checked_sub(a.dst_offset_bytes);
                    let ok = |p: Option<u64>| {
                        p.is_some_and(|p| p >= a.len_bytes && p <= max_pitch * 4)
                    };
                    proptest::prop_assert!(!(ok(sp) && ok(dp)), "{a:?} then {b:?} not grouped");
                }
            }
        }
    }

    // Hostile inputs (review 3).

    fn strategy_run() -> impl proptest::strategy::Strategy<Value = (u64, u64, u64)> {
        use proptest::prelude::*;
        let off = prop_oneof![0u64..64, (u64::MAX - 64)..=u64::MAX, any::<u64>()];
        (
            off.clone(),
            off,
            prop_oneof![Just(0u64), 1u64..16, any::<u64>()],
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4_096))]
        /// Offsets near 0 and near u64::MAX, any length, any limit (0 included), lists built
        /// from pitched families with duplicates and perturbations: no panic, expansion exact,
        /// every group's lines pairwise disjoint on each side.
        #[test]
        fn hostile_lists_expand_exactly(
            seeds in proptest::collection::vec(strategy_run(), 0..12),
            fam in proptest::collection::vec((0u64..4, 1u64..6, 0u64..10, 0u64..10), 0..6),
            max_pitch in proptest::prop_oneof![proptest::strategy::Just(0u64), 0u64..64, proptest::prelude::any::<u64>()],
        ) {
            let mut runs: Vec<ByteRun> = seeds.iter().map(|&(s, d, l)| ByteRun::new(s, d, l)).collect();
            for &(len4, lines, sp, dp) in &fam {
                let base = runs.first().copied().unwrap_or(ByteRun::new(u64::MAX - 100, 5, 4));
                for i in 0..lines {
                    runs.push(ByteRun::new(
                        base.src_offset_bytes.wrapping_add(i * sp * 4),
                        base.dst_offset_bytes.wrapping_add(i * dp * 4),
                        len4 * 4,
                    ));
                }
            }
            let groups = group_pitched(&runs, max_pitch);
            let expanded: Vec<ByteRun> = groups.iter().flat_map(|g| g.runs()).collect();
            proptest::prop_assert_eq!(&expanded, &runs);
            for g in &groups {
                if g.lines > 1 {
                    proptest::prop_assert!(g.src_pitch_bytes >= g.len_bytes && g.dst_pitch_bytes >= g.len_bytes);
                    proptest::prop_assert!(g.src_pitch_bytes <= max_pitch && g.dst_pitch_bytes <= max_pitch);
                    proptest::prop_assert!(g.len_bytes > 0);
                }
            }
        }
    }

    #[test]
    fn max_pitch_zero_and_pitch_equal_to_length() {
        let runs = [
            ByteRun::new(0, 0, 8),
            ByteRun::new(8, 8, 8),
            ByteRun::new(16, 16, 8),
        ];
        assert!(group_pitched(&runs, 0).iter().all(|g| g.lines == 1));
        let g = group_pitched(&runs, 8);
        assert_eq!(g.len(), 1);
        assert_eq!((g[0].lines, g[0].src_pitch_bytes), (3, 8));
        // Duplicates (pitch 0) and overlapping lines (pitch < len) never group.
        let dup = [ByteRun::new(0, 0, 8); 4];
        assert_eq!(group_pitched(&dup, u64::MAX).len(), 4);
        // A run ending exactly at u64::MAX and the one before it.
        let top = [
            ByteRun::new(u64::MAX - 16, u64::MAX - 16, 8),
            ByteRun::new(u64::MAX - 8, u64::MAX - 8, 8),
        ];
        let g = group_pitched(&top, u64::MAX);
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].runs().collect::<Vec<_>>(), top.to_vec());
    }
}
