// The seed bug as a type error: a host pool of the fp8-formula index-K layout cannot be paired
// with a device pool of the bf16 layout.
use kvlayout::KvLayout;
use kvlayout::MemoryLayout;
use kvlayout::elem::{F8E4M3, bf16};
use kvlayout::pool::{TypedDevicePool, TypedHiCache, TypedHostPool};

#[derive(KvLayout)]
#[kv(arrangement = "section_major")]
struct IndexKBf16 {
    values: [bf16; 128],
}

#[derive(KvLayout)]
#[kv(arrangement = "section_major")]
struct IndexKFp8Formula {
    values: [F8E4M3; 128],
    #[kv(scales = values, block_elems = 128)]
    scale: [f32; 1],
}

fn main() {
    let device = TypedDevicePool::<IndexKBf16>::new(61, 1024, 64).unwrap();
    let other = TypedDevicePool::<IndexKFp8Formula>::new(61, 1024, 64).unwrap();
    let host = TypedHostPool::mirror_of(&other, 4096, MemoryLayout::PageFirst).unwrap();
    let _cache = TypedHiCache::pair(device, host);
}
