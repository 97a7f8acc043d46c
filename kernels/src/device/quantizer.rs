//! The index-K launches: DeepSeek-V3.2's fp8 quantizer into paged index-K storage and its
//! dequantizing reader (arithmetic and CPU reference in [`crate::index_k`]).

use super::{Arg, Gpu, LaunchShape};
use crate::cuda_source::QUANT_TOKENS_PER_WARP;
use crate::device_memory::{DeviceIndices, GpuBytes};
use crate::error::KernelError;
use crate::index_k::{HEAD_DIM_ELEMS, IndexKPages, ScaleFormat, check_rows};

/// The index-K kernels' parameter struct, mirrored by `IndexKParams` in the CUDA source.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct IndexKParams {
    base: u64,
    page_stride: u64,
    page_size_tokens: u64,
    slot_limit: u64,
    ue8m0: u64,
}

impl Gpu {
    fn index_k_params(
        &self,
        spec: &IndexKPages,
        cache: &dyn GpuBytes,
        format: ScaleFormat,
    ) -> Result<IndexKParams, KernelError> {
        spec.validate()?;
        crate::copy_cpu::check_len("index-K cache", spec.total_bytes, cache.len_bytes())?;
        if !cache.device_address().is_multiple_of(4) {
            return Err(KernelError::spec(
                "cache",
                format!(
                    "address {:#x} is not 4-byte aligned",
                    cache.device_address()
                ),
            ));
        }
        Ok(IndexKParams {
            base: spec.base_bytes,
            page_stride: spec.page_stride_bytes,
            page_size_tokens: spec.page_size_tokens,
            slot_limit: spec.slot_limit()?,
            ue8m0: u64::from(format == ScaleFormat::Ue8m0),
        })
    }

    /// Quantizes `keys` (bf16 `[tokens, 128]`, row-major, `tokens = slots.len()`) into the
    /// index-K pages of `cache` at `slots` (the contract of
    /// [`crate::index_k::quantize_index_k_cpu`], bit for bit), and waits. Out-of-range slots:
    /// [`KernelError::IndexOutOfRange`] (`dst_index` = the slot), nothing written.
    pub fn quantize_index_k(
        &self,
        spec: &IndexKPages,
        keys: &dyn GpuBytes,
        slots: &DeviceIndices,
        cache: &mut dyn GpuBytes,
        format: ScaleFormat,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        // SAFETY: finish() waits before the borrows end.
        unsafe { self.enqueue_quantize_index_k(spec, keys, slots, cache, format, shape)? };
        self.finish()
    }

    /// [`Gpu::quantize_index_k`] without the wait.
    ///
    /// # Safety
    /// As [`Gpu::enqueue_copy_items`]: every buffer alive and untouched until [`Gpu::finish`].
    pub unsafe fn enqueue_quantize_index_k(
        &self,
        spec: &IndexKPages,
        keys: &dyn GpuBytes,
        slots: &DeviceIndices,
        cache: &mut dyn GpuBytes,
        format: ScaleFormat,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let params = self.index_k_params(spec, &*cache, format)?;
        let key_bytes = keys.len_bytes();
        if !key_bytes.is_multiple_of(2) || !keys.device_address().is_multiple_of(8) {
            return Err(KernelError::spec(
                "keys",
                "bf16 keys need an even byte length and an 8-byte aligned address",
            ));
        }
        let tokens = check_rows("keys", (key_bytes / 2) as usize, slots.as_host())? as u64;
        if tokens == 0 {
            return Ok(());
        }
        self.enqueue_validate(slots, params.slot_limit, slots, params.slot_limit, shape)?;
        let k = self.kernels()?;
        let warps = tokens.div_ceil(QUANT_TOKENS_PER_WARP);
        let args = [
            Arg::IndexK(&params),
            Arg::Word(keys.device_address()),
            Arg::Word(tokens),
            Arg::Word(slots.address()),
            Arg::Word(cache.device_address()),
            Arg::Word(self.err_address()),
        ];
        // SAFETY: arguments match quantize_index_k; keys hold tokens * 128 bf16; the cache
        // length bounds every page (validate + check_len); slots are validated first.
        unsafe {
            self.launch(
                &k.quantize,
                "cuLaunchKernel(quantize_index_k)",
                self.grid(shape, warps * 32),
                &args,
            )
        }
    }

    /// Reads `slots` of `cache` back as f32 keys (`[tokens, 128]` into `out`, 512 bytes per
    /// token), as [`crate::index_k::dequantize_index_k_cpu`] does, bit for bit; waits.
    pub fn dequantize_index_k(
        &self,
        spec: &IndexKPages,
        cache: &dyn GpuBytes,
        slots: &DeviceIndices,
        out: &mut dyn GpuBytes,
        shape: LaunchShape,
    ) -> Result<(), KernelError> {
        let params = self.index_k_params(spec, cache, ScaleFormat::F32)?;
        let tokens = slots.len() as u64;
        let out_bytes = tokens * HEAD_DIM_ELEMS * 4;
        if out.len_bytes() != out_bytes || !out.device_address().is_multiple_of(16) {
            return Err(KernelError::Length {
                what: "dequantized output (f32 [tokens, 128], 16-byte aligned)".to_string(),
                expected: out_bytes,
                actual: out.len_bytes(),
                unit: "bytes",
            });
        }
        if tokens == 0 {
            return Ok(());
        }
        self.enqueue_validate(slots, params.slot_limit, slots, params.slot_limit, shape)?;
        let k = self.kernels()?;
        let args = [
            Arg::IndexK(&params),
            Arg::Word(cache.device_address()),
            Arg::Word(tokens),
            Arg::Word(slots.address()),
            Arg::Word(out.device_address()),
            Arg::Word(self.err_address()),
        ];
        // SAFETY: arguments match dequantize_index_k; out holds tokens * 128 f32; slots are
        // validated first.
        unsafe {
            self.launch(
                &k.dequantize,
                "cuLaunchKernel(dequantize_index_k)",
                self.grid(shape, tokens * 32),
                &args,
            )?
        };
        self.finish()
    }
}
