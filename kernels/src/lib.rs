//! # kvlayout-kernels
//!
//! CUDA kernels for KV-cache pools, with the pool crate's CPU backend as their reference: the
//! HiCache transfer of checked run lists between pinned host memory and the device pool
//! (page runs, and token-granular runs down to page size 1), on the copy engines or on a few
//! SMs, chosen from the runs and the model's SM carve-out ([`Gpu::transfer_runs`]).
//!
//! Kernels are CUDA C strings compiled at first use with NVRTC for the device's architecture
//! (`sm_90` on an H200) and cached per [`Gpu`]. cudarc loads libcuda and libnvrtc at run time;
//! nothing CUDA is linked at build time, and a machine without a driver gets
//! [`KernelError::NoDriver`] from [`Gpu::new`], never a panic.
//!
//! ## Driving it from a pool backend
//!
//! A CUDA backend for `kvlayout-pool` holds an `Arc<Gpu>` ([`Gpu::new`]; on
//! [`KernelError::NoDriver`] fall back to the CPU backend and say so) and maps its trait onto:
//! - memory: [`Gpu::alloc_device`] (zeroed device memory), [`Gpu::alloc_pinned_zeroed`] (pinned,
//!   mapped, not write-combined host memory); [`Gpu::read_at`] / [`Gpu::write_at`] for device
//!   byte ranges, [`PinnedBytes::as_slice`] / [`PinnedBytes::as_mut_slice`] for host ones;
//! - the shim's checked plan as it is today, a list of `(src offset, dst offset, len)` runs:
//!   [`Gpu::transfer_runs`] with [`RunOrder::SrcAscending`] for a load (host -> device) or
//!   [`RunOrder::DstAscending`] for a backup picks the path from the runs (page runs: the copy
//!   engines, leaving every SM to the model, with each group of at least 8 runs of constant
//!   pitches as one 2D copy, see [`pitched`]; token-granular runs: the token kernel on a few
//!   SMs, or on the model's carve-out, [`Gpu::set_model_carveout_sms`]); or choose yourself:
//!   [`Gpu::enqueue_copy_runs_dma`],
//!   [`Gpu::enqueue_staged_runs`] (host threads and one contiguous copy per chunk, see
//!   [`staging`]) or [`Gpu::upload_runs`] then [`Gpu::copy_runs`]. Every run is checked before any byte moves
//!   ([`KernelError::RunOutOfRange`]); the CPU reference is the pool crate's `CpuBackend`;
//! - the run order and launch shape when calling a path directly: [`RunOrder`], [`LaunchShape`].
//!
//! The index-K quantizer's CPU reference ([`index_k`]) stays here for the replay; its GPU
//! kernel and the index-list copy path (items addressed by a copy spec and index lists on
//! the device) were removed: the pool backend moves run lists only (issue 24).
//!
//! ```
//! use kvlayout_kernels::{ByteRun, validate_runs};
//! // Two runs of 2,048 B (a token of Llama-3.1-8B's K and V at page size 1) between regions of
//! // 8 KiB: both fit; a third run from offset 7,168 would end at 9,216 > 8,192 and is refused
//! // (position 2), before any byte moves.
//! let runs = [ByteRun::new(0, 4096, 2048), ByteRun::new(2048, 6144, 2048)];
//! assert!(validate_runs(&runs, 8192, 8192).is_ok());
//! let bad = [runs[0], runs[1], ByteRun::new(7168, 0, 2048)];
//! assert!(validate_runs(&bad, 8192, 8192).is_err());
//! ```

pub mod checksum_gpu;
mod copy_cpu;
pub mod copy_runs;
mod cuda_source;
pub mod device;
pub mod device_memory;
pub mod error;
pub mod gather_plan;
pub mod host_timing;
pub mod index_k;
pub mod pitched;
pub mod split_load;
pub mod staging;
pub mod test_data;

pub use copy_runs::{ByteRun, validate_runs};
pub use device::{
    BACKUP_LINK_SHARE_PERMILLE, CopyEngineHint, CopyEngineOptions, Gpu, KernelReport, LaunchShape,
    RunOrder, TransferDirection, TransferPath, driver_present, nvrtc_present,
    sort_ascending_blocks,
};
pub use device_memory::{DeviceBytes, DeviceRuns, GpuBytes, PinnedBytes};
pub use error::{KernelError, Side};
pub use gather_plan::{
    GatherChunk, GatherChunks, HostStretches, gather_chunks, host_stretches, plan_gathered_backup,
};
pub use index_k::{IndexKPages, ScaleFormat, dequantize_index_k_cpu, quantize_index_k_cpu};
pub use pitched::{PitchedRun, group_pitched};
pub use split_load::{kernel_share_permille, split_load};
