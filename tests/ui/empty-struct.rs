use kvlayout::KvLayout;

#[derive(KvLayout)]
struct Nothing {}

fn main() {}
