//! Typed pools: single-buffer pools of one `#[derive(KvLayout)]` token row, so that a host pool
//! of one layout paired with a device pool of another does not compile.
//!
//! ```compile_fail
//! # // (see tests/ui/host-pool-other-layout.rs for the reviewed error)
//! # fn f<A: kvlayout_core::KvLayout, B: kvlayout_core::KvLayout>(
//! #     d: kvlayout_pool::TypedDevicePool<A>, h: kvlayout_pool::TypedHostPool<B>) {
//! let _ = kvlayout_pool::TypedHiCache::pair(d, h); // A != B: mismatched types
//! # }
//! ```

use std::borrow::Cow;
use std::marker::PhantomData;

use kvlayout_core::{BufferGeometry, KvLayout, MemoryLayout, PoolGeometry};

use crate::backend::CpuBackend;
use crate::error::{PairError, PoolError, TransferError};
use crate::hicache::HiCache;
use crate::plan::{Direction, Layers, PagePair, Transferred};
use crate::pool::{DevicePool, HostPool, PoolWriter};

/// A device pool of one buffer laid out as `L` (buffer name `L::NAME`).
pub struct TypedDevicePool<L: KvLayout> {
    pool: DevicePool<CpuBackend>,
    layout: PhantomData<L>,
}

impl<L: KvLayout> TypedDevicePool<L> {
    /// `layers` layers of `pages` pages of `page_size_tokens` tokens, `layer_first`.
    ///
    /// # Errors
    ///
    /// As [`DevicePool::new`] for the geometry of `L` at these sizes (an invalid value, a size
    /// that overflows, an allocation failure).
    pub fn new(layers: u64, pages: u64, page_size_tokens: u64) -> Result<Self, PoolError> {
        let geometry = PoolGeometry {
            name: format!("device {}", L::NAME),
            page_size_tokens,
            pages,
            memory_layout: MemoryLayout::LayerFirst,
            buffers: vec![BufferGeometry::new(
                Cow::Borrowed(L::NAME),
                layers,
                L::LAYOUT,
            )],
        };
        Ok(TypedDevicePool {
            pool: DevicePool::new(geometry)?,
            layout: PhantomData,
        })
    }

    /// The untyped pool.
    pub fn pool(&self) -> &DevicePool<CpuBackend> {
        &self.pool
    }

    /// Write access to the pool's bytes (before pairing). A write-only handle, not
    /// `&mut DevicePool`: through that, the pool could be swapped for one of another layout
    /// (`std::mem::swap`) while the type still said `L`.
    ///
    /// ```compile_fail
    /// # use kvlayout_core::formats::IndexKFp8;
    /// # use kvlayout_pool::{DevicePool, TypedDevicePool};
    /// fn swap(typed: &mut TypedDevicePool<IndexKFp8>, other: &mut DevicePool) {
    ///     std::mem::swap(typed.writer().pool(), other) // a shared reference
    /// }
    /// ```
    pub fn writer(&mut self) -> PoolWriter<'_, DevicePool<CpuBackend>> {
        PoolWriter::new(&mut self.pool)
    }
}

/// A host pool of one buffer laid out as `L`, made only from a [`TypedDevicePool<L>`].
pub struct TypedHostPool<L: KvLayout> {
    pool: HostPool<CpuBackend>,
    layout: PhantomData<L>,
}

impl<L: KvLayout> TypedHostPool<L> {
    /// [`HostPool::mirror_of`] the typed device pool.
    ///
    /// # Errors
    ///
    /// As [`HostPool::mirror_of`].
    pub fn mirror_of(
        device: &TypedDevicePool<L>,
        host_pages: u64,
        memory_layout: MemoryLayout,
    ) -> Result<Self, PoolError> {
        Ok(TypedHostPool {
            pool: HostPool::mirror_of(&device.pool, host_pages, memory_layout)?,
            layout: PhantomData,
        })
    }

    /// The untyped pool.
    pub fn pool(&self) -> &HostPool<CpuBackend> {
        &self.pool
    }
}

/// A [`HiCache`] over a device and a host pool of the same layout `L`. It hands out the cache
/// read only (and write-only handles), so neither a pool nor the whole cache can be replaced by
/// one of another layout:
///
/// ```compile_fail
/// # use kvlayout_core::formats::{IndexKBf16, IndexKFp8};
/// # use kvlayout_pool::{HiCache, TypedHiCache};
/// fn swap(typed: &mut TypedHiCache<IndexKFp8>, bf16: HiCache) -> HiCache {
///     std::mem::replace(typed.cache(), bf16) // a shared reference
/// }
/// ```
pub struct TypedHiCache<L: KvLayout> {
    cache: HiCache<CpuBackend>,
    layout: PhantomData<L>,
}

impl<L: KvLayout> TypedHiCache<L> {
    /// Pairs two pools of layout `L`. Both were built from `L`'s descriptor (the host mirrors
    /// the device), so they match by construction; the geometry is still compared once (an
    /// error here would be a bug in the descriptor's geometry), and the shim still checks every
    /// transfer.
    ///
    /// # Errors
    ///
    /// As [`HiCache::pair`] (a descriptor bug only).
    pub fn pair(device: TypedDevicePool<L>, host: TypedHostPool<L>) -> Result<Self, PairError> {
        Ok(TypedHiCache {
            cache: HiCache::pair(device.pool, host.pool)?,
            layout: PhantomData,
        })
    }

    /// The untyped HiCache, read only (pools, stats, plans).
    pub fn cache(&self) -> &HiCache<CpuBackend> {
        &self.cache
    }

    /// [`HiCache::transfer`].
    ///
    /// # Errors
    ///
    /// As [`HiCache::transfer`].
    pub fn transfer(
        &mut self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<Transferred, TransferError> {
        self.cache.transfer(direction, layers, pairs)
    }

    /// [`HiCache::backup`].
    ///
    /// # Errors
    ///
    /// As [`HiCache::transfer`].
    pub fn backup(&mut self, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.cache.backup(pairs)
    }

    /// [`HiCache::load`].
    ///
    /// # Errors
    ///
    /// As [`HiCache::transfer`].
    pub fn load(&mut self, pairs: &[PagePair]) -> Result<Transferred, TransferError> {
        self.cache.load(pairs)
    }

    /// [`HiCache::device_writer`].
    pub fn device_writer(&mut self) -> PoolWriter<'_, DevicePool<CpuBackend>> {
        self.cache.device_writer()
    }

    /// [`HiCache::host_writer`].
    pub fn host_writer(&mut self) -> PoolWriter<'_, HostPool<CpuBackend>> {
        self.cache.host_writer()
    }
}
