//! Property tests over generated geometries drawn from the whole model: every dtype,
//! arrangement, plane grouping, scale relation, page stride / alignment, buffer set, layer
//! count and memory layout, the v2 fields (own page size, attention, layer ids, shard,
//! section order) and the v3 ones (compress ratio, heads replicated over ranks, split groups). At each compare level, every single change of a field the level compares is
//! detected (a line naming it) and changes that level's fingerprint; changes of fields it does
//! not compare are neither.
//!
//! CI runs `CASES` cases per property (see below); a long run:
//! `PROPTEST_CASES=200000 cargo test --release -p kvlayout-core --test properties`.

use std::collections::BTreeSet;

use kvlayout_core::{
    Arrangement, Attention, BufferGeometry, Cow, Dtype, Level, MemoryLayout, PoolGeometry, ScaleOf,
    Section, Shard, ShardSplit, TokenLayout, compare, compare_at, file,
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
                    split_groups: None,
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
                    split_groups: None,
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

/// The v2 fields of one buffer, drawn independently of its layout.
#[derive(Clone, Debug)]
struct V2Spec {
    attention: u8,
    window_tokens: u64,
    own_page: Option<u64>,
    layer_ids_from: Option<u32>,
    shard: u8,
    tp_size: u64,
    rank: prop::sample::Index,
    order: Option<(prop::sample::Index, u8)>,
    v3: V3Spec,
}

/// The v3 fields of one buffer: a compress ratio (a divisor of its page, picked), heads
/// replicated over ranks (a heads split with fewer heads than ranks), split groups on one
/// section of a heads split.
#[derive(Clone, Debug)]
struct V3Spec {
    compress: Option<prop::sample::Index>,
    replicate: bool,
    groups: Option<(prop::sample::Index, prop::sample::Index)>,
}

fn v3_spec() -> impl Strategy<Value = V3Spec> {
    (
        prop_oneof![2 => Just(None), 1 => any::<prop::sample::Index>().prop_map(Some)],
        prop_oneof![Just(false), Just(true)],
        prop_oneof![
            2 => Just(None),
            1 => (any::<prop::sample::Index>(), any::<prop::sample::Index>()).prop_map(Some)
        ],
    )
        .prop_map(|(compress, replicate, groups)| V3Spec {
            compress,
            replicate,
            groups,
        })
}

fn v2_spec() -> impl Strategy<Value = V2Spec> {
    (
        0u8..6,
        1u64..=64,
        prop_oneof![2 => Just(None), 1 => (1u64..=8).prop_map(Some)],
        prop_oneof![Just(None), (0u32..100).prop_map(Some)],
        0u8..3,
        1u64..=4,
        any::<prop::sample::Index>(),
        prop_oneof![2 => Just(None), 1 => (any::<prop::sample::Index>(), 0u8..3).prop_map(Some)],
        v3_spec(),
    )
        .prop_map(
            |(
                attention,
                window_tokens,
                own_page,
                layer_ids_from,
                shard,
                tp_size,
                rank,
                order,
                v3,
            )| {
                V2Spec {
                    attention,
                    window_tokens,
                    own_page,
                    layer_ids_from,
                    shard,
                    tp_size,
                    rank,
                    order,
                    v3,
                }
            },
        )
}

/// Applies `v` to buffer `b` of a pool of `page` tokens per page; `heads` is the head count of
/// every section when the buffer is MHA-shaped (a heads split needs it).
fn apply_v2(b: &mut BufferGeometry, v: &V2Spec, page: u64, heads: Option<u64>) {
    b.attention = match v.attention {
        0..=2 => Attention::Full,
        3 => Attention::SlidingWindow {
            window_tokens: v.window_tokens,
        },
        4 => Attention::Chunked {
            chunk_tokens: v.window_tokens,
        },
        _ => Attention::State,
    };
    if b.attention != Attention::State {
        b.page_size_tokens = v.own_page;
    }
    b.layer_ids = v
        .layer_ids_from
        .map(|from| (from..from + b.layers as u32).collect());
    let rank = v.rank.index(v.tp_size as usize) as u64;
    b.shard = match (v.shard, heads) {
        (0, _) => None,
        // v3: one head per rank, each on tp_size / heads_total ranks (the sections' head axis
        // is 1); heads_total a proper divisor of tp_size.
        (2, Some(1)) if v.v3.replicate && v.tp_size > 1 => {
            // At least 2 heads where tp_size allows (so a rank can move to another head).
            let total = (2..v.tp_size)
                .rev()
                .find(|d| v.tp_size.is_multiple_of(*d))
                .unwrap_or(1);
            Some(Shard::heads(v.tp_size, rank, total))
        }
        (2, Some(h)) => Some(Shard::heads(v.tp_size, rank, h * v.tp_size)),
        _ => Some(Shard::replicated(v.tp_size, rank)),
    };
    // v3 split groups on one section of a plain heads split: the whole-model axis h * N cut
    // into two groups of a * N and (h - a) * N entries, or one group.
    if let (Some((at, cut)), Some(s)) = (&v.v3.groups, b.shard)
        && let Some(total) = s.heads_total()
        && !s.replicated_heads()
    {
        let h = total / s.tp_size;
        let groups = match h {
            1 => vec![total],
            _ => {
                let a = 1 + cut.index(h as usize - 1) as u64;
                vec![a * s.tp_size, (h - a) * s.tp_size]
            }
        };
        let mut sections = b.layout.sections().to_vec();
        let i = at.index(sections.len());
        sections[i] = sections[i].clone().with_split_groups(groups);
        b.layout.sections = Cow::Owned(sections);
    }
    if let Some((at, name)) = &v.order {
        let mut sections = b.layout.sections().to_vec();
        let i = at.index(sections.len());
        sections[i] = sections[i].clone().with_order(format!("swizzle_{name}"));
        b.layout.sections = Cow::Owned(sections);
    }
    // v3: one row per R tokens, R a divisor of the buffer's page.
    if let Some(pick) = &v.v3.compress
        && b.attention != Attention::State
    {
        let t = b.effective_page_size_tokens(page);
        let divisors: Vec<u64> = (1..=t).filter(|d| t.is_multiple_of(*d)).collect();
        b.compress_ratio = divisors[pick.index(divisors.len())];
    }
    // The explicit stride was drawn for 4-row pages.
    if b.rows_per_page(page) != 4 {
        b.layout.page_stride_bytes = None;
    }
}

fn pool() -> impl Strategy<Value = PoolGeometry> {
    (
        any::<bool>(),
        prop_oneof![Just(1u64), 1u64..=3],
        prop_oneof![Just(4u64), 1u64..=8],
        1u64..=4,
        0usize..4,
    )
        .prop_flat_map(|(mha, heads, page, pages, ml)| {
            let heads = mha.then_some(heads);
            (
                proptest::collection::vec(
                    (
                        token_layout(heads),
                        1u64..=4,
                        prop_oneof![Just(None), v2_spec().prop_map(Some)],
                    ),
                    1..=3,
                ),
                Just((page, pages, ml, mha, heads)),
            )
        })
        .prop_map(|(bufs, (page, pages, ml, mha, heads))| {
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
                .map(|(i, (spec, layers, v2))| {
                    let mut layout = spec.layout;
                    if page != 4 {
                        layout.page_stride_bytes = None;
                    }
                    let mut b = BufferGeometry::new(Cow::Owned(format!("buf{i}")), layers, layout);
                    if let Some(v) = v2 {
                        apply_v2(&mut b, &v, page, heads);
                    }
                    b
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

/// Changes only fields no level compares: name, pages, section labels, buffer order.
fn unlabelled_copy(g: &PoolGeometry, pick: usize) -> PoolGeometry {
    let mut c = g.clone();
    c.name = format!("{} (copy)", g.name);
    c.pages = g.pages + 1 + pick as u64;
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

/// Changes only fields the `pool` level does not compare (adds the memory layout).
fn uncompared_copy(g: &PoolGeometry, pick: usize) -> PoolGeometry {
    let mut c = unlabelled_copy(g, pick);
    c.memory_layout = [
        MemoryLayout::LayerFirst,
        MemoryLayout::PageFirst,
        MemoryLayout::PageFirstDirect,
    ][pick % 3];
    c
}

/// Number of single-change kinds [`mutate`] knows.
const MUTATIONS: usize = 17;

/// Which mutations each level compares (the rest of `0..MUTATIONS` it does not, except 0 and
/// 11 at token level, which depend on the arrangement and are left out there).
fn compared_at(level: Level, which: usize) -> bool {
    match level {
        Level::Pool => which != 12,
        Level::Storage => true,
        Level::Token => matches!(which, 1 | 2 | 3 | 4 | 5 | 7 | 8 | 10 | 13 | 14 | 15 | 16),
    }
}

/// Mutations a level does not compare (for the "not detected" property).
fn uncompared_at(level: Level, which: usize) -> bool {
    match level {
        Level::Pool => which == 12,
        Level::Storage => false,
        Level::Token => matches!(which, 6 | 9 | 12),
    }
}

/// One change to one field; the field path the mismatch must name (a prefix). `None` when the
/// change does not apply to this geometry (a buffer without layer ids, say).
fn mutate(g: &PoolGeometry, which: usize, pick: usize) -> Option<(PoolGeometry, String)> {
    let mut c = g.clone();
    let bi = pick % c.buffers.len();
    let bname = c.buffers[bi].name.to_string();
    let page = g.buffer_page_size_tokens(bi).unwrap();
    let rows = g.buffer_page_rows(bi).unwrap();
    let b = &mut c.buffers[bi];
    let field = match which % MUTATIONS {
        // A pool of state buffers only has no token axis: its page size is not compared
        // (tests/geometry_v2.rs a_state_only_pool_has_no_page_size_to_compare).
        0 if !g.has_token_axis() => return None,
        0 => {
            c.page_size_tokens += 1;
            for b in &mut c.buffers {
                b.layout.page_stride_bytes = None;
            }
            "page_size_tokens".to_string()
        }
        1 => {
            b.layers += 1;
            if let Some(ids) = &mut b.layer_ids {
                ids.push(ids.iter().max().unwrap() + 1);
            }
            format!("{bname}.layers")
        }
        2 => {
            b.name = Cow::Owned(format!("{bname}_other"));
            bname
        }
        3 => {
            let l = &mut b.layout;
            l.arrangement = match l.arrangement {
                Arrangement::TokenMajor => Arrangement::SectionMajor,
                _ => Arrangement::TokenMajor,
            };
            format!("{bname}.arrangement")
        }
        4 => {
            let l = &mut b.layout;
            let mut sections = l.sections().to_vec();
            let si = pick % sections.len();
            let d = sections[si].dtype;
            sections[si].dtype =
                Dtype::ALL[(Dtype::ALL.iter().position(|x| *x == d).unwrap() + 1 + pick % 12)
                    % Dtype::ALL.len()];
            l.sections = Cow::Owned(sections);
            format!("{bname}.sections[{si}].dtype")
        }
        5 => {
            // Under a heads split every section leads with this rank's heads (1 when heads
            // are replicated over ranks).
            let local = b.shard.and_then(|s| s.local_heads());
            let l = &mut b.layout;
            let mut sections = l.sections().to_vec();
            let shape = match local {
                Some(h) => vec![h, 2],
                None => vec![2],
            };
            sections.push(Section::owned("extra", Dtype::U8, shape));
            if let Arrangement::Planes(p) = &l.arrangement {
                let mut p = p.to_vec();
                p.push(Cow::Owned(vec![sections.len() - 1]));
                l.arrangement = Arrangement::Planes(Cow::Owned(p));
            }
            l.sections = Cow::Owned(sections);
            format!("{bname}.sections")
        }
        6 => {
            let l = &mut b.layout;
            let payload = l.page_payload_bytes(rows).unwrap();
            let old = l.page_stride_bytes(rows).unwrap();
            l.page_align_bytes = None;
            l.page_stride_bytes = Some(old.max(payload) + 8);
            format!("{bname}.page_stride_bytes")
        }
        7 => {
            b.attention = match b.attention {
                Attention::Full => Attention::SlidingWindow { window_tokens: 64 },
                Attention::SlidingWindow { window_tokens } => Attention::SlidingWindow {
                    window_tokens: window_tokens + 1,
                },
                Attention::Chunked { chunk_tokens } => Attention::Chunked {
                    chunk_tokens: chunk_tokens + 1,
                },
                Attention::State => Attention::Full,
            };
            if b.effective_page_size_tokens(c.page_size_tokens) != page {
                b.layout.page_stride_bytes = None;
            }
            format!("{bname}.attention")
        }
        8 => {
            for id in b.layer_ids.as_mut()? {
                *id += 1000;
            }
            format!("{bname}.layer_ids")
        }
        9 => {
            b.shard = Some(match b.shard {
                None => Shard::replicated(2, 1),
                Some(s) => match s.split {
                    ShardSplit::Replicated => Shard::replicated(s.tp_size + 1, s.rank),
                    // Another replica of the same head: the token level sees the same head.
                    ShardSplit::Heads { .. } if s.replicated_heads() => {
                        let r = s.replicas();
                        let first = s.rank / r * r;
                        Shard {
                            rank: first + (s.rank - first + 1) % r,
                            ..s
                        }
                    }
                    ShardSplit::Heads { .. } if s.tp_size > 1 => Shard {
                        rank: (s.rank + 1) % s.tp_size,
                        ..s
                    },
                    ShardSplit::Heads { .. } => return None,
                },
            });
            format!("{bname}.shard")
        }
        10 => {
            let mut sections = b.layout.sections().to_vec();
            let order = match sections[0].order() {
                None => "swizzle_z".to_string(),
                Some(o) => format!("{o}_2"),
            };
            sections[0] = sections[0].clone().with_order(order);
            b.layout.sections = Cow::Owned(sections);
            format!("{bname}.sections[0].order")
        }
        11 => {
            if b.attention == Attention::State {
                return None;
            }
            b.page_size_tokens = Some(page + 1);
            b.layout.page_stride_bytes = None;
            format!("{bname}.page_size_tokens")
        }
        12 => {
            c.memory_layout = match g.memory_layout {
                MemoryLayout::LayerFirst => MemoryLayout::PageFirst,
                _ => MemoryLayout::LayerFirst,
            };
            "memory_layout".to_string()
        }
        13 => {
            // heads_total doubled with tp_size: this rank's heads and shapes are unchanged.
            let s = b.shard?;
            let heads_total = s.heads_total()?;
            b.shard = Some(Shard::heads(s.tp_size * 2, s.rank, heads_total * 2));
            format!("{bname}.shard")
        }
        14 => {
            // v3: another compress ratio dividing the page.
            if b.attention == Attention::State {
                return None;
            }
            let divisors: Vec<u64> = (1..=page)
                .filter(|d| page.is_multiple_of(*d) && *d != b.compress_ratio)
                .collect();
            if divisors.is_empty() {
                return None;
            }
            b.compress_ratio = divisors[pick % divisors.len()];
            b.layout.page_stride_bytes = None;
            format!("{bname}.compress_ratio")
        }
        15 => {
            // v3: split groups added (one group of heads_total) or regrouped.
            let s = b.shard?;
            let total = s.heads_total()?;
            if s.replicated_heads() {
                return None;
            }
            let mut sections = b.layout.sections().to_vec();
            let si = pick % sections.len();
            let groups = match sections[si].split_groups() {
                None => vec![total],
                Some([one]) if *one > s.tp_size => vec![s.tp_size, one - s.tp_size],
                Some([_]) => return None,
                Some(g) => vec![g.iter().sum()],
            };
            sections[si] = sections[si].clone().with_split_groups(groups);
            b.layout.sections = Cow::Owned(sections);
            format!("{bname}.sections[{si}].split_groups")
        }
        _ => {
            // v3: a replicated rank moved to another head's replicas.
            let s = b.shard?;
            let total = s.heads_total()?;
            if !s.replicated_heads() || total < 2 {
                return None;
            }
            b.shard = Some(Shard {
                rank: (s.rank + s.replicas()) % s.tp_size,
                ..s
            });
            format!("{bname}.shard")
        }
    };
    Some((c, field))
}

/// The fingerprint a level stands on: pool, storage, or the set of token fingerprints.
fn level_fingerprint(g: &PoolGeometry, level: Level) -> Vec<(String, u64)> {
    match level {
        Level::Pool => vec![(String::new(), g.fingerprint().unwrap())],
        Level::Storage => vec![(String::new(), g.storage_fingerprint().unwrap())],
        Level::Token => {
            let mut v: Vec<(String, u64)> = g
                .token_fingerprints()
                .into_iter()
                .map(|(n, f)| (n.to_string(), f))
                .collect();
            v.sort();
            v
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
    /// fingerprints equal. The copy is a valid geometry too (only page_head constrains shapes,
    /// and the copy never uses it).
    #[test]
    fn uncompared_changes_are_compatible(g in pool(), pick in 0usize..16) {
        for level in Level::ALL {
            prop_assert_eq!(compare_at(&g, &g, level), Ok(()));
        }
        let c = uncompared_copy(&g, pick);
        prop_assert_eq!(c.validate(), Ok(()));
        prop_assert_eq!(compare(&g, &c), Ok(()));
        prop_assert_eq!(g.fingerprint(), c.fingerprint());
        let u = unlabelled_copy(&g, pick);
        prop_assert_eq!(u.validate(), Ok(()));
        for level in Level::ALL {
            prop_assert_eq!(compare_at(&g, &u, level), Ok(()));
            prop_assert_eq!(level_fingerprint(&g, level), level_fingerprint(&u, level));
        }
        // layer_ids are compared only when both sides give them.
        let mut n = g.clone();
        for b in &mut n.buffers {
            b.layer_ids = None;
        }
        for level in Level::ALL {
            prop_assert_eq!(compare_at(&g, &n, level), Ok(()));
        }
    }

    /// (b) + (c): at every level, any single change of a field that level compares is
    /// detected, named, and changes that level's fingerprint.
    #[test]
    fn compared_changes_are_detected(g in pool(), which in 0usize..MUTATIONS, pick in 0usize..64) {
        let Some((c, field)) = mutate(&g, which, pick) else {
            return Ok(());
        };
        prop_assume!(c.validate().is_ok());
        for level in Level::ALL.into_iter().filter(|l| compared_at(*l, which)) {
            let m = compare_at(&g, &c, level).expect_err("a compared field changed");
            prop_assert!(
                m.diffs.iter().any(|d| d.field.starts_with(&field)),
                "level {}: expected a line for {}, got\n{}", level, field, m
            );
            prop_assert_ne!(level_fingerprint(&g, level), level_fingerprint(&c, level), "level {}", level);
        }
    }

    /// (c'): a change of a field a level does not compare is not detected at that level and
    /// leaves its fingerprint alone.
    #[test]
    fn changes_a_level_does_not_compare_pass(g in pool(), which in 0usize..MUTATIONS, pick in 0usize..64) {
        let Some((c, _)) = mutate(&g, which, pick) else {
            return Ok(());
        };
        prop_assume!(c.validate().is_ok());
        for level in Level::ALL.into_iter().filter(|l| uncompared_at(*l, which)) {
            prop_assert_eq!(compare_at(&g, &c, level), Ok(()), "level {}", level);
            prop_assert_eq!(level_fingerprint(&g, level), level_fingerprint(&c, level), "level {}", level);
        }
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
        for (bi, b) in g.buffers.iter().enumerate() {
            let l = &b.layout;
            // In-page indices count rows (tokens when the compress ratio is 1).
            let t = g.buffer_page_rows(bi).unwrap();
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

/// The generator draws every v3 field (else the properties above would pass without testing
/// them): over 2,000 valid pools, some buffer has each of a compress ratio above 1, heads
/// replicated over ranks, and split groups; and mutations 14 (ratio), 15 (groups) and 16
/// (replicated head) apply to some of them.
#[test]
fn the_generator_draws_every_v3_field() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = pool();
    let (mut ratio, mut replicated, mut groups) = (0, 0, 0);
    let mut applied = [0usize; 3];
    for i in 0..2_000 {
        let g = strategy.new_tree(&mut runner).unwrap().current();
        for b in &g.buffers {
            ratio += usize::from(b.compress_ratio > 1);
            replicated += usize::from(b.shard.is_some_and(|s| s.replicated_heads()));
            groups += usize::from(
                b.layout
                    .sections()
                    .iter()
                    .any(|s| s.split_groups().is_some()),
            );
        }
        for (k, which) in [14, 15, 16].into_iter().enumerate() {
            if let Some((c, _)) = mutate(&g, which, i) {
                applied[k] += usize::from(c.validate().is_ok());
            }
        }
    }
    eprintln!(
        "v3 buffers drawn: ratio {ratio}, replicated {replicated}, groups {groups}; mutations applied {applied:?}"
    );
    assert!(
        ratio > 0 && replicated > 0 && groups > 0,
        "{ratio} {replicated} {groups}"
    );
    assert!(applied.iter().all(|&n| n > 0), "{applied:?}");
}
