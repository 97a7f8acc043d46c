use kvlayout::KvLayout;
use kvlayout::elem::F8E4M3;

#[derive(KvLayout)]
#[kv(arrangement = "section_major")]
struct IndexK {
    values: [F8E4M3; 128],
    #[kv(scales = values, block_elems = 100)]
    scale: [f32; 1],
}

fn main() {}
