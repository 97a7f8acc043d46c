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
use crate::hicache::HiCache;
use crate::pool::{DevicePool, HostPool, PoolError};

/// A device pool of one buffer laid out as `L` (buffer name `L::NAME`).
pub struct TypedDevicePool<L: KvLayout> {
    pool: DevicePool<CpuBackend>,
    layout: PhantomData<L>,
}

impl<L: KvLayout> TypedDevicePool<L> {
    /// `layers` layers of `pages` pages of `page_size_tokens` tokens, `layer_first`.
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

    /// The untyped pool, mutable.
    pub fn pool_mut(&mut self) -> &mut DevicePool<CpuBackend> {
        &mut self.pool
    }
}

/// A host pool of one buffer laid out as `L`, made only from a [`TypedDevicePool<L>`].
pub struct TypedHostPool<L: KvLayout> {
    pool: HostPool<CpuBackend>,
    layout: PhantomData<L>,
}

impl<L: KvLayout> TypedHostPool<L> {
    /// [`HostPool::mirror_of`] the typed device pool.
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

/// A [`HiCache`] over a device and a host pool of the same layout `L`.
pub struct TypedHiCache<L: KvLayout> {
    cache: HiCache<CpuBackend>,
    layout: PhantomData<L>,
}

impl<L: KvLayout> TypedHiCache<L> {
    /// Pairs two pools of layout `L`. Both were built from `L`'s descriptor (the host mirrors
    /// the device), so they match by construction; the geometry is still compared once, and
    /// the shim still checks every transfer.
    pub fn pair(device: TypedDevicePool<L>, host: TypedHostPool<L>) -> Self {
        let cache = HiCache::pair(device.pool, host.pool)
            .expect("pools of one KvLayout type have one geometry");
        TypedHiCache {
            cache,
            layout: PhantomData,
        }
    }

    /// The untyped HiCache (backup, load, pools).
    pub fn cache(&mut self) -> &mut HiCache<CpuBackend> {
        &mut self.cache
    }
}
