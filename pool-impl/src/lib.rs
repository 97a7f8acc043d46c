//! # kvlayout-pool
//!
//! Device and host KV-cache pools built from one [`PoolGeometry`], HiCache backup and load
//! between them, and the runtime shim that checks every transfer before a byte moves.
//!
//! - [`DevicePool`]: `layer_first`, one region per pool (CPU backend: ordinary memory).
//! - [`HostPool::mirror_of`]: the host pool takes every geometry fact from the device pool
//!   *instance* — only its page count, memory layout (`layer_first`, `page_first`,
//!   `page_first_direct`, `page_head`) and name differ. This removes the seed bug's second
//!   computation (a host index-K pool sized by the fp8 formula, 132 B/token, under a bf16 device
//!   pool of 256 B/token).
//! - [`HostPool::from_geometry`] + [`HiCache::pair`]: a foreign host geometry is compared once
//!   and refused with the full [`kvlayout_core::Mismatch`].
//! - [`HiCache::backup`] / [`HiCache::load`] (and `_layer`): the [`shim`] checks the request
//!   (layer, list length, page indices on both sides, duplicate destinations, fingerprints,
//!   byte ranges), then a [`Backend`] copies the runs laid from page routes computed once at
//!   pairing — no allocation per transfer once warm. Refusals move no byte; an empty list is a
//!   no-op; duplicate *source* pages are allowed. Runs execute pair by pair, so a backend that
//!   fails part way reports the pairs moved ([`TransferError::Interrupted`]) and leaves later
//!   pairs untouched ([`CpuBackend::failing_after`] injects such a fault).
//! - [`ConcurrentHiCache`]: backup, load and model writes from several threads at once on
//!   disjoint pages (checked page claims; conflicts refused as [`TransferError::Busy`]).
//! - A paired pool cannot be replaced or resized: caches hand out `&DevicePool` / `&HostPool`
//!   and write-only [`PoolWriter`]s. The per-transfer checks are on in every build; the cargo
//!   feature `unchecked` compiles out the identity and byte-range checks ([`shim`] lists
//!   which check runs where).
//! - Model configs are read by the `kvlayout-models` crate; the workloads behind
//!   `kvlayout replay` live in the `kvlayout-replay` crate.
//!
//! ```
//! use kvlayout_core::{BufferGeometry, MemoryLayout, PoolGeometry, formats};
//! use kvlayout_pool::{DevicePool, HiCache, HostPool, KvPool, PagePair};
//!
//! let device = DevicePool::new(PoolGeometry {
//!     name: "index-K, bf16".into(),
//!     page_size_tokens: 64,
//!     pages: 4,
//!     memory_layout: MemoryLayout::LayerFirst,
//!     buffers: vec![BufferGeometry::new("index_k", 2, formats::INDEX_K_BF16)],
//! })?;
//! let host = HostPool::mirror_of(&device, 8, MemoryLayout::PageFirst)?;
//! // 128 bf16 = 256 B/token, from the device instance: a 64-token page is 16384 B.
//! assert_eq!(host.geometry().stored_page_bytes(0)?, 64 * 256);
//! let mut cache = HiCache::pair(device, host)?;
//! let plan = cache.backup(&[PagePair::new(3, 5)])?;
//! assert_eq!(plan.total_bytes(), 2 * 16384); // 2 layers x one page
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`PoolGeometry`]: kvlayout_core::PoolGeometry

#![warn(missing_docs)]
#![warn(clippy::missing_errors_doc)]
#![deny(clippy::undocumented_unsafe_blocks)]

// Offsets and lengths are `u64` (the geometry's unit) and index memory as `usize` after they
// are checked against a region's length; on a 64-bit target that conversion cannot truncate.
const _: () = assert!(
    usize::BITS == 64,
    "kvlayout-pool needs a 64-bit target: u64 offsets index memory as usize"
);

pub mod backend;
pub mod checksum;
mod claim;
mod concurrent;
mod error;
mod hicache;
mod layer_map;
pub mod plan;
mod pool;
mod route;
pub mod shim;
mod transfer;
mod typed;

pub use backend::{
    Backend, BackendError, ContentFault, ContentFaultBackend, CpuBackend, CpuMem,
    FailingCpuBackend, Memory,
};
pub use checksum::{ChecksumMode, PageMismatch};
pub use concurrent::ConcurrentHiCache;
pub use error::{PairError, PoolError, PoolFact, TransferError};
pub use hicache::{HiCache, TransferMode};
pub use layer_map::LayerMap;
pub use plan::{BufferPlan, CopyRun, Direction, Layers, PagePair, TransferPlan, Transferred};
pub use pool::{DevicePool, HostPool, KvPool, PoolWriter, mirror_geometry, page_copy_runs};
pub use transfer::TransferStats;
pub use typed::{TypedDevicePool, TypedHiCache, TypedHostPool};
