use kvlayout::KvLayout;
use kvlayout::elem::F8E4M3;

#[derive(KvLayout)]
#[kv(arrangement = "row_major")]
struct IndexK {
    values: [F8E4M3; 128],
}

fn main() {}
