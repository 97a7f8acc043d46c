use kvlayout::KvLayout;
use kvlayout::elem::F8E4M3;

#[derive(KvLayout)]
#[kv(arangement = "section_major")]
struct IndexK {
    values: [F8E4M3; 128],
    #[kv(scales = values, blocks = 128)]
    scale: [f32; 1],
}

fn main() {}
