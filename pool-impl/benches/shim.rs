//! The shim's cost against the transfer it guards (DESIGN.md "The runtime shim"): a
//! DeepSeek-V3.2 pool (kv 656 B + bf16 index-K 256 B per token, 4 layers, 64-token pages),
//! a `page_first` host mirror, and a backup of 32 pages of all layers (32 x 4 x (41984 +
//! 16384) = 7,471,104 B). Measured: the checks + plan alone, the whole checked backup, and the
//! unverified (legacy) plan for comparison.

use criterion::{Criterion, criterion_group, criterion_main};
use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};
use kvlayout_pool::{DevicePool, Direction, HiCache, HostPool, Layers, PagePair};

fn cache(checked: bool) -> HiCache {
    let device = DevicePool::new(PoolGeometry {
        name: "bench".into(),
        page_size_tokens: 64,
        pages: 128,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![
            BufferGeometry {
                name: "kv".into(),
                layers: 4,
                layout: formats::DSA_MLA_FP8,
            },
            BufferGeometry {
                name: "index_k".into(),
                layers: 4,
                layout: formats::INDEX_K_BF16,
            },
        ],
    })
    .expect("device pool");
    let host = HostPool::mirror_of(&device, 256, MemoryLayout::PageFirst).expect("host pool");
    if checked {
        HiCache::pair(device, host).expect("mirror pairs")
    } else {
        HiCache::pair_unverified(device, host)
    }
}

fn bench(c: &mut Criterion) {
    let pairs: Vec<PagePair> = (0..32).map(|p| PagePair::new(p * 3, 200 - p)).collect();
    let mut checked = cache(true);
    let legacy = cache(false);
    c.bench_function("checked plan, 32 pages x 4 layers", |b| {
        b.iter(|| {
            checked
                .plan(Direction::Backup, Layers::All, &pairs)
                .unwrap()
        })
    });
    c.bench_function("legacy plan, 32 pages x 4 layers", |b| {
        b.iter(|| legacy.plan(Direction::Backup, Layers::All, &pairs).unwrap())
    });
    c.bench_function("checked backup (plan + CPU copy of 7.5 MB)", |b| {
        b.iter(|| checked.backup(&pairs).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
