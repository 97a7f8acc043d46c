//! The quantizer rows of `gpu_bench`: DeepSeek-V3.2's fp8 index-K quantizer against the
//! device-to-device copy rate, checked bit for bit against the CPU reference in the same run,
//! and the dump for `kernels/scripts/torch_check.py`.

use kvlayout_kernels::index_k::quantize_index_k_cpu;
use kvlayout_kernels::test_data::SplitMix64;
use kvlayout_kernels::{Gpu, GpuBytes, IndexKPages, KernelError, LaunchShape, ScaleFormat};

use crate::{PAGE_TOKENS, gbps, time_median};

pub fn quantizer_bench(gpu: &Gpu, dump: Option<&str>) -> Result<String, KernelError> {
    // 1M tokens: 256 MiB of bf16 keys in, 132 MiB of index-K out (several times the 60 MB L2).
    let pages: u64 = 16384;
    let tokens = (pages * PAGE_TOKENS) as usize;
    let spec = IndexKPages {
        page_size_tokens: PAGE_TOKENS,
        pages,
        page_stride_bytes: PAGE_TOKENS * 132,
        base_bytes: 0,
        total_bytes: pages * PAGE_TOKENS * 132,
    };
    let mut rng = SplitMix64::new(7);
    let keys = rng.keys(tokens);
    // Pages in random order, tokens of a page consecutive (a paged allocator's slots).
    let page_order = rng.distinct_below(pages, pages as usize);
    let slots: Vec<u64> = page_order
        .iter()
        .flat_map(|p| (0..PAGE_TOKENS).map(move |t| p * PAGE_TOKENS + t))
        .collect();
    let gkeys = gpu.upload_bf16(&keys)?;
    let gslots = gpu.upload_indices(&slots)?;
    let mut cache = gpu.alloc_device(spec.total_bytes as usize)?;
    let shape = LaunchShape::default();
    let mut out = String::from(
        "| quantizer / copy (device memory) | bytes read + written | GB/s | ratio to D2D copy |\n|---|---:|---:|---:|\n",
    );
    // D2D copy rate of a 1 GiB buffer, read + written bytes.
    let copy_bytes: u64 = 1 << 30;
    let a = gpu.alloc_device(copy_bytes as usize)?;
    let b = gpu.alloc_device(copy_bytes as usize)?;
    let d2d = time_median(gpu, 2, 11, || {
        // SAFETY: both buffers are 1 GiB and live.
        unsafe { gpu.enqueue_memcpy(b.device_address(), a.device_address(), copy_bytes) }
    })?;
    let d2d_rate = gbps(2 * copy_bytes, d2d);
    out += &format!(
        "| cuMemcpyAsync D2D 1 GiB | {} | {:.1} | 1.000 |\n",
        2 * copy_bytes,
        d2d_rate
    );
    drop(a);
    drop(b);
    let moved = tokens as u64 * (256 + 132);
    for blocks_per_sm in [4u32, 16] {
        let shape = LaunchShape {
            blocks_per_sm,
            ..LaunchShape::default()
        };
        let secs = time_median(gpu, 3, 21, || {
            // SAFETY: buffers live until finish() inside time_median.
            unsafe {
                gpu.enqueue_quantize_index_k(
                    &spec,
                    &gkeys,
                    &gslots,
                    &mut cache,
                    ScaleFormat::F32,
                    shape,
                )
            }
        })?;
        out += &format!(
            "| quantize_index_k F32, {blocks_per_sm} blocks/SM | {moved} | {:.1} | {:.3} |\n",
            gbps(moved, secs),
            gbps(moved, secs) / d2d_rate
        );
    }
    for format in [ScaleFormat::F32, ScaleFormat::Ue8m0] {
        let secs = time_median(gpu, 3, 21, || {
            // SAFETY: buffers live until finish() inside time_median.
            unsafe {
                gpu.enqueue_quantize_index_k(&spec, &gkeys, &gslots, &mut cache, format, shape)
            }
        })?;
        out += &format!(
            "| quantize_index_k {format:?}, {tokens} tokens (256 B in, 132 B out each) | {moved} | {:.1} | {:.3} |\n",
            gbps(moved, secs),
            gbps(moved, secs) / d2d_rate
        );
        // Check this very run against the CPU reference.
        let got = gpu.read(&cache)?;
        let mut expect = vec![0u8; spec.total_bytes as usize];
        quantize_index_k_cpu(&spec, &keys, &slots, &mut expect, format)?;
        let same = got == expect;
        out += &format!("|  (bit-exact against the CPU reference: {same}) | | | |\n");
        if !same {
            return Err(KernelError::Unsupported(format!(
                "{format:?}: GPU quantizer differs from the CPU reference"
            )));
        }
    }
    if let Some(dir) = dump {
        dump_for_torch(gpu, dir)?;
        out += &format!("\nquantizer inputs/outputs written to {dir} for torch_check.py\n");
    }
    Ok(out)
}

/// 8192 keys quantized into slots 0..8192 (128 pages of 64), both scale formats, as raw files.
fn dump_for_torch(gpu: &Gpu, dir: &str) -> Result<(), KernelError> {
    let io = |e: std::io::Error| KernelError::Unsupported(format!("writing {dir}: {e}"));
    std::fs::create_dir_all(dir).map_err(io)?;
    let pages = 128u64;
    let tokens = (pages * PAGE_TOKENS) as usize;
    let spec = IndexKPages {
        page_size_tokens: PAGE_TOKENS,
        pages,
        page_stride_bytes: PAGE_TOKENS * 132,
        base_bytes: 0,
        total_bytes: pages * PAGE_TOKENS * 132,
    };
    let mut rng = SplitMix64::new(2026);
    let mut keys = rng.keys(tokens);
    // Include the edge cases: an all-zero key, and a key whose values hit e4m3's saturation.
    for k in &mut keys[0..128] {
        *k = half::bf16::ZERO;
    }
    let keys_bytes: Vec<u8> = keys
        .iter()
        .flat_map(|k| k.to_bits().to_le_bytes())
        .collect();
    std::fs::write(format!("{dir}/keys_bf16.bin"), &keys_bytes).map_err(io)?;
    let slots: Vec<u64> = (0..tokens as u64).collect();
    let gkeys = gpu.upload(&keys_bytes)?;
    let gslots = gpu.upload_indices(&slots)?;
    for (format, name) in [(ScaleFormat::F32, "f32"), (ScaleFormat::Ue8m0, "ue8m0")] {
        let mut cache = gpu.alloc_device(spec.total_bytes as usize)?;
        gpu.quantize_index_k(
            &spec,
            &gkeys,
            &gslots,
            &mut cache,
            format,
            LaunchShape::default(),
        )?;
        std::fs::write(format!("{dir}/cache_{name}.bin"), gpu.read(&cache)?).map_err(io)?;
    }
    Ok(())
}
