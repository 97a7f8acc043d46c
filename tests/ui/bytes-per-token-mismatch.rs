use kvlayout::KvLayout;
use kvlayout::elem::F8E4M3;

// The seed bug, declared: the fp8 index-K row is 128 + 4 = 132 bytes, not 128.
#[derive(KvLayout)]
#[kv(arrangement = "section_major")]
struct IndexKWrong {
    values: [F8E4M3; 128],
    #[kv(scales = values, block_elems = 128)]
    scale: [f32; 1],
}

kvlayout::assert_bytes_per_token!(IndexKWrong, 128);

fn main() {}
