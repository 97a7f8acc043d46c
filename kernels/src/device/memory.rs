//! Allocation, uploads and byte access: device and pinned memory, run lists on the device, plain `cuMemcpyAsync` for baselines.

use std::sync::Arc;

use cudarc::driver::sys;

use super::{Gpu, RunOrder};
use crate::copy_runs::ByteRun;
use crate::device_memory::{DeviceBytes, DeviceRuns, PinnedBytes, driver_err};
use crate::error::KernelError;

/// `offset .. offset + len` inside a buffer of `buffer_len` bytes, or [`KernelError::Length`].
fn checked_range(
    what: &str,
    offset_bytes: u64,
    len: usize,
    buffer_len: usize,
) -> Result<std::ops::Range<usize>, KernelError> {
    let end = offset_bytes.checked_add(len as u64);
    match end {
        Some(end) if end <= buffer_len as u64 => Ok(offset_bytes as usize..end as usize),
        _ => Err(KernelError::Length {
            what: format!("{what} of {len} bytes at offset {offset_bytes}: buffer"),
            expected: offset_bytes.saturating_add(len as u64),
            actual: buffer_len as u64,
            unit: "bytes",
        }),
    }
}

impl Gpu {
    /// Device memory of `len_bytes` bytes, zeroed.
    pub fn alloc_device(&self, len_bytes: usize) -> Result<DeviceBytes, KernelError> {
        if len_bytes == 0 {
            return Err(KernelError::spec(
                "len_bytes",
                "a device buffer needs at least 1 byte",
            ));
        }
        let slice = self
            .stream
            .alloc_zeros::<u8>(len_bytes)
            .map_err(driver_err("cuMemAlloc"))?;
        Ok(DeviceBytes {
            slice,
            stream: self.stream.clone(),
        })
    }

    /// Pinned, device-mapped host memory of `len_bytes` bytes (contents unspecified until
    /// written).
    pub fn alloc_pinned(&self, len_bytes: usize) -> Result<PinnedBytes, KernelError> {
        PinnedBytes::new(&self.ctx, len_bytes)
    }

    /// Device memory holding `bytes`.
    pub fn upload(&self, bytes: &[u8]) -> Result<DeviceBytes, KernelError> {
        let mut d = self.alloc_device(bytes.len())?;
        self.write(&mut d, bytes)?;
        Ok(d)
    }

    /// Overwrites device memory with `bytes` (same length).
    pub fn write(&self, dst: &mut DeviceBytes, bytes: &[u8]) -> Result<(), KernelError> {
        if bytes.len() != dst.slice.len() {
            return Err(KernelError::Length {
                what: "bytes written to a device buffer".to_string(),
                expected: dst.slice.len() as u64,
                actual: bytes.len() as u64,
                unit: "bytes",
            });
        }
        self.stream
            .memcpy_htod(bytes, &mut dst.slice)
            .map_err(driver_err("cuMemcpyHtoDAsync"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }

    /// The bytes of device memory.
    pub fn read(&self, src: &DeviceBytes) -> Result<Vec<u8>, KernelError> {
        let v = self
            .stream
            .clone_dtoh(&src.slice)
            .map_err(driver_err("cuMemcpyDtoHAsync"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        Ok(v)
    }

    /// Copies `out.len()` bytes at `offset_bytes` of device memory into `out` (checked range).
    pub fn read_at(
        &self,
        src: &DeviceBytes,
        offset_bytes: u64,
        out: &mut [u8],
    ) -> Result<(), KernelError> {
        let range = checked_range("device read", offset_bytes, out.len(), src.slice.len())?;
        if range.is_empty() {
            return Ok(());
        }
        let view = src.slice.slice(range);
        self.stream
            .memcpy_dtoh(&view, out)
            .map_err(driver_err("cuMemcpyDtoHAsync"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }

    /// Writes `data` at `offset_bytes` of device memory (checked range).
    pub fn write_at(
        &self,
        dst: &mut DeviceBytes,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), KernelError> {
        let range = checked_range("device write", offset_bytes, data.len(), dst.slice.len())?;
        if range.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice.slice_mut(range);
        self.stream
            .memcpy_htod(data, &mut view)
            .map_err(driver_err("cuMemcpyHtoDAsync"))?;
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))
    }

    /// Pinned, device-mapped host memory of `len_bytes` bytes, zeroed by the CPU.
    pub fn alloc_pinned_zeroed(&self, len_bytes: usize) -> Result<PinnedBytes, KernelError> {
        let mut p = PinnedBytes::new(&self.ctx, len_bytes)?;
        p.as_mut_slice().fill(0);
        Ok(p)
    }

    /// A run list on the device, executed in `order` (errors still name positions of `runs`
    /// as given).
    pub fn upload_runs(
        &self,
        runs: &[ByteRun],
        order: RunOrder,
    ) -> Result<DeviceRuns, KernelError> {
        let mut sorted: Vec<ByteRun> = runs.to_vec();
        match order {
            RunOrder::AsGiven => {}
            RunOrder::SrcAscending => sorted.sort_by_key(|r| r.src_offset_bytes),
            RunOrder::DstAscending => sorted.sort_by_key(|r| r.dst_offset_bytes),
        }
        let words: Vec<u64> = sorted
            .iter()
            .flat_map(|r| [r.src_offset_bytes, r.dst_offset_bytes, r.len_bytes])
            .collect();
        let mut slice = self
            .stream
            .alloc_zeros::<u64>(words.len().max(3))
            .map_err(driver_err("cuMemAlloc"))?;
        if !words.is_empty() {
            let mut view = slice.slice_mut(0..words.len());
            self.stream
                .memcpy_htod(&words, &mut view)
                .map_err(driver_err("cuMemcpyHtoDAsync"))?;
        }
        self.stream
            .synchronize()
            .map_err(driver_err("cuStreamSynchronize"))?;
        Ok(DeviceRuns {
            slice,
            stream: self.stream.clone(),
            host: Arc::from(runs),
        })
    }

    /// Enqueues one `cuMemcpyAsync` of `bytes` bytes between two device-visible addresses
    /// (device or pinned host memory; unified addressing picks the direction). For baselines.
    ///
    /// # Safety
    /// Both ranges must lie inside live allocations until [`Gpu::finish`] returns.
    pub unsafe fn enqueue_memcpy(&self, dst: u64, src: u64, bytes: u64) -> Result<(), KernelError> {
        // SAFETY: forwarded to the caller.
        unsafe { sys::cuMemcpyAsync(dst, src, bytes as usize, self.stream.cu_stream()) }
            .result()
            .map_err(driver_err("cuMemcpyAsync"))
    }
}
