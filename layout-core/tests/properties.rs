//! Property tests over generated geometries drawn from the whole model: every dtype,
//! arrangement, plane grouping, scale relation, page stride / alignment, buffer set, layer
//! count and memory layout.
//!
//! CI runs `CASES` cases per property (see below); a long run:
//! `PROPTEST_CASES=200000 cargo test --release -p kvlayout-core --test properties`.

use std::collections::BTreeSet;

use kvlayout_core::{
    Arrangement, BufferGeometry, Cow, Dtype, MemoryLayout, PoolGeometry, ScaleOf, Section,
    TokenLayout, compare, file,
};
use proptest::prelude::*;
use proptest::test_runner::Config;

/// Cases per property in CI; `PROPTEST_CASES` overrides.
const CASES: u32 = 1500;

fn config() -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(CASES);
    Config {
        cases,
        ..Config::default()
    }
}

fn dtype() -> impl Strategy<Value = Dtype> {
    proptest::sample::select(Dtype::ALL.to_vec())
}

/// A value section: rank 1..=3, small dims, the last dim even so fp4 fills whole bytes
/// (also per head).
fn value_section(heads: Option<u64>) -> impl Strategy<Value = (Dtype, Vec<u64>)> {
    (dtype(), 1u64..=3, 1u64..=4, 1usize..=3).prop_map(move |(d, h, half_last, rank)| {
        let last = half_last * 2;
        let shape = match (heads, rank) {
            (Some(h), _) => vec![h, last],
            (None, 1) => vec![last * 4],
            (None, 2) => vec![h, last * 4],
            (None, _) => vec![h, 2, last],
        };
        (d, shape)
    })
}

#[derive(Clone, Debug)]
struct LayoutSpec {
    layout: TokenLayout,
}

fn token_layout(heads: Option<u64>) -> impl Strategy<Value = LayoutSpec> {
    (
        proptest::collection::vec(value_section(heads), 1..=3),
        proptest::collection::vec(
            (any::<prop::sample::Index>(), 0usize..4, any::<bool>()),
            0..=2,
        ),
        0u8..4,
        any::<prop::sample::Index>(),
        prop_oneof![Just(None), (1u64..=512).prop_map(Some)],
        0u64..3,
    )
        .prop_map(move |(values, scales, arr, split, align, extra_pages)| {
            let mut sections: Vec<Section> = values
                .iter()
                .enumerate()
                .map(|(i, (d, shape))| Section {
                    name: Cow::Owned(format!("v{i}")),
                    dtype: *d,
                    shape: Cow::Owned(shape.clone()),
                    scale: None,
                    order: None,
                })
                .collect();
            for (k, (target, block_pick, ue8m0)) in scales.iter().enumerate() {
                let t = target.index(values.len());
                let elems: u64 = values[t].1.iter().product();
                // A divisor of the scaled count; with a heads dimension keep the scale shaped
                // [heads, n] so page_head stays possible.
                let (h, per_head) = match heads {
                    Some(h) => (h, elems / h),
                    None => (1, elems),
                };
                let divisors: Vec<u64> = (1..=per_head).filter(|b| per_head % b == 0).collect();
                let block = divisors[block_pick % divisors.len()];
                let shape = match heads {
                    Some(_) => vec![h, per_head / block],
                    None => vec![elems / block],
                };
                sections.push(Section {
                    name: Cow::Owned(format!("s{k}")),
                    dtype: if *ue8m0 { Dtype::Ue8m0 } else { Dtype::F32 },
                    shape: Cow::Owned(shape),
                    scale: Some(ScaleOf {
                        target: t,
                        block_elems: block,
                    }),
                    order: None,
                });
            }
            let n = sections.len();
            let arrangement = match arr {
                0 => Arrangement::TokenMajor,
                1 => Arrangement::SectionMajor,
                2 => Arrangement::HeadMajor,
                _ => {
                    // Reverse order, split in two groups at a generated point.
                    let order: Vec<usize> = (0..n).rev().collect();
                    let cut = 1 + split.index(n);
                    let mut planes = vec![Cow::Owned(order[..cut.min(n)].to_vec())];
                    if cut < n {
                        planes.push(Cow::Owned(order[cut..].to_vec()));
                    }
                    Arrangement::Planes(Cow::Owned(planes))
                }
            };
            let mut layout = TokenLayout {
                arrangement,
                sections: Cow::Owned(sections),
                page_align_bytes: align,
                page_stride_bytes: None,
            };
            if extra_pages > 0 && align.is_none() {
                // An explicit stride: the payload at 4 tokens/page plus some slack, used with
                // page_size 4 only (see pool()); otherwise left out.
                let payload = layout.page_payload_bytes(4).unwrap();
                layout.page_stride_bytes = Some(payload + 16 * extra_pages);
            }
            LayoutSpec { layout }
        })
}

fn pool() -> impl Strategy<Value = PoolGeometry> {
    (
        any::<bool>(),
        1u64..=3,
        prop_oneof![Just(4u64), 1u64..=8],
        1u64..=4,
        0usize..4,
    )
        .prop_flat_map(|(mha, heads, page, pages, ml)| {
            let heads = mha.then_some(heads);
            (
                proptest::collection::vec((token_layout(heads), 1u64..=4), 1..=3),
                Just((page, pages, ml, mha)),
            )
        })
        .prop_map(|(bufs, (page, pages, ml, mha))| {
            let memory_layout = match ml {
                0 => MemoryLayout::LayerFirst,
                1 => MemoryLayout::PageFirst,
                2 => MemoryLayout::PageFirstDirect,
                _ if mha => MemoryLayout::PageHead,
                _ => MemoryLayout::LayerFirst,
            };
            let buffers = bufs
                .into_iter()
                .enumerate()
                .map(|(i, (spec, layers))| {
                    let mut layout = spec.layout;
                    if page != 4 {
                        layout.page_stride_bytes = None;
                    }
                    BufferGeometry::new(Cow::Owned(format!("buf{i}")), layers, layout)
                })
                .collect();
            PoolGeometry {
                name: "generated".into(),
                page_size_tokens: page,
                pages,
                memory_layout,
                buffers,
            }
        })
        .prop_filter("valid geometry", |g| g.validate().is_ok())
}

/// Changes only fields the check does not compare.
fn uncompared_copy(g: &PoolGeometry, pick: usize) -> PoolGeometry {
    let mut c = g.clone();
    c.name = format!("{} (copy)", g.name);
    c.pages = g.pages + 1 + pick as u64;
    c.memory_layout = [
        MemoryLayout::LayerFirst,
        MemoryLayout::PageFirst,
        MemoryLayout::PageFirstDirect,
    ][pick % 3];
    for b in &mut c.buffers {
        let mut sections = b.layout.sections().to_vec();
        for s in &mut sections {
            s.name = Cow::Owned(format!("{}_renamed", s.name));
        }
        b.layout.sections = Cow::Owned(sections);
    }
    c.buffers.reverse();
    c
}

/// One change to a compared field; the field path the mismatch must name (a prefix).
fn mutate(g: &PoolGeometry, which: usize, pick: usize) -> (PoolGeometry, String) {
    let mut c = g.clone();
    let bi = pick % c.buffers.len();
    let bname = c.buffers[bi].name.to_string();
    match which % 7 {
        0 => {
            c.page_size_tokens += 1;
            for b in &mut c.buffers {
                b.layout.page_stride_bytes = None;
            }
            (c, "page_size_tokens".into())
        }
        1 => {
            c.buffers[bi].layers += 1;
            (c, format!("{bname}.layers"))
        }
        2 => {
            c.buffers[bi].name = Cow::Owned(format!("{bname}_other"));
            (c, bname)
        }
        3 => {
            let l = &mut c.buffers[bi].layout;
            l.arrangement = match l.arrangement {
                Arrangement::TokenMajor => Arrangement::SectionMajor,
                _ => Arrangement::TokenMajor,
            };
            (c, format!("{bname}.arrangement"))
        }
        4 => {
            let l = &mut c.buffers[bi].layout;
            let mut sections = l.sections().to_vec();
            let si = pick % sections.len();
            let d = sections[si].dtype;
            sections[si].dtype =
                Dtype::ALL[(Dtype::ALL.iter().position(|x| *x == d).unwrap() + 1 + pick % 10)
                    % Dtype::ALL.len()];
            l.sections = Cow::Owned(sections);
            (c, format!("{bname}.sections[{si}].dtype"))
        }
        5 => {
            let l = &mut c.buffers[bi].layout;
            let mut sections = l.sections().to_vec();
            sections.push(Section::new("extra", Dtype::U8, &[2]));
            if let Arrangement::Planes(p) = &l.arrangement {
                let mut p = p.to_vec();
                p.push(Cow::Owned(vec![sections.len() - 1]));
                l.arrangement = Arrangement::Planes(Cow::Owned(p));
            }
            l.sections = Cow::Owned(sections);
            (c, format!("{bname}.sections"))
        }
        _ => {
            let l = &mut c.buffers[bi].layout;
            let payload = l.page_payload_bytes(g.page_size_tokens).unwrap();
            let old = l.page_stride_bytes(g.page_size_tokens).unwrap();
            l.page_align_bytes = None;
            l.page_stride_bytes = Some(old.max(payload) + 8);
            (c, format!("{bname}.page_stride_bytes"))
        }
    }
}

/// Intervals sorted by start must tile [0, end) exactly.
fn assert_tiles(mut iv: Vec<(u64, u64)>, end: u64, what: &str) {
    iv.sort();
    let mut at = 0;
    for (start, len) in iv {
        assert_eq!(start, at, "{what}: gap or overlap at byte {at}");
        assert!(len > 0, "{what}: empty run");
        at = start + len;
    }
    assert_eq!(at, end, "{what}: runs end at {at}, expected {end}");
}

proptest! {
    #![proptest_config(config())]

    /// (a) + (c): compatible with itself and with copies changing only uncompared fields;
    /// fingerprints equal.
    #[test]
    fn uncompared_changes_are_compatible(g in pool(), pick in 0usize..16) {
        prop_assert_eq!(compare(&g, &g), Ok(()));
        let c = uncompared_copy(&g, pick);
        prop_assert!(c.validate().is_ok() || c.memory_layout != g.memory_layout);
        prop_assert_eq!(compare(&g, &c), Ok(()));
        prop_assert_eq!(g.fingerprint(), c.fingerprint());
    }

    /// (b) + (c): any single change of a compared field is detected, named, and changes the
    /// fingerprint.
    #[test]
    fn compared_changes_are_detected(g in pool(), which in 0usize..7, pick in 0usize..64) {
        let (c, field) = mutate(&g, which, pick);
        prop_assume!(c.validate().is_ok());
        let m = compare(&g, &c).expect_err("a compared field changed");
        prop_assert!(
            m.diffs.iter().any(|d| d.field.starts_with(&field)),
            "expected a line for {}, got\n{}", field, m
        );
        prop_assert_ne!(g.fingerprint(), c.fingerprint());
    }

    /// (d): the geometry file round trip is lossless.
    #[test]
    fn file_round_trip(g in pool()) {
        let text = file::to_json(&g);
        prop_assert_eq!(file::from_json(&text), Ok(g));
    }

    /// (e): every (section, token, head run) of a page is disjoint, in bounds, and together
    /// they cover the page payload exactly.
    #[test]
    fn page_offsets_tile_the_payload(g in pool()) {
        for b in &g.buffers {
            let l = &b.layout;
            let t = g.page_size_tokens;
            let mut iv = Vec::new();
            for s in 0..l.sections().len() {
                let run = l.run_bytes(s).unwrap();
                for token in 0..t {
                    for r in 0..l.runs(s).unwrap() {
                        iv.push((l.offset_bytes(s, token, r, t).unwrap(), run));
                    }
                }
            }
            assert_tiles(iv, l.page_payload_bytes(t).unwrap(), b.name());
        }
    }

    /// (f): for every memory layout, the (buffer, layer, page) pieces are disjoint, inside the
    /// pool, and (with strides) tile it exactly.
    #[test]
    fn pool_pieces_tile_the_pool(g in pool()) {
        let mut iv = Vec::new();
        let mut names = BTreeSet::new();
        for (bi, b) in g.buffers.iter().enumerate() {
            names.insert(b.name().to_string());
            for layer in 0..b.layers {
                for page in 0..g.pages {
                    for s in g.page_segments(bi, layer, page).unwrap() {
                        iv.push((s.pool_offset_bytes, s.len_bytes));
                    }
                }
            }
        }
        assert_tiles(iv, g.total_bytes().unwrap(), g.memory_layout.name());
        prop_assert_eq!(names.len(), g.buffers.len());
    }
}
