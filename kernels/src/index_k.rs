//! The fp8 index-K quantizer of DeepSeek-V3.2's sparse indexer, and its dequantizing reader:
//! its CPU reference (the GPU kernels were removed: no pool backend called them, issue 24).
//!
//! A key is 128 bf16 values. Quantized it is 128 e4m3 values and one f32 scale, stored
//! `section_major` in pages of `P` tokens (SGLang `index_buf_accessor.py`, vLLM
//! `DeepseekV32IndexerCache`): a page is `[P x 128 B values][P x 4 B scales]`; token slot `s`
//! lives in page `s / P` at token `t = s % P`, its values at `page * page_stride + 128 t`, its
//! scale at `page * page_stride + 128 P + 4 t`.
//!
//! The arithmetic is DeepSeek-V3.2-Exp's `act_quant` (`inference/kernel.py`), in f32:
//! 1. `amax = max(|x|)` over the 128 values, then `amax = max(amax, 1e-4)`. So an all-zero key
//!    gets scale `1e-4 * (1/448)` (not 0) and 128 zero bytes: DeepSeek's choice, kept here.
//! 2. `scale = amax * (1/448)` with `1/448` rounded to f32 ([`INV_E4M3_MAX`]); under
//!    [`ScaleFormat::Ue8m0`] (`scale_fmt: ue8m0`) the scale is then rounded up to a power of two,
//!    `2^ceil(log2(scale))`, by exponent arithmetic (`fast_round_scale`).
//! 3. each value: `clamp(x / scale, -448, 448)` (IEEE f32 division), converted to e4m3 (the
//!    `fn` variant) rounding to nearest even, saturating. `float8`'s conversion is bit-identical
//!    with CUDA's `cvt.rn.satfinite.e4m3x2.f32` on every non-NaN f32, so this reference and the
//!    kernel agree bit for bit.
//!
//! Dequantized value: `e4m3_value * scale`, one f32 multiplication.
//!
//! Values that are not finite, as this reference computes them (not checked against
//! DeepSeek's kernel): `amax` is an f32 `max`, which skips a NaN, so one NaN value leaves the
//! scale to the others and becomes the e4m3 NaN byte `0x7f` (it dequantizes to NaN, the other
//! values as usual); one ±inf makes the scale inf, every other value 0 and the whole key
//! dequantize to NaN (0 x inf). Under `Ue8m0` a key near bf16's largest finite value gets a
//! scale of `2^127`, and its largest values dequantize to inf.

use float8::F8E4M3;
use half::bf16;
use kvlayout_core::{Arrangement, Dtype, PoolGeometry};

use crate::copy_cpu::{check_len, check_lists};
use crate::error::KernelError;

/// Elements of one index key (`index_head_dim` of DeepSeek-V3.2).
pub const HEAD_DIM_ELEMS: u64 = 128;
/// Bytes of one quantized key's values (128 e4m3).
pub const VALUE_BYTES: u64 = 128;
/// Bytes of one key's scale (one f32).
pub const SCALE_BYTES: u64 = 4;
/// The scale arithmetic (`act_quant`'s constants, [`ScaleFormat`], [`scale_for_amax`],
/// [`round_scale_ue8m0`]) is the core's one computation ([`kvlayout_core::quant`]).
pub use kvlayout_core::quant::{
    AMAX_FLOOR, E4M3_MAX, INV_E4M3_MAX, ScaleFormat, round_scale_ue8m0, scale_for_amax,
};

/// Where the pages of an index-K cache sit: page `p` at `base_bytes + p * page_stride_bytes`,
/// `page_size_tokens` tokens each, `[P x 128][P x 4]` inside the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IndexKPages {
    /// Tokens per page (`P`).
    pub page_size_tokens: u64,
    /// Pages: slots run over `0..pages * page_size_tokens`.
    pub pages: u64,
    /// Distance between pages (at least `P * 132`).
    pub page_stride_bytes: u64,
    /// Offset of page 0 in the buffer.
    pub base_bytes: u64,
    /// Bytes of the buffer the description may touch.
    pub total_bytes: u64,
}

fn mul(a: u64, b: u64, field: &str) -> Result<u64, KernelError> {
    a.checked_mul(b)
        .ok_or_else(|| KernelError::spec(field, format!("overflow: {a} * {b}")))
}

fn add(a: u64, b: u64, field: &str) -> Result<u64, KernelError> {
    a.checked_add(b)
        .ok_or_else(|| KernelError::spec(field, format!("overflow: {a} + {b}")))
}

impl IndexKPages {
    /// Checks: page size and pages at least 1; page stride at least `P * 132`; base and page
    /// stride multiples of 4 (the kernel stores values and scales as 4-byte words); every page
    /// inside `total_bytes`, computed without overflow.
    pub fn validate(&self) -> Result<(), KernelError> {
        if self.page_size_tokens == 0 {
            return Err(KernelError::spec(
                "page_size_tokens",
                "must be at least 1, got 0",
            ));
        }
        if self.pages == 0 {
            return Err(KernelError::spec("pages", "must be at least 1, got 0"));
        }
        let payload = mul(
            self.page_size_tokens,
            VALUE_BYTES + SCALE_BYTES,
            "page_size_tokens",
        )?;
        if self.page_stride_bytes < payload {
            return Err(KernelError::spec(
                "page_stride_bytes",
                format!(
                    "{} is smaller than the page payload {} x 132 = {payload}",
                    self.page_stride_bytes, self.page_size_tokens
                ),
            ));
        }
        for (field, v) in [
            ("base_bytes", self.base_bytes),
            ("page_stride_bytes", self.page_stride_bytes),
        ] {
            if !v.is_multiple_of(4) {
                return Err(KernelError::spec(
                    field,
                    format!("{v} is not a multiple of 4"),
                ));
            }
        }
        let f = "end of the last page";
        let end = add(
            add(
                self.base_bytes,
                mul(self.pages - 1, self.page_stride_bytes, f)?,
                f,
            )?,
            payload,
            f,
        )?;
        if end > self.total_bytes {
            return Err(KernelError::spec(
                "total_bytes",
                format!(
                    "the last page ends at byte {end}, past total_bytes {}",
                    self.total_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Slots available: `pages * page_size_tokens`.
    pub fn slot_limit(&self) -> Result<u64, KernelError> {
        mul(self.pages, self.page_size_tokens, "pages")
    }

    /// Byte offset of slot `slot`'s 128 values.
    pub fn values_offset_bytes(&self, slot: u64) -> Result<u64, KernelError> {
        let (page, t) = self.locate(slot)?;
        let f = "values offset";
        add(
            add(self.base_bytes, mul(page, self.page_stride_bytes, f)?, f)?,
            mul(t, VALUE_BYTES, f)?,
            f,
        )
    }

    /// Byte offset of slot `slot`'s f32 scale.
    pub fn scale_offset_bytes(&self, slot: u64) -> Result<u64, KernelError> {
        let (page, t) = self.locate(slot)?;
        let f = "scale offset";
        let page_start = add(self.base_bytes, mul(page, self.page_stride_bytes, f)?, f)?;
        let scales = add(page_start, mul(self.page_size_tokens, VALUE_BYTES, f)?, f)?;
        add(scales, mul(t, SCALE_BYTES, f)?, f)
    }

    fn locate(&self, slot: u64) -> Result<(u64, u64), KernelError> {
        let limit = self.slot_limit()?;
        if slot >= limit {
            return Err(KernelError::spec(
                "slot",
                format!("slot {slot} out of range ({limit} slots)"),
            ));
        }
        Ok((slot / self.page_size_tokens, slot % self.page_size_tokens))
    }

    /// The pages of layer `layer` of buffer `buffer` of `pool`, which must hold DeepSeek-V3.2's
    /// fp8 index-K layout (`section_major`: `values` e4m3 `[128]`, then `scale` f32 `[1]`
    /// scaling `values` per 128). Base and page stride are read off
    /// [`PoolGeometry::page_offset_bytes`] (any memory layout that stores a page whole: not `page_head`, `page_head_token`, `layer_head`, `page_unified`).
    pub fn for_pool_layer(
        pool: &PoolGeometry,
        buffer: usize,
        layer: u64,
    ) -> Result<IndexKPages, KernelError> {
        pool.validate()?;
        let buf = pool.buffer(buffer)?;
        let s = buf.layout.sections();
        let is_fp8_index_k = buf.layout.arrangement == Arrangement::SectionMajor
            && s.len() == 2
            && s[0].dtype == Dtype::F8E4M3
            && s[0].shape() == [HEAD_DIM_ELEMS]
            && s[1].dtype == Dtype::F32
            && s[1].shape() == [1];
        if !is_fp8_index_k {
            return Err(KernelError::Unsupported(format!(
                "buffer {} is not the fp8 index-K layout (section_major: values f8e4m3 [128], \
                 scale f32 [1])",
                buf.name()
            )));
        }
        if pool.memory_layout.splits_pages() {
            return Err(KernelError::Unsupported(format!(
                "{} memory layout for index-K (pages split into heads)",
                pool.memory_layout.name()
            )));
        }
        let base_bytes = pool.page_offset_bytes(buffer, layer, 0)?;
        let page_stride_bytes = if pool.pages > 1 {
            pool.page_offset_bytes(buffer, layer, 1)? - base_bytes
        } else {
            pool.stored_page_bytes(buffer)?
        };
        let spec = IndexKPages {
            // The buffer's own page size (a v2 buffer may override the pool's) in rows (a v3
            // buffer stores one row per compress_ratio tokens): the scales sit after this many
            // value rows.
            page_size_tokens: pool.buffer_page_rows(buffer)?,
            pages: pool.pages,
            page_stride_bytes,
            base_bytes,
            total_bytes: pool.total_bytes()?,
        };
        let last = pool.page_offset_bytes(buffer, layer, pool.pages - 1)?;
        if last != base_bytes + (pool.pages - 1) * page_stride_bytes {
            return Err(KernelError::Unsupported(format!(
                "pages of layer {layer} are not evenly spaced in {}",
                pool.memory_layout
            )));
        }
        spec.validate()?;
        Ok(spec)
    }
}

/// Quantizes one key: 128 e4m3 bytes and the scale.
pub fn quantize_key(key: &[bf16; 128], format: ScaleFormat) -> ([u8; 128], f32) {
    let amax = key.iter().fold(0.0f32, |m, x| m.max(x.to_f32().abs()));
    let scale = scale_for_amax(amax, format);
    let mut out = [0u8; 128];
    for (o, x) in out.iter_mut().zip(key) {
        let y = (x.to_f32() / scale).clamp(-E4M3_MAX, E4M3_MAX);
        *o = F8E4M3::from_f32(y).to_bits();
    }
    (out, scale)
}

/// Quantizes `keys` (`[tokens, 128]` bf16, row-major) into `cache` at `slots[i]` for row `i`.
/// Checked first (spec, buffer lengths, one slot per row, every slot below
/// `pages * page_size_tokens`); on any error nothing is written. Slots should be distinct (an
/// engine's `out_cache_loc` is): here a repeated slot keeps the last of its keys; the GPU
/// writer would write them in no defined order.
pub fn quantize_index_k_cpu(
    spec: &IndexKPages,
    keys: &[bf16],
    slots: &[u64],
    cache: &mut [u8],
    format: ScaleFormat,
) -> Result<(), KernelError> {
    spec.validate()?;
    check_len("index-K cache", spec.total_bytes, cache.len() as u64)?;
    let tokens = check_rows("keys", keys.len(), slots)?;
    check_slots(spec, slots)?;
    for (row, &slot) in keys.chunks_exact(128).zip(slots) {
        let key: &[bf16; 128] = row.try_into().expect("chunks_exact(128)");
        let (values, scale) = quantize_key(key, format);
        let v = spec.values_offset_bytes(slot)? as usize;
        cache[v..v + 128].copy_from_slice(&values);
        let s = spec.scale_offset_bytes(slot)? as usize;
        cache[s..s + 4].copy_from_slice(&scale.to_le_bytes());
    }
    debug_assert_eq!(tokens, slots.len());
    Ok(())
}

/// Reads `slots` back out of `cache` as f32 keys (`[tokens, 128]` into `out`): each value is
/// its e4m3 value times the token's scale. Checked like [`quantize_index_k_cpu`].
pub fn dequantize_index_k_cpu(
    spec: &IndexKPages,
    cache: &[u8],
    slots: &[u64],
    out: &mut [f32],
) -> Result<(), KernelError> {
    spec.validate()?;
    check_len("index-K cache", spec.total_bytes, cache.len() as u64)?;
    check_rows("output", out.len(), slots)?;
    check_slots(spec, slots)?;
    for (row, &slot) in out.chunks_exact_mut(128).zip(slots) {
        let v = spec.values_offset_bytes(slot)? as usize;
        let s = spec.scale_offset_bytes(slot)? as usize;
        let scale = f32::from_le_bytes(cache[s..s + 4].try_into().expect("4 bytes"));
        for (o, &b) in row.iter_mut().zip(&cache[v..v + 128]) {
            *o = F8E4M3::from_bits(b).to_f32() * scale;
        }
    }
    Ok(())
}

/// Rows of a `[tokens, 128]` array of `len` elements, which must equal the slot count.
pub(crate) fn check_rows(what: &str, len: usize, slots: &[u64]) -> Result<usize, KernelError> {
    let expected = (slots.len() as u64)
        .checked_mul(HEAD_DIM_ELEMS)
        .ok_or_else(|| KernelError::spec("slots", "overflow: slots * 128"))?;
    if len as u64 != expected {
        return Err(KernelError::Length {
            what: format!("{what} ([tokens, 128] for {} slots)", slots.len()),
            expected,
            actual: len as u64,
            unit: "elements",
        });
    }
    Ok(slots.len())
}

/// Every slot below the limit; the error reports the row as the src index.
pub(crate) fn check_slots(spec: &IndexKPages, slots: &[u64]) -> Result<(), KernelError> {
    let rows: Vec<u64> = (0..slots.len() as u64).collect();
    check_lists(&rows, slots.len() as u64, slots, spec.slot_limit()?)
}
