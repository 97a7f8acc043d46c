//! The CUDA backend (feature `cuda`): the device pool in device memory (`cuMemAlloc`), the host
//! pool in pinned, device-mapped host memory (`cuMemHostAlloc`, not write-combined), and every
//! checked [`TransferPlan`] executed by [`Gpu::transfer_runs`] of `kvlayout-kernels`, which
//! picks the path from the plan with no tuning by the user: page runs go to the copy engines
//! (`cuMemcpyBatchAsync`, and `cuMemcpy2DAsync` for groups of runs with constant pitches such as
//! every layer of a page; no SM taken from a model running next to the transfer), token-granular
//! runs (page size 1: one token of one layer per run) to the token kernel on a few SMs (8
//! without a carve-out). When the model's GEMMs leave SMs free, tell the GPU
//! (`backend.gpu().set_model_carveout_sms(k)`, [`Gpu::set_model_carveout_sms`]): loads of many
//! page runs then run on those SMs, token-granular loads too, backups of many page runs are
//! gathered on them into device staging, then copied out by the copy engines one
//! host-contiguous stretch at a time, and token-granular backups (page size 1) of one run
//! length go to the token kernel paced to 0.8 of the host link measured once
//! (`Gpu::set_backup_link_share_permille` changes the share): SM stores near the link's limit
//! slow the model. Token backups of several run lengths (DeepSeek-V3.2's 656 B MLA and 132 B
//! index-K rows) cannot be paced: on a carve-out they are gathered as page runs are when that
//! pays, else moved unpaced by the run-list kernel.
//!
//! The shim has checked the plan before the backend sees it; the chooser checks every run
//! against both regions again on the host before any byte moves, whatever the path, so a bad
//! run list (from an unverified pairing, or a direct call) is refused whole with the
//! same [`BackendError::OutOfRange`] the CPU backend gives, naming the same run and side. Loads
//! walk page runs in host-address order ([`RunOrder::SrcAscending`]), backups too
//! ([`RunOrder::DstAscending`]): every order moves the same bytes, and PCIe traffic stays
//! sequential on a page-major host pool. Long lists of token runs are not sorted (that cost
//! more host time than the copy): neighbours are merged in the plan's order, and a list of at
//! most 32,768 runs (a layer's load at page size 1) is put in host order at bucket granularity
//! in two passes, which moved DeepSeek-V3 MLA loads 1.35x faster next to a GEMM on the H200
//! than the engine's random slot order.
//!
//! cudarc loads libcuda and libnvrtc at run time: a machine without a driver builds and runs
//! the CPU backend, and [`CudaBackend::new`] returns [`KernelError::NoDriver`] there, never a
//! panic.
//!
//! [`TransferPlan`]: crate::plan::TransferPlan

use std::sync::Arc;

pub use kvlayout_kernels::KernelError;
use kvlayout_kernels::{
    ByteRun, DeviceBytes, Gpu, GpuBytes, PinnedBytes, RunOrder, TransferPath, driver_present,
};

use super::{Backend, BackendError, Memory, check_range};
use crate::plan::CopyRun;

/// Pools on one NVIDIA GPU: device memory for the device pool, pinned mapped host memory for
/// the host pool, copy engines or the run-list kernel for backup and load. Clones share the GPU
/// (one context and stream, kernels compiled once).
#[derive(Clone)]
pub struct CudaBackend {
    gpu: Arc<Gpu>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("arch", &self.gpu.arch())
            .field("sm_count", &self.gpu.sm_count())
            .finish()
    }
}

/// Device pool memory: a device allocation of `len_bytes` (`None` for an empty region, which
/// CUDA cannot allocate).
pub struct CudaDeviceMem {
    bytes: Option<DeviceBytes>,
    len_bytes: u64,
}

/// Host pool memory: a pinned, device-mapped host allocation of `len_bytes` (`None` for an
/// empty region).
pub struct CudaHostMem {
    bytes: Option<PinnedBytes>,
    len_bytes: u64,
}

impl Memory for CudaDeviceMem {
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
}

impl Memory for CudaHostMem {
    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }
}

impl CudaHostMem {
    /// The host bytes, for the CPU. No copy is running on them while they can be reached:
    /// every backend call but the `enqueue_*` ones waits for its copies, and a
    /// [`crate::HiCache`] waits for enqueued ones before it hands out its pools.
    pub fn as_slice(&self) -> &[u8] {
        self.bytes.as_ref().map_or(&[], |b| b.as_slice())
    }
}

fn driver(e: KernelError) -> BackendError {
    BackendError::Driver(e.to_string())
}

/// A kernel's refusal of run `run` as the CPU backend words it: the source side when the run
/// leaves the source region, else the destination side.
fn out_of_range(
    (src_side, src_len): (&'static str, u64),
    (dst_side, dst_len): (&'static str, u64),
    run: ByteRun,
) -> BackendError {
    check_range(src_side, run.src_offset_bytes, run.len_bytes, src_len)
        .and_then(|()| check_range(dst_side, run.dst_offset_bytes, run.len_bytes, dst_len))
        .err()
        .unwrap_or_else(|| {
            BackendError::Driver(format!(
                "the copy kernel refused run {run:?}, which fits the {src_len}-byte {src_side} \
                 and the {dst_len}-byte {dst_side} region"
            ))
        })
}

impl CudaBackend {
    /// Opens GPU `ordinal` and compiles the kernels (NVRTC, for the device's architecture).
    ///
    /// # Errors
    ///
    /// [`KernelError::NoDriver`] when libcuda cannot be loaded (probed first, never a panic),
    /// [`KernelError::NoNvrtc`] without libnvrtc, [`KernelError::Driver`] when there is no such
    /// device, [`KernelError::Compile`] when NVRTC fails.
    pub fn new(ordinal: usize) -> Result<CudaBackend, KernelError> {
        let gpu = Gpu::new(ordinal)?;
        gpu.compile()?;
        Ok(CudaBackend { gpu: Arc::new(gpu) })
    }

    /// A backend on an opened GPU.
    pub fn with_gpu(gpu: Arc<Gpu>) -> CudaBackend {
        CudaBackend { gpu }
    }

    /// True when the CUDA driver library can be loaded on this machine.
    pub fn driver_present() -> bool {
        driver_present()
    }

    /// The GPU.
    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// `sm_90 (132 SMs)`: the device as reports name it.
    pub fn describe(&self) -> String {
        format!("{} ({} SMs)", self.gpu.arch(), self.gpu.sm_count())
    }

    fn alloc_len(side: &'static str, len_bytes: u64) -> Result<usize, BackendError> {
        usize::try_from(len_bytes).map_err(|_| BackendError::Alloc {
            side,
            len_bytes,
            reason: "larger than the address space".into(),
        })
    }

    /// Executes `runs` from `src` to `dst` on the GPU by the path the runs call for
    /// ([`Gpu::transfer_runs`]): all checked before any byte moves. `wait` false: enqueued
    /// only ([`Gpu::enqueue_transfer_runs`]); [`Backend::wait`] completes it.
    ///
    /// # Safety
    /// With `wait` false, as [`Backend::enqueue_device_to_host`].
    unsafe fn copy(
        &self,
        (src_side, src, src_len): (&'static str, Option<&dyn GpuBytes>, u64),
        (dst_side, dst, dst_len): (&'static str, Option<&mut dyn GpuBytes>, u64),
        runs: &[CopyRun],
        order: RunOrder,
        wait: bool,
    ) -> Result<(), BackendError> {
        let (Some(src_mem), Some(dst_mem)) = (src, dst) else {
            // An empty region (nothing allocated): only empty runs at offset 0 fit.
            for r in runs {
                check_range(src_side, r.src_offset_bytes, r.len_bytes, src_len)?;
                check_range(dst_side, r.dst_offset_bytes, r.len_bytes, dst_len)?;
            }
            return Ok(());
        };
        if runs.is_empty() {
            return Ok(());
        }
        let list: Vec<ByteRun> = runs
            .iter()
            .map(|r| ByteRun::new(r.src_offset_bytes, r.dst_offset_bytes, r.len_bytes))
            .collect();
        let result = match wait {
            true => self.gpu.transfer_runs(src_mem, dst_mem, &list, order),
            // SAFETY: forwarded to the caller (`enqueue_*`): both regions stay alive and
            // untouched by the CPU until `wait` (Gpu::finish) returns.
            false => unsafe {
                self.gpu
                    .enqueue_transfer_runs(src_mem, dst_mem, &list, order)
            },
        };
        match result {
            Ok(
                TransferPath::CopyEngines { .. }
                | TransferPath::SmKernel { .. }
                | TransferPath::SplitLoad { .. }
                | TransferPath::GatheredBackup { .. },
            ) => Ok(()),
            Err(KernelError::RunOutOfRange { run, .. }) => {
                Err(out_of_range((src_side, src_len), (dst_side, dst_len), run))
            }
            Err(e) => Err(driver(e)),
        }
    }
}

// SAFETY: every copy of a backend and its clones goes on the one stream of their shared `Gpu`
// (stream order); `wait` is `Gpu::finish`, which synchronises that stream before it returns and
// never calls back; `shares_waits_with` is true only for the same `Gpu` (the same stream).
unsafe impl Backend for CudaBackend {
    type DeviceMem = CudaDeviceMem;
    type HostMem = CudaHostMem;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn alloc_device(&self, len_bytes: u64) -> Result<CudaDeviceMem, BackendError> {
        let len = Self::alloc_len("device", len_bytes)?;
        let bytes = match len {
            0 => None,
            _ => Some(
                self.gpu
                    .alloc_device(len)
                    .map_err(|e| BackendError::Alloc {
                        side: "device",
                        len_bytes,
                        reason: e.to_string(),
                    })?,
            ),
        };
        Ok(CudaDeviceMem { bytes, len_bytes })
    }

    fn alloc_host(&self, len_bytes: u64) -> Result<CudaHostMem, BackendError> {
        let len = Self::alloc_len("host", len_bytes)?;
        let bytes = match len {
            0 => None,
            _ => Some(
                self.gpu
                    .alloc_pinned_zeroed(len)
                    .map_err(|e| BackendError::Alloc {
                        side: "host",
                        len_bytes,
                        reason: e.to_string(),
                    })?,
            ),
        };
        Ok(CudaHostMem { bytes, len_bytes })
    }

    fn read_device(
        &self,
        mem: &CudaDeviceMem,
        offset_bytes: u64,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        check_range("device", offset_bytes, out.len() as u64, mem.len_bytes)?;
        match &mem.bytes {
            Some(b) if !out.is_empty() => self.gpu.read_at(b, offset_bytes, out).map_err(driver),
            _ => Ok(()),
        }
    }

    fn write_device(
        &self,
        mem: &mut CudaDeviceMem,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), BackendError> {
        check_range("device", offset_bytes, data.len() as u64, mem.len_bytes)?;
        match &mut mem.bytes {
            Some(b) if !data.is_empty() => self.gpu.write_at(b, offset_bytes, data).map_err(driver),
            _ => Ok(()),
        }
    }

    fn read_host(
        &self,
        mem: &CudaHostMem,
        offset_bytes: u64,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        check_range("host", offset_bytes, out.len() as u64, mem.len_bytes)?;
        // In range: checked against the allocation's length just above.
        let start = offset_bytes as usize;
        out.copy_from_slice(&mem.as_slice()[start..start + out.len()]);
        Ok(())
    }

    fn write_host(
        &self,
        mem: &mut CudaHostMem,
        offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), BackendError> {
        check_range("host", offset_bytes, data.len() as u64, mem.len_bytes)?;
        if let Some(b) = &mut mem.bytes {
            let start = offset_bytes as usize;
            b.as_mut_slice()[start..start + data.len()].copy_from_slice(data);
        }
        Ok(())
    }

    fn device_to_host(
        &self,
        src: &CudaDeviceMem,
        dst: &mut CudaHostMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        // SAFETY: `wait` true: the copy has finished when it returns.
        unsafe {
            self.copy(
                src.side(),
                dst.side_mut(),
                runs,
                RunOrder::DstAscending,
                true,
            )
        }
    }

    fn host_to_device(
        &self,
        src: &CudaHostMem,
        dst: &mut CudaDeviceMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        // SAFETY: `wait` true: the copy has finished when it returns.
        unsafe {
            self.copy(
                src.side(),
                dst.side_mut(),
                runs,
                RunOrder::SrcAscending,
                true,
            )
        }
    }

    unsafe fn enqueue_device_to_host(
        &self,
        src: &CudaDeviceMem,
        dst: &mut CudaHostMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        // SAFETY: forwarded to the caller.
        unsafe {
            self.copy(
                src.side(),
                dst.side_mut(),
                runs,
                RunOrder::DstAscending,
                false,
            )
        }
    }

    unsafe fn enqueue_host_to_device(
        &self,
        src: &CudaHostMem,
        dst: &mut CudaDeviceMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        // SAFETY: forwarded to the caller.
        unsafe {
            self.copy(
                src.side(),
                dst.side_mut(),
                runs,
                RunOrder::SrcAscending,
                false,
            )
        }
    }

    /// [`Gpu::finish`]: waits for the stream; a run the GPU refused is a driver error here
    /// (the shim and the host-side check passed it, so no region lengths name its side).
    fn wait(&self) -> Result<(), BackendError> {
        self.gpu.finish().map_err(driver)
    }

    /// Clones of one backend share one `Gpu` (one stream): one wait covers both.
    fn shares_waits_with(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.gpu, &other.gpu)
    }
}

impl CudaDeviceMem {
    /// The side as [`CudaBackend::copy`] takes it.
    fn side(&self) -> (&'static str, Option<&dyn GpuBytes>, u64) {
        let bytes = self.bytes.as_ref().map(|b| b as &dyn GpuBytes);
        ("device", bytes, self.len_bytes)
    }

    /// [`CudaDeviceMem::side`], writable.
    fn side_mut(&mut self) -> (&'static str, Option<&mut dyn GpuBytes>, u64) {
        let bytes = self.bytes.as_mut().map(|b| b as &mut dyn GpuBytes);
        ("device", bytes, self.len_bytes)
    }
}

impl CudaHostMem {
    /// The side as [`CudaBackend::copy`] takes it.
    fn side(&self) -> (&'static str, Option<&dyn GpuBytes>, u64) {
        let bytes = self.bytes.as_ref().map(|b| b as &dyn GpuBytes);
        ("host", bytes, self.len_bytes)
    }

    /// [`CudaHostMem::side`], writable.
    fn side_mut(&mut self) -> (&'static str, Option<&mut dyn GpuBytes>, u64) {
        let bytes = self.bytes.as_mut().map(|b| b as &mut dyn GpuBytes);
        ("host", bytes, self.len_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_refusal_names_the_side_the_cpu_backend_names() {
        // Run 16 bytes at src 56 of a 64-byte source: 56 + 16 = 72 > 64, the source side.
        let e = out_of_range(("device", 64), ("host", 128), ByteRun::new(56, 0, 16));
        assert_eq!(
            e,
            BackendError::OutOfRange {
                side: "device",
                start_bytes: 56,
                end_bytes: 72,
                len_bytes: 64
            }
        );
        // Source fits (0 + 16 <= 64); dst 120 + 16 = 136 > 128: the destination side.
        let e = out_of_range(("host", 64), ("device", 128), ByteRun::new(0, 120, 16));
        assert_eq!(
            e,
            BackendError::OutOfRange {
                side: "device",
                start_bytes: 120,
                end_bytes: 136,
                len_bytes: 128
            }
        );
        // An end past u64::MAX saturates, as check_range reports it.
        let e = out_of_range(("host", 64), ("device", 128), ByteRun::new(u64::MAX, 0, 2));
        assert_eq!(
            e,
            BackendError::OutOfRange {
                side: "host",
                start_bytes: u64::MAX,
                end_bytes: u64::MAX,
                len_bytes: 64
            }
        );
    }

    #[test]
    fn the_constructor_agrees_with_the_driver_probe() {
        // Without libcuda (CI) the constructor must say exactly NoDriver; with one, any error
        // must be another (no device, no NVRTC, compile), and success must name the device.
        // With KVLAYOUT_REQUIRE_GPU set (the device machine), a GPU must open.
        let present = CudaBackend::driver_present();
        let required = std::env::var_os("KVLAYOUT_REQUIRE_GPU").is_some();
        match CudaBackend::new(0) {
            Err(e) if !present => {
                assert!(
                    !required,
                    "KVLAYOUT_REQUIRE_GPU is set but libcuda is missing"
                );
                assert_eq!(e, KernelError::NoDriver);
            }
            Err(e) => {
                assert!(
                    !required,
                    "KVLAYOUT_REQUIRE_GPU is set but GPU 0 did not open: {e}"
                );
                assert_ne!(e, KernelError::NoDriver, "the probe found libcuda");
            }
            Ok(b) => {
                assert!(
                    present,
                    "a backend opened although the probe found no libcuda"
                );
                assert_eq!(b.name(), "cuda");
                let sm = format!("({} SMs)", b.gpu().sm_count());
                assert!(b.describe().starts_with("sm_") && b.describe().ends_with(&sm));
            }
        }
    }
}
