use kvlayout::KvLayout;
use kvlayout::elem::{F8E4M3, Ue8m0, bf16};

#[derive(KvLayout)]
#[kv(planes = [[nope, rope], [scale]], page_align_bytes = 576)]
struct Dsv4Mla {
    nope: [F8E4M3; 448],
    rope: [bf16; 64],
    #[kv(scales = nope, block_elems = 64)]
    scale: [Ue8m0; 7],
    pad: [u8; 1],
}

fn main() {}
