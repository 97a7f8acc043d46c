use kvlayout::KvLayout;
use kvlayout::elem::F8E4M3;

#[derive(KvLayout)]
struct IndexK([F8E4M3; 128], [f32; 1]);

fn main() {}
