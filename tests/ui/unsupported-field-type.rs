use kvlayout::KvLayout;

#[derive(KvLayout)]
struct IndexK {
    values: [u32; 128],
}

fn main() {}
