//! Quantization scales, as DeepSeek-V3.2's `act_quant` computes them (the CUDA index-K
//! quantizer in `kvlayout-kernels` and the replay's element codecs both use these).
//!
//! - e4m3 keys: `scale = max(amax, 1e-4) * f32(1/448)` ([`scale_for_amax`]), with `1/448`
//!   rounded to f32 (bits `0x3b12_4925`, as the CUDA source writes it);
//! - `scale_fmt: ue8m0` (and OCP MX scales): the scale rounded up to a power of two by exponent
//!   arithmetic ([`round_scale_ue8m0`], DeepSeek's `fast_log2_ceil` + `fast_pow2`), never by
//!   `log2().ceil()`: for x = 2^20 (1 + 2^-23), `x.log2()` rounds to exactly 20.0 in f32, so
//!   the float route gives 2^20 < x, while the exponent route gives 2^21.

/// Largest finite e4m3 (`fn`) magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// `1/448` rounded to f32: bits `0x3b12_4925` (the CUDA source uses the same bits).
pub const INV_E4M3_MAX: f32 = f32::from_bits(0x3b12_4925);
/// The floor DeepSeek's `act_quant` puts under `amax`: `1e-4` as f32, bits `0x38d1_b717`.
pub const AMAX_FLOOR: f32 = f32::from_bits(0x38d1_b717);

/// How a per-key scale is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleFormat {
    /// `amax / 448` as computed (`amax * f32(1/448)`).
    F32,
    /// Rounded up to a power of two (DeepSeek-V3.2 `scale_fmt: ue8m0`), still stored as f32.
    Ue8m0,
}

/// The scale of one e4m3 key whose largest magnitude is `amax`.
pub fn scale_for_amax(amax: f32, format: ScaleFormat) -> f32 {
    let s = amax.max(AMAX_FLOOR) * INV_E4M3_MAX;
    match format {
        ScaleFormat::F32 => s,
        ScaleFormat::Ue8m0 => round_scale_ue8m0(s),
    }
}

/// `2^ceil(log2(x))` for a positive normal `x`, by exponent arithmetic (DeepSeek-V3.2
/// `fast_log2_ceil` + `fast_pow2`).
pub fn round_scale_ue8m0(x: f32) -> f32 {
    f32::from_bits(((ceil_log2(x) + 127) as u32) << 23)
}

/// `ceil(log2(x))` of a non-negative `x` from its bits: the unbiased exponent, plus 1 when any
/// mantissa bit is set.
fn ceil_log2(x: f32) -> i32 {
    let bits = x.to_bits();
    ((bits >> 23) & 0xFF) as i32 - 127 + i32::from(bits & 0x7F_FFFF != 0)
}

/// The ue8m0 code (biased exponent, OCP MX) of the smallest power of two at or above `scale`,
/// clamped to the codes of 2^-127 ..= 2^127 (0 ..= 254; 255 is NaN).
pub fn ue8m0_code(scale: f32) -> u8 {
    (ceil_log2(scale.max(0.0)).clamp(-127, 127) + 127) as u8
}

/// The power of two a ue8m0 code stands for: `2^(code - 127)`.
pub fn ue8m0_value(code: u8) -> f32 {
    2f32.powi(i32::from(code) - 127)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scale_just_above_a_power_of_two_rounds_to_the_next_one() {
        // x = 2^20 (1 + 2^-23): exponent 20, one mantissa bit set
        let x = f32::from_bits(0x4980_0001);
        assert_eq!(x, 2f32.powi(20) + 0.125); // 2^20 x 2^-23 = 2^-3
        assert_eq!(round_scale_ue8m0(x), 2f32.powi(21));
        assert_eq!(ue8m0_value(ue8m0_code(x)), 2f32.powi(21));
        assert_eq!(ue8m0_code(x), 21 + 127);
        // the old codec's route: log2 rounds to exactly 20.0 in f32, so ceil gives 2^20 < x
        let old = 2f32.powi(x.log2().ceil() as i32);
        assert_eq!(old, 2f32.powi(20));
        assert!(old < x);
    }

    #[test]
    fn powers_of_two_are_kept_and_the_codes_clamp() {
        for e in [-126, -1, 0, 1, 20, 127] {
            let p = 2f32.powi(e);
            assert_eq!(round_scale_ue8m0(p), p, "2^{e}");
            assert_eq!(ue8m0_code(p), (e + 127) as u8);
        }
        // 3 -> 4, 0.75 -> 1
        assert_eq!(ue8m0_value(ue8m0_code(3.0)), 4.0);
        assert_eq!(ue8m0_value(ue8m0_code(0.75)), 1.0);
        assert_eq!(ue8m0_code(0.0), 0);
        assert_eq!(ue8m0_code(f32::MAX), 254);
    }

    #[test]
    fn the_exponent_route_is_never_below_x_on_sampled_normals() {
        // every 97th f32 bit pattern of the positive normals below 2^127: the power of two is
        // at or above x and below 2x
        let mut n = 0;
        for bits in (0x0080_0000u32..0x7f00_0000).step_by(97) {
            let x = f32::from_bits(bits);
            let p = round_scale_ue8m0(x);
            assert!(p >= x && p < 2.0 * x, "x {x:e}: {p:e}");
            n += 1;
        }
        assert!(n > 10_000_000);
    }

    #[test]
    fn the_e4m3_scale_floors_amax() {
        assert_eq!(
            scale_for_amax(0.0, ScaleFormat::F32),
            AMAX_FLOOR * INV_E4M3_MAX
        );
        assert_eq!(
            scale_for_amax(448.0, ScaleFormat::F32),
            448.0 * INV_E4M3_MAX
        );
        // amax 3 x 448: a scale of about 3 (within an f32 rounding), which ue8m0 rounds up to 4
        let s = scale_for_amax(3.0 * 448.0, ScaleFormat::F32);
        assert!((s - 3.0).abs() < 1e-6, "{s}");
        assert_eq!(scale_for_amax(3.0 * 448.0, ScaleFormat::Ue8m0), 4.0);
    }
}
