use kvlayout::KvLayout;
use kvlayout::elem::F8E4M3;

// A constant length is only known after type resolution: the macro cannot see that 64 does
// not divide 100, the const evaluation of the layout's validation does.
const INDEX_HEAD_DIM: usize = 100;

#[derive(KvLayout)]
#[kv(arrangement = "section_major")]
struct IndexK {
    values: [F8E4M3; INDEX_HEAD_DIM],
    #[kv(scales = values, block_elems = 64)]
    scale: [f32; 1],
}

fn main() {}
