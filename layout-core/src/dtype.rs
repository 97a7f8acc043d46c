//! Element types of KV-cache sections.
//!
//! Bit widths follow the formats' definitions: IEEE f32/f16, bfloat16, the OCP FP8 formats
//! (e4m3 "fn" and e5m2, plus the AMD "fnuz" variants), the OCP MX scale type ue8m0, plain bytes,
//! the OCP MX FP4 type e2m1 stored two per byte, and the 32/64-bit integers of v2 state buffers.
//!
//! Names: the geometry-file names (`f32`, `bf16`, `f8e4m3`, ...) and the torch / ml_dtypes
//! spellings (`float32`, `bfloat16`, `float8_e4m3fn`, `float8_e8m0fnu`, `int64`, ...) are both
//! accepted, ASCII case-insensitively (`BF16` = `bf16`); [`Dtype::name`] is what a file gets.

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
    /// Signed 32-bit integer (`kvlayout.geometry/v2`).
    I32,
    /// Signed 64-bit integer (`kvlayout.geometry/v2`; e.g. an n-gram history slot).
    I64,
}

impl Dtype {
    /// Every dtype, in fingerprint-code order.
    pub const ALL: [Dtype; 13] = [
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
        Dtype::I32,
        Dtype::I64,
    ];

    /// Storage bits of one element.
    pub const fn bits(self) -> u64 {
        match self {
            Dtype::I64 => 64,
            Dtype::F32 | Dtype::I32 => 32,
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
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
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
            Dtype::I32 => 12,
            Dtype::I64 => 13,
        }
    }

    /// Whether this dtype needs `kvlayout.geometry/v2` (the integers added by v2).
    pub const fn is_v2(self) -> bool {
        matches!(self, Dtype::I32 | Dtype::I64)
    }

    /// The torch / ml_dtypes spelling, where one exists (`torch.float8_e4m3fn`,
    /// `ml_dtypes.float8_e8m0fnu`, `ml_dtypes.float4_e2m1fn`).
    pub const fn torch_name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F16 => "float16",
            Dtype::Bf16 => "bfloat16",
            Dtype::F8E4M3 => "float8_e4m3fn",
            Dtype::F8E4M3Fnuz => "float8_e4m3fnuz",
            Dtype::F8E5M2 => "float8_e5m2",
            Dtype::F8E5M2Fnuz => "float8_e5m2fnuz",
            Dtype::Ue8m0 => "float8_e8m0fnu",
            Dtype::U8 => "uint8",
            Dtype::I8 => "int8",
            Dtype::F4E2M1 => "float4_e2m1fn",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
        }
    }

    /// Parses a dtype name: the geometry-file name or the torch / ml_dtypes spelling
    /// ([`Dtype::torch_name`]), ASCII case-insensitively, with an optional `torch.` prefix;
    /// `None` for anything else (the caller names the field).
    pub fn from_name(name: &str) -> Option<Dtype> {
        let bare = match name.get(..6) {
            Some(p) if p.eq_ignore_ascii_case("torch.") => &name[6..],
            _ => name,
        };
        Dtype::ALL.into_iter().find(|d| {
            d.name().eq_ignore_ascii_case(bare) || d.torch_name().eq_ignore_ascii_case(bare)
        })
    }

    /// Comma-separated list of the accepted names, for error messages.
    pub fn accepted_names() -> String {
        let names = Dtype::ALL.map(Dtype::name).join(", ");
        let torch = Dtype::ALL.map(Dtype::torch_name).join(", ");
        format!("{names} (or the torch names {torch}; any case)")
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
