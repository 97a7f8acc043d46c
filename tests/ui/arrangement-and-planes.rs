use kvlayout::KvLayout;
use kvlayout::elem::{F8E4M3, bf16};

#[derive(KvLayout)]
#[kv(arrangement = "section_major", planes = [[nope], [rope]])]
struct Mla {
    nope: [F8E4M3; 512],
    rope: [bf16; 64],
}

fn main() {}
