//! The copy engines' two driver calls, on a caller's stream: a batch of runs
//! (`cuMemcpyBatchAsync`) and one 2D copy of a pitched group (`cuMemcpy2DAsync`). The checked
//! paths ([`crate::Gpu::enqueue_copy_runs_dma`], [`crate::Gpu::transfer_runs`]) check every run
//! and call these; a caller that orders its own streams (`gpu_bench`) may call them directly.

use cudarc::driver::{CudaStream, sys};

use super::CopyEngineHint;
use crate::copy_runs::ByteRun;
use crate::device_memory::driver_err;
use crate::error::KernelError;
use crate::pitched::PitchedRun;

/// `cuMemcpyBatchAsync` of `runs` on `stream`, at most `runs_per_call` per call (0 counts as
/// 1): run `r` copies `r.len_bytes` from `src_base + r.src_offset_bytes` to
/// `dst_base + r.dst_offset_bytes` (unified addresses), in stream order.
///
/// # Safety
/// Every run lies inside live allocations that stay alive, and untouched by the CPU, until the
/// stream has finished. Nothing is checked here.
pub unsafe fn batch_on(
    stream: &CudaStream,
    (src_base, dst_base): (u64, u64),
    runs: &[ByteRun],
    hint: CopyEngineHint,
    runs_per_call: usize,
) -> Result<(), KernelError> {
    let location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: 0,
    };
    let mut attrs = [sys::CUmemcpyAttributes {
        srcAccessOrder: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
        srcLocHint: location,
        dstLocHint: location,
        flags: match hint {
            CopyEngineHint::Default => sys::CUmemcpyFlags::CU_MEMCPY_FLAG_DEFAULT as u32,
            CopyEngineHint::PreferOverlapWithCompute => {
                sys::CUmemcpyFlags::CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE as u32
            }
        },
    }];
    let mut attr_idx = [0usize];
    for chunk in runs.chunks(runs_per_call.max(1)) {
        let mut dsts: Vec<u64> = chunk
            .iter()
            .map(|r| dst_base + r.dst_offset_bytes)
            .collect();
        let mut srcs: Vec<u64> = chunk
            .iter()
            .map(|r| src_base + r.src_offset_bytes)
            .collect();
        let mut sizes: Vec<usize> = chunk.iter().map(|r| r.len_bytes as usize).collect();
        // SAFETY: three arrays of chunk.len() entries, one attribute applying from entry 0;
        // the driver reads them during the call. Every range lies inside a live buffer
        // (checked by the caller).
        unsafe {
            sys::cuMemcpyBatchAsync_v2(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                chunk.len(),
                attrs.as_mut_ptr(),
                attr_idx.as_mut_ptr(),
                1,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(driver_err("cuMemcpyBatchAsync"))?;
    }
    Ok(())
}

/// One 2D copy of a pitched group on `stream`: `g.lines()` lines of `g.len_bytes()` from
/// `src_base + g.src_offset_bytes()` (pitch `g.src_pitch_bytes()`) to
/// `dst_base + g.dst_offset_bytes()` (pitch `g.dst_pitch_bytes()`), unified addresses.
///
/// # Safety
/// As [`batch_on`], for every line of the group.
pub unsafe fn pitched_on(
    stream: &CudaStream,
    (src_base, dst_base): (u64, u64),
    g: &PitchedRun,
) -> Result<(), KernelError> {
    let unified = sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED;
    let copy = sys::CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: unified,
        srcHost: std::ptr::null(),
        srcDevice: src_base + g.src_offset_bytes(),
        srcArray: std::ptr::null_mut(),
        srcPitch: g.src_pitch_bytes() as usize,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: unified,
        dstHost: std::ptr::null_mut(),
        dstDevice: dst_base + g.dst_offset_bytes(),
        dstArray: std::ptr::null_mut(),
        dstPitch: g.dst_pitch_bytes() as usize,
        WidthInBytes: g.len_bytes() as usize,
        Height: g.lines() as usize,
    };
    // SAFETY: every line of the group is a checked run inside both buffers (unified
    // addresses of a device allocation and of pinned, mapped host memory); the driver reads
    // the descriptor during the call.
    unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }
        .result()
        .map_err(driver_err("cuMemcpy2DAsync"))
}
