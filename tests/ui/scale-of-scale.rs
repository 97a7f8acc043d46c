use kvlayout::KvLayout;
use kvlayout::elem::{F8E4M3, Ue8m0};

#[derive(KvLayout)]
struct Nested {
    values: [F8E4M3; 128],
    #[kv(scales = values, block_elems = 32)]
    scale: [f32; 4],
    #[kv(scales = scale, block_elems = 4)]
    scale_of_scale: [Ue8m0; 1],
}

fn main() {}
