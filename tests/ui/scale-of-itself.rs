use kvlayout::KvLayout;
use kvlayout::elem::F8E4M3;

#[derive(KvLayout)]
struct IndexK {
    values: [F8E4M3; 128],
    #[kv(scales = scale, block_elems = 128)]
    scale: [f32; 1],
}

fn main() {}
