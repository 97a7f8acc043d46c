//! Every arrangement, nested shapes, aliases, constant lengths, raw identifiers and an explicit
//! stride, with offsets worked by hand. No warnings either: a descriptor struct is never
//! built, and the derive keeps `dead_code` from flagging its fields.

#![deny(warnings)]

use kvlayout::elem::{F8E4M3, Ue8m0, bf16};
use kvlayout::{Arrangement, Dtype, KvLayout, ScaleOf};

type Fp8 = F8E4M3;
const HEADS: usize = 8;
const HEAD_DIM: usize = 128;

/// MHA MXFP8 K, head-major (HND): `[8, 128]` e4m3 plus `[8, 4]` ue8m0 (one per 32).
#[derive(KvLayout)]
#[kv(arrangement = "head_major")]
struct MhaK {
    k: [[Fp8; HEAD_DIM]; HEADS],
    #[kv(scales = k, block_elems = 32)]
    k_scale: [[Ue8m0; 4]; HEADS],
}

/// Token-major row with a raw identifier and an explicit stride (page of 64 x 6 = 384 -> 512).
#[derive(KvLayout)]
#[kv(page_stride_bytes = 512)]
struct Row {
    r#type: [u8; 2],
    rope: [bf16; 2],
}

/// DeepSeek-V4 planes through the facade, with the `crate` key spelled out.
#[derive(KvLayout)]
#[kv(crate = ::kvlayout, planes = [[nope, rope], [scale, pad]], page_align_bytes = 576)]
struct Dsv4 {
    nope: [F8E4M3; 448],
    rope: [bf16; 64],
    #[kv(scales = nope, block_elems = 64)]
    scale: [Ue8m0; 7],
    pad: [u8; 1],
}

kvlayout::assert_bytes_per_token!(MhaK, 1056);
kvlayout::assert_bytes_per_token!(Row, 6);
kvlayout::assert_bytes_per_token!(Dsv4, 584);

fn main() {
    // MhaK: 8 x 128 x 1 B = 1024 + 8 x 4 x 1 B = 32 -> 1056.
    let l = MhaK::LAYOUT;
    assert_eq!(l.arrangement, Arrangement::HeadMajor);
    assert_eq!(l.sections()[0].shape(), &[8, 128]);
    assert_eq!(l.sections()[0].dtype, Dtype::F8E4M3);
    assert_eq!(l.sections()[1].shape(), &[8, 4]);
    assert_eq!(
        l.sections()[1].scale,
        Some(ScaleOf {
            target: 0,
            block_elems: 32
        })
    );
    // Head 2 of token 5 in a 64-token page: (2 x 64 + 5) x 128 = 17024.
    assert_eq!(l.offset_bytes(0, 5, 2, 64), Ok(17024));
    // Its scales: after 64 x 1024 = 65536 value bytes, (2 x 64 + 5) x 4 = 532 -> 66068.
    assert_eq!(l.offset_bytes(1, 5, 2, 64), Ok(66068));

    // Row: section named `type` (the `r#` is not part of the name); stride 512 > 64 x 6 = 384.
    assert_eq!(Row::LAYOUT.sections()[0].name(), "type");
    assert_eq!(Row::LAYOUT.page_stride_bytes(64), Ok(512));
    // Token 3's rope: 3 x 6 + 2 = 20.
    assert_eq!(Row::LAYOUT.offset_bytes(1, 3, 0, 64), Ok(20));

    // Dsv4: plane 1 is 64 x 576 = 36864 B; token 1's scale: 36864 + 1 x 8 = 36872.
    assert_eq!(Dsv4::LAYOUT.offset_bytes(2, 1, 0, 64), Ok(36872));
    assert_eq!(Dsv4::LAYOUT.page_stride_bytes(64), Ok(37440));
    assert_eq!(Dsv4::NAME, "Dsv4");
    assert_eq!(
        Dsv4::FINGERPRINT,
        kvlayout::formats::DSV4_MLA_FP8.fingerprint()
    );
}
