use kvlayout::KvLayout;

// Through an alias the macro cannot tell the element is fp4; the const evaluation can.
type Nvfp4 = kvlayout::elem::F4E2M1;

#[derive(KvLayout)]
struct IndexKFp4 {
    values: [Nvfp4; 127],
}

fn main() {}
