//! Rust element types a `#[derive(KvLayout)]` token row may use, each tied to its [`Dtype`].
//!
//! `half::bf16`, `half::f16`, `f32`, `u8`, `i8`, `i32`, `i64`, `float8::F8E4M3` and `float8::F8E5M2` are used
//! as they are; the types without a well-kept crate are the one-byte wrappers below. A struct
//! field `[F4E2M1; 128]` declares 128 four-bit elements (64 bytes of storage): the Rust type
//! only names the element, the descriptor gives the packed size.

use crate::Dtype;

pub use float8::{F8E4M3, F8E5M2};
pub use half::{bf16, f16};

/// A type usable as the element of a token-row field.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a KV-cache element type",
    label = "unsupported element type",
    note = "use half::bf16, half::f16, f32, u8, i8, i32, i64, F8E4M3, F8E4M3Fnuz, F8E5M2, F8E5M2Fnuz, Ue8m0 or F4E2M1"
)]
pub trait Element {
    /// The dtype this element stores as.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => { $(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })* };
}

/// FP8 E4M3 "fnuz" (AMD), raw bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct F8E4M3Fnuz(pub u8);
/// FP8 E5M2 "fnuz" (AMD), raw bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct F8E5M2Fnuz(pub u8);
/// OCP MX ue8m0 scale (value 2^(bits-127)), raw bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct Ue8m0(pub u8);
/// One OCP MX FP4 E2M1 element in a descriptor; stored two per byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct F4E2M1(pub u8);

element! {
    f32 => F32,
    f16 => F16,
    bf16 => Bf16,
    F8E4M3 => F8E4M3,
    F8E4M3Fnuz => F8E4M3Fnuz,
    F8E5M2 => F8E5M2,
    F8E5M2Fnuz => F8E5M2Fnuz,
    Ue8m0 => Ue8m0,
    u8 => U8,
    i8 => I8,
    F4E2M1 => F4E2M1,
    i32 => I32,
    i64 => I64,
}
