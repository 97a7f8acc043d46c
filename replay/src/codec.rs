//! Element codecs: f32 values to a token layout's section bytes and back, for the workload
//! generators and the sparse indexer of [`crate::synthetic`] and [`crate::store`].
//!
//! A value section with a scale section (one scale per `block_elems` elements) is quantized per
//! block. e4m3 blocks use DeepSeek-V3.2's `act_quant` arithmetic
//! ([`kvlayout_core::quant::scale_for_amax`], which the GPU quantizer's CPU reference uses):
//! `scale = max(amax, 1e-4) * f32(1/448)`, rounded up to a power of two for a `ue8m0` scale
//! section (`scale_fmt: ue8m0`), and each element `clamp(value / scale, -448, 448)` converted to
//! e4m3 (round to nearest even; `float8` matches CUDA's `__nv_fp8_e4m3` bit for bit), so a
//! 128-element block encodes exactly as `kvlayout_kernels::index_k::quantize_key` (tested).
//! Other element types: an `f32` scale is `amax / max`, a `ue8m0` scale the next power of two
//! at or above it (OCP MX; [`kvlayout_core::quant::ue8m0_code`], by exponent arithmetic), the
//! element `value / scale` rounded by the type's conversion
//! (`half::bf16::from_f32` matches `__float2bfloat16`; e2m1 rounds to the nearest of
//! {0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to the even code, saturating at 6). Decoding is
//! `element * scale`. fp4 e2m1 is packed two per byte, element `2i` in the low nibble.
//! Byte sections (`u8`, `i8`) are padding: written as zeros, decoded as their byte values.

use float8::{F8E4M3, F8E5M2};
use half::{bf16, f16};
use kvlayout_core::quant::{E4M3_MAX, ScaleFormat, scale_for_amax, ue8m0_code, ue8m0_value};
use kvlayout_core::{Dtype, LayoutError, TokenLayout};

/// An element type the codec does not handle, or a layout it cannot walk.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// No codec for this dtype in this role.
    #[error("sections[{section}]: no codec for dtype {dtype} as a {role}")]
    Unsupported {
        /// Section index.
        section: usize,
        /// Its dtype.
        dtype: Dtype,
        /// `value` or `scale`.
        role: &'static str,
    },
    /// A section's bytes have the wrong length.
    #[error("sections[{section}]: expected {expected} bytes, got {got}")]
    Length {
        /// Section index.
        section: usize,
        /// Bytes per token of the section.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// The layout itself is invalid.
    #[error("layout: {0}")]
    Layout(#[from] LayoutError),
}

/// Largest finite magnitude of a quantized element type (the scale divisor).
fn range_max(dtype: Dtype) -> Option<f32> {
    match dtype {
        Dtype::F8E4M3 => Some(448.0),
        Dtype::F8E5M2 => Some(57344.0),
        Dtype::F4E2M1 => Some(6.0),
        _ => None,
    }
}

/// e2m1 magnitudes by code 0..8.
const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The e2m1 code of `x`: the nearest grid magnitude, a tie to the even code (the one whose
/// mantissa bit is 0), saturating at 6.
fn e2m1_encode(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 8u8 } else { 0 };
    let a = x.abs();
    let mut best = 0u8;
    for (code, &m) in E2M1.iter().enumerate() {
        let (d, best_d) = ((a - m).abs(), (a - E2M1[best as usize]).abs());
        if d < best_d || (d == best_d && code % 2 == 0) {
            best = code as u8;
        }
    }
    sign | best
}

fn e2m1_decode(code: u8) -> f32 {
    let m = E2M1[(code & 7) as usize];
    if code & 8 != 0 { -m } else { m }
}

fn put_elems(dtype: Dtype, section: usize, values: &[f32]) -> Result<Vec<u8>, CodecError> {
    let out = match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::Bf16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::F8E4M3 => values
            .iter()
            .map(|&v| F8E4M3::from_f32(v).to_bits())
            .collect(),
        Dtype::F8E5M2 => values
            .iter()
            .map(|&v| F8E5M2::from_f32(v).to_bits())
            .collect(),
        Dtype::F4E2M1 => values
            .chunks(2)
            .map(|p| e2m1_encode(p[0]) | (e2m1_encode(*p.get(1).unwrap_or(&0.0)) << 4))
            .collect(),
        Dtype::U8 | Dtype::I8 => vec![0u8; values.len()],
        dtype => {
            return Err(CodecError::Unsupported {
                section,
                dtype,
                role: "value",
            });
        }
    };
    Ok(out)
}

fn get_elems(dtype: Dtype, section: usize, bytes: &[u8]) -> Result<Vec<f32>, CodecError> {
    let out = match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F8E4M3 => bytes
            .iter()
            .map(|&b| F8E4M3::from_bits(b).to_f32())
            .collect(),
        Dtype::F8E5M2 => bytes
            .iter()
            .map(|&b| F8E5M2::from_bits(b).to_f32())
            .collect(),
        Dtype::F4E2M1 => bytes
            .iter()
            .flat_map(|&b| [e2m1_decode(b & 0xf), e2m1_decode(b >> 4)])
            .collect(),
        Dtype::Ue8m0 => bytes.iter().map(|&b| ue8m0_value(b)).collect(),
        Dtype::U8 => bytes.iter().map(|&b| b as f32).collect(),
        Dtype::I8 => bytes.iter().map(|&b| b as i8 as f32).collect(),
        dtype => {
            return Err(CodecError::Unsupported {
                section,
                dtype,
                role: "value",
            });
        }
    };
    Ok(out)
}

/// The scale section of value section `target`, if any: (scale section index, block elems).
fn scale_of(layout: &TokenLayout, target: usize) -> Option<(usize, u64)> {
    layout.sections().iter().enumerate().find_map(|(i, s)| {
        s.scale
            .filter(|r| r.target == target)
            .map(|r| (i, r.block_elems))
    })
}

/// Encodes one token: `value(section, elem)` gives each value section's elements (scale and
/// byte sections are not asked). Returns each section's bytes, in layout order.
///
/// # Errors
///
/// CodecError::Unsupported naming the section when a value section's dtype has no codec (or no
/// finite range to scale into); a layout error when the layout is invalid.
pub fn encode_token(
    layout: &TokenLayout,
    mut value: impl FnMut(usize, u64) -> f32,
) -> Result<Vec<Vec<u8>>, CodecError> {
    let sections = layout.sections();
    let mut out: Vec<Vec<u8>> = vec![Vec::new(); sections.len()];
    for (i, s) in sections.iter().enumerate() {
        if s.scale.is_some() {
            continue;
        }
        let elems = layout.section_elems(i)?;
        let values: Vec<f32> = if matches!(s.dtype, Dtype::U8 | Dtype::I8) {
            vec![0.0; elems as usize]
        } else {
            (0..elems).map(|e| value(i, e)).collect()
        };
        let Some((si, block)) = scale_of(layout, i) else {
            out[i] = put_elems(s.dtype, i, &values)?;
            continue;
        };
        let scale_dtype = sections[si].dtype;
        let max = range_max(s.dtype).ok_or(CodecError::Unsupported {
            section: i,
            dtype: s.dtype,
            role: "scaled value",
        })?;
        let mut scales = Vec::new();
        let mut scaled = Vec::with_capacity(values.len());
        if s.dtype == Dtype::F8E4M3 {
            // DeepSeek-V3.2's act_quant (kvlayout-kernels' CPU reference of the GPU quantizer).
            let format = match scale_dtype {
                Dtype::F32 => ScaleFormat::F32,
                Dtype::Ue8m0 => ScaleFormat::Ue8m0,
                dtype => {
                    return Err(CodecError::Unsupported {
                        section: si,
                        dtype,
                        role: "scale",
                    });
                }
            };
            let mut elems = Vec::with_capacity(values.len());
            for block_values in values.chunks(block as usize) {
                let amax = block_values.iter().fold(0f32, |m, v| m.max(v.abs()));
                let scale = scale_for_amax(amax, format);
                match scale_dtype {
                    Dtype::F32 => scales.extend(scale.to_le_bytes()),
                    // A power of two: its biased f32 exponent is the ue8m0 byte.
                    _ => scales.push((scale.to_bits() >> 23) as u8),
                }
                elems.extend(
                    block_values.iter().map(|v| {
                        F8E4M3::from_f32((v / scale).clamp(-E4M3_MAX, E4M3_MAX)).to_bits()
                    }),
                );
            }
            out[i] = elems;
            out[si] = scales;
            continue;
        }
        for block_values in values.chunks(block as usize) {
            let amax = block_values.iter().fold(0f32, |m, v| m.max(v.abs()));
            let raw = if amax > 0.0 { amax / max } else { 1.0 };
            let (scale, bytes) = match scale_dtype {
                Dtype::F32 => (raw, raw.to_le_bytes().to_vec()),
                Dtype::Ue8m0 => {
                    let bits = ue8m0_code(raw);
                    (ue8m0_value(bits), vec![bits])
                }
                dtype => {
                    return Err(CodecError::Unsupported {
                        section: si,
                        dtype,
                        role: "scale",
                    });
                }
            };
            scales.extend(bytes);
            scaled.extend(block_values.iter().map(|v| v / scale));
        }
        out[i] = put_elems(s.dtype, i, &scaled)?;
        out[si] = scales;
    }
    Ok(out)
}

/// Decodes value section `section` of one token (`sections`: every section's bytes, as
/// [`kvlayout_pool::KvPool::read_token`] returns them), multiplied by its block scales if it has any.
///
/// # Errors
///
/// CodecError::Length naming the section and both byte counts when `sections[section]` or its scale
/// section holds another number of bytes than the layout gives; CodecError::Unsupported when the
/// dtype has no codec; a layout error when `section` is out of range.
pub fn decode_section(
    layout: &TokenLayout,
    section: usize,
    sections: &[&[u8]],
) -> Result<Vec<f32>, CodecError> {
    let s = layout.section(section)?;
    let bytes = sections.get(section).copied().unwrap_or_default();
    let expected = layout.section_bytes(section)?;
    if bytes.len() as u64 != expected {
        return Err(CodecError::Length {
            section,
            expected,
            got: bytes.len() as u64,
        });
    }
    let mut values = get_elems(s.dtype, section, bytes)?;
    if let Some((si, block)) = scale_of(layout, section) {
        let sb = sections.get(si).copied().unwrap_or_default();
        let sexp = layout.section_bytes(si)?;
        if sb.len() as u64 != sexp {
            return Err(CodecError::Length {
                section: si,
                expected: sexp,
                got: sb.len() as u64,
            });
        }
        let scales = get_elems(layout.sections()[si].dtype, si, sb)?;
        for (v, scale) in values
            .chunks_mut(block as usize)
            .zip(scales.iter().copied())
        {
            v.iter_mut().for_each(|x| *x *= scale);
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvlayout_core::formats;

    #[test]
    fn bf16_index_k_is_128_little_endian_bf16() {
        // 1.0 in bf16 is 0x3f80, stored little-endian: [0x80, 0x3f]; -2.0 is 0xc000.
        let bytes = encode_token(
            &formats::INDEX_K_BF16,
            |_, e| if e == 0 { 1.0 } else { -2.0 },
        )
        .unwrap();
        assert_eq!(bytes.len(), 1);
        assert_eq!(bytes[0].len(), 256);
        assert_eq!(&bytes[0][..4], &[0x80, 0x3f, 0x00, 0xc0]);
        let back = decode_section(&formats::INDEX_K_BF16, 0, &[&bytes[0]]).unwrap();
        assert_eq!(back[0], 1.0);
        assert_eq!(back[127], -2.0);
    }

    #[test]
    fn fp8_index_k_scale_is_amax_times_f32_one_over_448() {
        // DeepSeek act_quant: scale = amax * f32(1/448) (bits 0x3b124925), not amax / 448.
        // amax 224: 224 * 0x3b124925 as f32; 224 / scale rounds to 448 = e4m3 0x7e (clamped
        // at 448); 1 / scale = 2.0 (to within e4m3's precision) = e4m3 0x40.
        let bytes = encode_token(
            &formats::INDEX_K_FP8,
            |_, e| if e == 0 { 224.0 } else { 1.0 },
        )
        .unwrap();
        let scale = 224.0f32 * f32::from_bits(0x3b12_4925);
        assert_eq!(bytes[1], scale.to_le_bytes());
        assert_eq!(bytes[0][0], 0x7e);
        assert_eq!(bytes[0][1], 0x40);
    }

    #[test]
    fn fp8_index_k_encodes_as_the_kernels_quantizer() {
        // A bf16 key with values over several binades: the codec and quantize_key (the CPU
        // reference the GPU kernel is checked against) give the same 128 bytes and scale.
        use kvlayout_kernels::index_k::quantize_key;
        let key: [half::bf16; 128] = std::array::from_fn(|e| {
            half::bf16::from_f32(((e as f32) - 60.0) * 0.37 * if e % 3 == 0 { 8.0 } else { 1.0 })
        });
        let bytes = encode_token(&formats::INDEX_K_FP8, |_, e| key[e as usize].to_f32()).unwrap();
        let (values, scale) = quantize_key(&key, ScaleFormat::F32);
        assert_eq!(bytes[0], values);
        assert_eq!(bytes[1], scale.to_le_bytes());
    }

    #[test]
    fn fp8_with_ue8m0_scales_rounds_the_scale_up_to_a_power_of_two() {
        // DeepSeek-V4 MLA: 448 e4m3 NoPE with one ue8m0 scale per 64. All values 1.0: amax 1,
        // scale = 1 * f32(1/448) = 0.00223..., rounded up to 2^-8 = 0.00390625 (2^-9 =
        // 0.00195... is below): ue8m0 byte 127 - 8 = 119. Element 1 / 2^-8 = 256 = 2^8: e4m3
        // exponent field 8 + 7 = 15, mantissa 0: 0b0_1111_000 = 0x78.
        let bytes = encode_token(&formats::DSV4_MLA_FP8, |_, _| 1.0).unwrap();
        assert_eq!(bytes[0], vec![0x78; 448]);
        assert_eq!(bytes[2], vec![119; 7]);
        let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        let back = decode_section(&formats::DSV4_MLA_FP8, 0, &slices).unwrap();
        assert_eq!(back, vec![1.0; 448]);
    }

    #[test]
    fn e2m1_rounds_half_to_even() {
        // e2m1 grid {0, 0.5, 1, 1.5, 2, 3, 4, 6}, codes 0..7; a tie goes to the even code.
        // 0.75: between 0.5 (code 1) and 1.0 (code 2) -> 1.0.
        assert_eq!(E2M1[e2m1_encode(0.75) as usize], 1.0);
        // 2.5: between 2.0 (code 4) and 3.0 (code 5) -> 2.0.
        assert_eq!(E2M1[e2m1_encode(2.5) as usize], 2.0);
        // 5.0: between 4.0 (code 6) and 6.0 (code 7) -> 4.0.
        assert_eq!(E2M1[e2m1_encode(5.0) as usize], 4.0);
        // 0.25: between 0 (code 0) and 0.5 (code 1) -> 0; 1.25 -> 1.0; 1.75 -> 2.0; 3.5 -> 4.0.
        assert_eq!(e2m1_encode(0.25), 0);
        assert_eq!(E2M1[e2m1_encode(1.25) as usize], 1.0);
        assert_eq!(E2M1[e2m1_encode(1.75) as usize], 2.0);
        assert_eq!(E2M1[e2m1_encode(3.5) as usize], 4.0);
        // Off ties: nearest; past 6: saturate; the sign is bit 3.
        assert_eq!(E2M1[e2m1_encode(2.6) as usize], 3.0);
        assert_eq!(E2M1[e2m1_encode(100.0) as usize], 6.0);
        assert_eq!(e2m1_encode(-0.75), 8 | 2);
    }

    #[test]
    fn fp4_index_k_packs_two_per_byte_with_ue8m0_scales() {
        // Block amax 6 -> scale 6 / 6 = 1 = 2^0 -> ue8m0 127. 3.0 is e2m1 code 5, -0.5 is
        // 8 | 1 = 9: byte = 5 | 9 << 4 = 0x95.
        let bytes = encode_token(&formats::INDEX_K_FP4, |_, e| match e {
            0 => 3.0,
            1 => -0.5,
            _ => 6.0,
        })
        .unwrap();
        assert_eq!(bytes[0].len(), 64);
        assert_eq!(bytes[0][0], 0x95);
        assert_eq!(bytes[1], [127, 127, 127, 127]);
        let slices: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        let back = decode_section(&formats::INDEX_K_FP4, 0, &slices).unwrap();
        assert_eq!(&back[..3], &[3.0, -0.5, 6.0]);
    }

    #[test]
    fn wrong_length_is_an_error() {
        let err = decode_section(&formats::INDEX_K_BF16, 0, &[&[0u8; 132]]).unwrap_err();
        assert_eq!(err.to_string(), "sections[0]: expected 256 bytes, got 132");
    }
}
