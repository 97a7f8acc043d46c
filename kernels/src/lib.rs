//! # kvlayout-kernels
//!
//! CUDA kernels for KV-cache pools, each with a CPU reference in Rust that implements the same
//! contract with the same checks: the HiCache transfer between pinned host memory and the
//! device pool (token- or page-granular items, one layer or many, index lists on the device),
//! and DeepSeek-V3.2's fp8 index-K quantizer with its dequantizing reader.
//!
//! Kernels are CUDA C strings ([`cuda_source`]) compiled at first use with NVRTC for the
//! device's architecture (`sm_90` on an H200) and cached per [`Gpu`]. cudarc loads libcuda and
//! libnvrtc at run time; nothing CUDA is linked at build time, and a machine without a driver
//! gets [`KernelError::NoDriver`] from [`Gpu::new`], never a panic.
//!
//! A copy is described by a [`CopySpec`] (item size and, per side, base and strides, checked
//! once), best planned from two pool geometries with [`CopySpec::for_pool_buffer`]. Both
//! backends validate every index before moving a byte: a refused copy leaves both sides as they
//! were.
//!
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
//!   engines, leaving every SM to the model, with each group of at least
//!   [`MIN_PITCHED_LINES`] runs of constant pitches as one 2D copy, see [`pitched`];
//!   token-granular runs: the run-list kernel on [`SM_BUDGET`] SMs); or choose yourself: [`Gpu::enqueue_copy_runs_dma`],
//!   [`Gpu::enqueue_staged_runs`] (host threads and one contiguous copy per chunk, see
//!   [`staging`]) or [`Gpu::upload_runs`] then [`Gpu::copy_runs`]. Every run is checked before any byte moves
//!   ([`KernelError::RunOutOfRange`]); the CPU reference is the pool crate's `CpuBackend`;
//! - or, without per-run offsets, [`CopySpec::for_pool_buffer`] (one spec per buffer, or per part
//!   of a `section_major` token) with page or token index lists ([`Gpu::upload_indices`]) and
//!   [`Gpu::copy_items_multi`]; [`copy_items_cpu`] is the CPU backend's equivalent;
//! - the fp8 index-K cache: [`IndexKPages::for_pool_layer`], [`Gpu::quantize_index_k`],
//!   [`Gpu::dequantize_index_k`] (CPU: [`quantize_index_k_cpu`], [`dequantize_index_k_cpu`]).
//!
//! ```
//! use kvlayout_kernels::{CopySpec, SideSpec, copy_items_cpu};
//! // Two pages of 2 tokens of 4 bytes, one layer: move token 3 (page 1, token 1) to token 0.
//! let side = SideSpec {
//!     base_bytes: 0, layer_stride_bytes: 16, page_stride_bytes: 8, item_stride_bytes: 4,
//!     layers: 1, pages: 2, total_bytes: 16,
//! };
//! let spec = CopySpec { item_bytes: 4, items_per_page: 2, layers: 0..1, src: side, dst: side };
//! let src: Vec<u8> = (0..16).collect();
//! let mut dst = vec![0xEEu8; 16];
//! copy_items_cpu(&spec, &src, &mut dst, &[3], &[0]).unwrap();
//! assert_eq!(&dst[0..4], &[12, 13, 14, 15]); // token 3 sits at 1 * 8 + 1 * 4 = 12
//! // An index past 2 pages x 2 tokens is refused and nothing is written.
//! assert!(copy_items_cpu(&spec, &src, &mut dst, &[0, 4], &[1, 2]).is_err());
//! assert_eq!(&dst[4..8], &[0xEE; 4]);
//! ```

pub mod checksum_gpu;
pub mod copy_cpu;
pub mod copy_runs;
pub mod copy_spec;
pub mod cuda_source;
pub mod device;
pub mod device_memory;
pub mod error;
pub mod gather_plan;
pub mod index_k;
pub mod pitched;
pub mod split_load;
pub mod staging;
pub mod test_data;

pub use copy_cpu::{copy_items_cpu, validate_index_lists};
pub use copy_runs::{ByteRun, validate_runs};
pub use copy_spec::{CopySpec, Granularity, SideSpec};
pub use device::{
    CARVEOUT_MIN_RUNS, COPY_ENGINE_MIN_MEAN_RUN_BYTES, CopyEngineHint, CopyEngineOptions,
    CopyOrder, GATHER_FIRST_CHUNK_BYTES, GATHER_SLOT_BYTES, GATHER_SLOTS, Gpu, KernelReport,
    LaunchShape, MAX_COPY_ENGINE_LANES, MIN_MEAN_BLOCK_RUNS, MIN_PITCHED_LINES,
    PARALLEL_SORT_MIN_RUNS, RUN_RING_SLOT_RUNS, RUN_RING_SLOTS, RunOrder, SELF_CHECK_MAX_ITEMS,
    SM_BUDGET, STAGING_CHUNK_BYTES, STAGING_MAX_PIECES, STAGING_SLOTS, STAGING_WARP_RUN_BYTES,
    TransferDirection, TransferPath, driver_present, nvrtc_present, sort_ascending_blocks,
};
pub use device_memory::{DeviceBytes, DeviceIndices, DeviceRuns, GpuBytes, PinnedBytes};
pub use error::{KernelError, Side};
pub use gather_plan::{
    GatherChunk, GatherChunks, HostStretches, gather_chunks, host_stretches, plan_gathered_backup,
};
pub use index_k::{IndexKPages, ScaleFormat, dequantize_index_k_cpu, quantize_index_k_cpu};
pub use pitched::{PitchedRun, group_pitched};
pub use split_load::{
    SPLIT_KERNEL_BLOCKS_PER_SM, SPLIT_SHORT_RUN_BYTES, kernel_share_permille, split_load,
};
