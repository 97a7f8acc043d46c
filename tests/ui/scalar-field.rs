use kvlayout::KvLayout;
use kvlayout::elem::F8E4M3;

#[derive(KvLayout)]
struct IndexK {
    values: [F8E4M3; 128],
    #[kv(scales = values, block_elems = 128)]
    scale: f32,
}

fn main() {}
