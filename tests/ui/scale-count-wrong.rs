use kvlayout::KvLayout;
use kvlayout::elem::F8E4M3;

// 512 / 128 = 4 scales, but the field holds 2.
#[derive(KvLayout)]
struct DsaMla {
    nope: [F8E4M3; 512],
    #[kv(scales = nope, block_elems = 128)]
    nope_scale: [f32; 2],
    rope: [kvlayout::elem::bf16; 64],
}

fn main() {}
