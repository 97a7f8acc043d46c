//! Memory the kernels read and write: device buffers, pinned host buffers (reachable from
//! kernels), and index lists on the device.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, result, sys};

use crate::error::KernelError;

pub(crate) fn driver_err(call: &'static str) -> impl Fn(result::DriverError) -> KernelError {
    move |e| KernelError::Driver {
        call,
        message: format!("{e:?}"),
    }
}

/// A byte buffer a kernel can address: its device-visible address and its length.
pub trait GpuBytes {
    /// Address of byte 0 as kernels see it.
    fn device_address(&self) -> u64;
    /// Length in bytes.
    fn len_bytes(&self) -> u64;
    /// The bytes for the CPU, when the CPU can read them at normal speed (pinned host memory
    /// that is not write-combined); `None` for device memory. The staged transfer path
    /// ([`crate::Gpu::enqueue_staged_runs`]) needs it on the host side.
    fn host_bytes(&self) -> Option<&[u8]> {
        None
    }
    /// [`GpuBytes::host_bytes`], mutable.
    fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        None
    }
}

/// Device memory (`cuMemAlloc`), bytes.
pub struct DeviceBytes {
    pub(crate) slice: CudaSlice<u8>,
    pub(crate) stream: Arc<CudaStream>,
}

impl DeviceBytes {
    /// The underlying cudarc slice.
    pub fn slice(&self) -> &CudaSlice<u8> {
        &self.slice
    }
}

impl GpuBytes for DeviceBytes {
    fn device_address(&self) -> u64 {
        let (ptr, _sync) = self.slice.device_ptr(&self.stream);
        ptr
    }
    fn len_bytes(&self) -> u64 {
        self.slice.len() as u64
    }
}

/// Pinned (page-locked) host memory, mapped for the device: kernels read and write it directly
/// over PCIe. Allocated with `cuMemHostAlloc(PORTABLE | DEVICEMAP)`, *not* write-combined, so
/// the CPU reads it at normal speed too (cudarc's `alloc_pinned` is write-combined).
pub struct PinnedBytes {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    pub(crate) device_ptr: u64,
    pub(crate) ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is plain host memory owned by this value; cudarc's context is Send+Sync.
unsafe impl Send for PinnedBytes {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for PinnedBytes {}

impl PinnedBytes {
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        len_bytes: usize,
    ) -> Result<PinnedBytes, KernelError> {
        if len_bytes == 0 {
            return Err(KernelError::spec(
                "len_bytes",
                "a pinned buffer needs at least 1 byte",
            ));
        }
        ctx.bind_to_thread()
            .map_err(driver_err("cuCtxSetCurrent"))?;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: a fresh allocation of len_bytes; freed once in Drop.
        let ptr = unsafe { result::malloc_host(len_bytes, flags) }
            .map_err(driver_err("cuMemHostAlloc"))? as *mut u8;
        let mut device_ptr: sys::CUdeviceptr = 0;
        // SAFETY: ptr was returned by cuMemHostAlloc with DEVICEMAP.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_ptr, ptr as *mut _, 0) };
        if let Err(e) = r.result() {
            // SAFETY: ptr came from malloc_host and is freed once here.
            let _ = unsafe { result::free_host(ptr as *mut _) };
            return Err(driver_err("cuMemHostGetDevicePointer")(e));
        }
        Ok(PinnedBytes {
            ptr,
            len: len_bytes,
            device_ptr,
            ctx: ctx.clone(),
        })
    }

    /// The bytes, for the CPU. Do not read while a kernel that writes them may be running
    /// (every safe call of [`crate::Gpu`] has finished before it returns).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The bytes, mutable, for the CPU.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl GpuBytes for PinnedBytes {
    fn device_address(&self) -> u64 {
        self.device_ptr
    }
    fn len_bytes(&self) -> u64 {
        self.len as u64
    }
    fn host_bytes(&self) -> Option<&[u8]> {
        Some(self.as_slice())
    }
    fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        Some(self.as_mut_slice())
    }
}

impl Drop for PinnedBytes {
    fn drop(&mut self) {
        // Finish any work that may still touch the buffer, then free it.
        let _ = self.ctx.bind_to_thread();
        let _ = self.ctx.synchronize();
        // SAFETY: ptr came from malloc_host and is freed exactly once.
        let _ = unsafe { result::free_host(self.ptr as *mut _) };
    }
}

/// A run list in device memory (see [`crate::copy_runs`]).
pub struct DeviceRuns {
    pub(crate) slice: CudaSlice<u64>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) host: Arc<[crate::ByteRun]>,
}

impl DeviceRuns {
    /// Number of runs.
    pub fn len(&self) -> usize {
        self.host.len()
    }

    /// True for an empty list.
    pub fn is_empty(&self) -> bool {
        self.host.is_empty()
    }

    /// The runs as uploaded.
    pub fn as_host(&self) -> &[crate::ByteRun] {
        &self.host
    }

    /// Device address of the list (`len()` runs of three `u64`: src, dst, len), for kernels
    /// outside this crate (the benchmark's peer kernel).
    pub fn device_address(&self) -> u64 {
        self.address()
    }

    pub(crate) fn address(&self) -> u64 {
        let (ptr, _sync) = self.slice.device_ptr(&self.stream);
        ptr
    }
}
