use kvlayout::KvLayout;

#[derive(KvLayout)]
enum Row {
    Fp8,
    Bf16,
}

fn main() {}
