//! Element types of KV-cache sections.
//!
//! Bit widths follow the formats' definitions: IEEE f32/f16, bfloat16, the OCP FP8 formats
//! (e4m3 "fn" and e5m2, plus the AMD "fnuz" variants), the OCP MX scale type ue8m0, plain bytes,
//! and the OCP MX FP4 type e2m1 stored two per byte.

use std::fmt;

/// An element type. `bits()` is the storage width of one element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16 (8 exponent bits, 7 mantissa bits).
    Bf16,
    /// OCP FP8 E4M3, the "fn" variant (no infinities, max 448), `torch.float8_e4m3fn`.
    F8E4M3,
    /// FP8 E4M3 "fnuz" (AMD, exponent bias 8, max 240).
    F8E4M3Fnuz,
    /// OCP FP8 E5M2.
    F8E5M2,
    /// FP8 E5M2 "fnuz" (AMD).
    F8E5M2Fnuz,
    /// OCP MX scale: unsigned 8-bit exponent, value 2^(e-127).
    Ue8m0,
    /// Unsigned byte.
    U8,
    /// Signed byte.
    I8,
    /// OCP MX FP4 E2M1: 4 bits, two elements per byte (a section must hold an even count).
    F4E2M1,
}

impl Dtype {
    /// Every dtype, in fingerprint-code order.
    pub const ALL: [Dtype; 11] = [
        Dtype::F32,
        Dtype::F16,
        Dtype::Bf16,
        Dtype::F8E4M3,
        Dtype::F8E4M3Fnuz,
        Dtype::F8E5M2,
        Dtype::F8E5M2Fnuz,
        Dtype::Ue8m0,
        Dtype::U8,
        Dtype::I8,
        Dtype::F4E2M1,
    ];

    /// Storage bits of one element.
    pub const fn bits(self) -> u64 {
        match self {
            Dtype::F32 => 32,
            Dtype::F16 | Dtype::Bf16 => 16,
            Dtype::F8E4M3
            | Dtype::F8E4M3Fnuz
            | Dtype::F8E5M2
            | Dtype::F8E5M2Fnuz
            | Dtype::Ue8m0
            | Dtype::U8
            | Dtype::I8 => 8,
            Dtype::F4E2M1 => 4,
        }
    }

    /// The name used in geometry files (`kvlayout.geometry/v1`).
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F8E4M3 => "f8e4m3",
            Dtype::F8E4M3Fnuz => "f8e4m3fnuz",
            Dtype::F8E5M2 => "f8e5m2",
            Dtype::F8E5M2Fnuz => "f8e5m2fnuz",
            Dtype::Ue8m0 => "ue8m0",
            Dtype::U8 => "u8",
            Dtype::I8 => "i8",
            Dtype::F4E2M1 => "f4e2m1",
        }
    }

    /// Stable one-byte code hashed by the fingerprint (never renumber).
    pub const fn code(self) -> u8 {
        match self {
            Dtype::F32 => 1,
            Dtype::F16 => 2,
            Dtype::Bf16 => 3,
            Dtype::F8E4M3 => 4,
            Dtype::F8E4M3Fnuz => 5,
            Dtype::F8E5M2 => 6,
            Dtype::F8E5M2Fnuz => 7,
            Dtype::Ue8m0 => 8,
            Dtype::U8 => 9,
            Dtype::I8 => 10,
            Dtype::F4E2M1 => 11,
        }
    }

    /// Parses a geometry-file dtype name; `None` for anything else (the caller names the field).
    pub fn from_name(name: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == name)
    }

    /// Comma-separated list of the accepted names, for error messages.
    pub fn accepted_names() -> String {
        Dtype::ALL.map(Dtype::name).join(", ")
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
