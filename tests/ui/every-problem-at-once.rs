use kvlayout::KvLayout;
use kvlayout::elem::{F4E2M1, F8E4M3};

// Three independent problems: all three are reported, each at its field.
#[derive(KvLayout)]
struct Broken {
    values: [F8E4M3; 128],
    #[kv(scales = values, block_elems = 0)]
    scale: [f32; 1],
    packed: [F4E2M1; 3],
    #[kv(scales = missing, block_elems = 32)]
    other_scale: [u8; 4],
}

fn main() {}
