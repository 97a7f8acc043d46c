//! Page checksums of a CUDA torch tensor on its own device (`kvlayout.checksum/v1` through the
//! Rust NVRTC kernel, [`kvlayout_kernels::checksum_gpu`]), bit for bit the CPU's.
//!
//! The tensor is read in place: its device address, byte length and device index come from
//! `kvlayout.tensors._cuda_bytes` (attribute reads, no Python loop), and the kernel runs on
//! the tensor's device's primary context (the one PyTorch uses) on PyTorch's current stream
//! of that device, so it sees every write PyTorch enqueued before; the call waits for the
//! result. libcuda and libnvrtc are loaded at run time (cudarc, dynamic loading): the wheel
//! builds and imports without CUDA, and a CUDA tensor on a machine where the driver cannot be
//! loaded is refused naming `data`. The kernel is compiled once per device, at first use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;
use kvlayout_core::checksum::PageChecksumKey;
use kvlayout_kernels::checksum_gpu::ChecksumKernels;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A C-contiguous CUDA tensor's bytes, as `kvlayout.tensors._cuda_bytes` reads them.
pub struct CudaTensor {
    /// Device address of the first byte.
    pub address: u64,
    /// Bytes.
    pub len_bytes: u64,
    /// CUDA device index.
    pub device: usize,
    /// PyTorch's current stream of that device (`CUstream`; 0: the legacy default stream).
    pub stream: u64,
}

/// `Some` for a CUDA torch tensor (`is_cuda` true), read through
/// `kvlayout.tensors._cuda_bytes` (which refuses a non-contiguous one naming `what`, the
/// caller's argument); `None` for anything else.
pub fn cuda_tensor(data: &Bound<'_, PyAny>, what: &str) -> PyResult<Option<CudaTensor>> {
    let py = data.py();
    let is_cuda = data.hasattr(pyo3::intern!(py, "is_cuda"))?
        && data.getattr(pyo3::intern!(py, "is_cuda"))?.is_truthy()?;
    if !is_cuda {
        return Ok(None);
    }
    let (address, len_bytes, device, stream): (u64, u64, usize, u64) = py
        .import("kvlayout.tensors")?
        .call_method1("_cuda_bytes", (data, what))?
        .extract()?;
    Ok(Some(CudaTensor {
        address,
        len_bytes,
        device,
        stream,
    }))
}

/// The compiled kernel of each device used so far.
type Devices = HashMap<usize, Arc<(Arc<CudaContext>, ChecksumKernels)>>;
static DEVICES: Mutex<Option<Devices>> = Mutex::new(None);

/// The primary context and compiled kernel of `device` (compiled at first use).
fn device(what: &str, device: usize) -> PyResult<Arc<(Arc<CudaContext>, ChecksumKernels)>> {
    if !kvlayout_kernels::driver_present() {
        return Err(PyValueError::new_err(format!(
            "{what}: a cuda:{device} tensor, but the CUDA driver (libcuda) cannot be loaded here: \
             page checksums of CUDA tensors need it (or copy the layer to host memory)"
        )));
    }
    let mut guard = DEVICES.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(d) = map.get(&device) {
        return Ok(d.clone());
    }
    let ctx = CudaContext::new(device).map_err(|e| {
        PyRuntimeError::new_err(format!(
            "{what}: cuda:{device}: cuDevicePrimaryCtxRetain: {e:?}"
        ))
    })?;
    // SAFETY: every launch and copy of this module goes through one stream per call (the
    // caller's), ordered by that stream: cudarc's per-buffer event tracking is not needed.
    unsafe { ctx.disable_event_tracking() };
    let kernels = ChecksumKernels::for_context(&ctx)
        .map_err(|e| PyRuntimeError::new_err(format!("{what}: cuda:{device}: {e}")))?;
    let d = Arc::new((ctx, kernels));
    map.insert(device, d.clone());
    Ok(d)
}

/// The checksum of each page of `pages` in `t` (one layer of one buffer laid `[page][page
/// stride]`), on `t`'s device; the same errors as the CPU path for a page past the end.
pub fn page_sums(
    t: &CudaTensor,
    key: &PageChecksumKey,
    stride_bytes: u64,
    pages: &[u64],
    what: &str,
) -> PyResult<Vec<u64>> {
    let mut offsets = Vec::with_capacity(pages.len());
    for &p in pages {
        let start = p.checked_mul(stride_bytes);
        match start.and_then(|s| s.checked_add(key.payload_bytes)) {
            Some(end) if end <= t.len_bytes => offsets.push(start.unwrap_or(0)),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "{what}: page {p} ({stride_bytes} B stride, {} B payload) ends past the {} bytes given",
                    key.payload_bytes, t.len_bytes
                )));
            }
        }
    }
    if offsets.is_empty() {
        return Ok(Vec::new());
    }
    let d = device(what, t.device)?;
    let (ctx, kernels) = (&d.0, &d.1);
    // SAFETY: `t.stream` is PyTorch's current stream of `t.device`, which PyTorch keeps alive;
    // the work enqueued here is ordered after PyTorch's on it and waited for below.
    let stream = unsafe { ctx.wrap_borrowed_stream(t.stream as cudarc::driver::sys::CUstream) };
    // SAFETY: `t.address .. + t.len_bytes` is the live tensor's memory on `t.device` (the caller
    // holds the tensor for the whole call, which waits for the result).
    unsafe {
        kernels.page_checksums_at(
            &stream,
            t.address,
            t.len_bytes,
            &offsets,
            key.payload_bytes,
            (key.token_fingerprint, key.layer_id),
            None,
        )
    }
    .map_err(|e| PyRuntimeError::new_err(format!("{what}: cuda:{}: {e}", t.device)))
}
