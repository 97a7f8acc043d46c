// Regression (hostile review, session 8): `block`, `page_stride_bytes` and `page_align_bytes`
// were cast with `as u64`, so 128.9 became 128, `true` 1 and a u128 wrapped.
use kvlayout::KvLayout;
use kvlayout::elem::F8E4M3;

#[derive(KvLayout)]
#[kv(arrangement = "section_major", page_stride_bytes = 9000.99, page_align_bytes = true)]
struct FloatBlock {
    values: [F8E4M3; 128],
    #[kv(scales = values, block_elems = 128.9)]
    scale: [f32; 1],
}

#[derive(KvLayout)]
#[kv(arrangement = "section_major")]
struct WideBlock {
    values: [F8E4M3; 128],
    #[kv(scales = values, block_elems = (1u128 << 64) + 128)]
    scale: [f32; 1],
}

fn main() {}
