use kvlayout::KvLayout;
use kvlayout::elem::F4E2M1;

// fp4 packs two elements per byte: 127 elements would end in half a byte.
#[derive(KvLayout)]
struct IndexKFp4 {
    values: [F4E2M1; 127],
}

fn main() {}
