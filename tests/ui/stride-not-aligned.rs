use kvlayout::KvLayout;
use kvlayout::elem::{F8E4M3, Ue8m0, bf16};

// A 64-token DeepSeek-V4 page is 37376 B, aligned to 576: 37440. An explicit stride must be a
// multiple of the alignment too; 37400 is not.
#[derive(KvLayout)]
#[kv(planes = [[nope, rope], [scale, pad]], page_align_bytes = 576, page_stride_bytes = 37400)]
struct Dsv4Mla {
    nope: [F8E4M3; 448],
    rope: [bf16; 64],
    #[kv(scales = nope, block_elems = 64)]
    scale: [Ue8m0; 7],
    pad: [u8; 1],
}

fn main() {}
