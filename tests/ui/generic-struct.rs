use kvlayout::KvLayout;

#[derive(KvLayout)]
struct Row<T> {
    values: [T; 128],
}

fn main() {}
