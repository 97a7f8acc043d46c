//! HiCache: a device pool paired with a host pool, and backup (device -> host) / load
//! (host -> device) of page lists, per layer or for all layers (SGLang `HiCacheController`).

use kvlayout_core::{Mismatch, compare};

use crate::backend::{Backend, CpuBackend};
use crate::plan::{Direction, Layers, PagePair, TransferPlan};
use crate::pool::{DevicePool, HostPool, KvPool};
use crate::shim::{self, Side, TransferError};

/// Why a pairing was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PairError {
    /// The host pool's geometry cannot exchange pages with the device pool's: every differing
    /// field, `field: device value, host value`.
    #[error("host pool does not match the device pool:\n{0}")]
    Mismatch(Mismatch),
}

/// How transfers are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferMode {
    /// The shim checks every transfer ([`shim::checked_plan`]).
    Checked,
    /// No check, one item size (the host's) on both sides ([`shim::legacy_plan`]): what an
    /// engine without kvlayout does. For demonstrations (`kvlayout replay --no-verify`).
    Unverified,
}

/// Counters of one HiCache's transfers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Backup calls that moved data.
    pub backups: u64,
    /// Load calls that moved data.
    pub loads: u64,
    /// Pages backed up (pairs, counted once for all layers of an all-layer call; per-layer
    /// calls count pairs of layer 0 only).
    pub pages_backed_up: u64,
    /// Pages loaded (counted as for backups).
    pub pages_loaded: u64,
    /// Bytes copied device -> host.
    pub bytes_backed_up: u64,
    /// Bytes copied host -> device.
    pub bytes_loaded: u64,
    /// Transfers the shim refused (no byte moved).
    pub refused: u64,
}

/// A device pool and its host pool.
pub struct HiCache<B: Backend = CpuBackend> {
    device: DevicePool<B>,
    host: HostPool<B>,
    mode: TransferMode,
    stats: TransferStats,
}

impl<B: Backend> HiCache<B> {
    /// Pairs `host` with `device` after comparing their geometries once
    /// ([`kvlayout_core::compare`]); refuses with the full mismatch. A host made by
    /// [`HostPool::mirror_of`] always pairs with its device pool.
    pub fn pair(device: DevicePool<B>, host: HostPool<B>) -> Result<Self, PairError> {
        compare(device.geometry(), host.geometry()).map_err(PairError::Mismatch)?;
        Ok(HiCache {
            device,
            host,
            mode: TransferMode::Checked,
            stats: TransferStats::default(),
        })
    }

    /// Pairs without any check, and transfers without any check, with the host's item size on
    /// both sides: the behaviour of an engine without kvlayout (SGLang's HiCache kernels check
    /// only the index tensors, `item_size % 8 == 0` and the layer count). For demonstrating
    /// what the shim prevents.
    pub fn pair_unverified(device: DevicePool<B>, host: HostPool<B>) -> Self {
        HiCache {
            device,
            host,
            mode: TransferMode::Unverified,
            stats: TransferStats::default(),
        }
    }

    /// The transfer mode.
    pub fn mode(&self) -> TransferMode {
        self.mode
    }

    /// The device pool.
    pub fn device(&self) -> &DevicePool<B> {
        &self.device
    }

    /// The device pool, mutable (the model writes new tokens here).
    pub fn device_mut(&mut self) -> &mut DevicePool<B> {
        &mut self.device
    }

    /// The host pool.
    pub fn host(&self) -> &HostPool<B> {
        &self.host
    }

    /// The host pool, mutable.
    pub fn host_mut(&mut self) -> &mut HostPool<B> {
        &mut self.host
    }

    /// Transfer counters so far.
    pub fn stats(&self) -> TransferStats {
        self.stats
    }

    /// Both pools back.
    pub fn into_parts(self) -> (DevicePool<B>, HostPool<B>) {
        (self.device, self.host)
    }

    fn sides(&self) -> (Side<'_>, Side<'_>) {
        (
            Side {
                geometry: self.device.geometry(),
                fingerprint: self.device.fingerprint(),
                len_bytes: self.device.len_bytes(),
            },
            Side {
                geometry: self.host.geometry(),
                fingerprint: self.host.fingerprint(),
                len_bytes: self.host.len_bytes(),
            },
        )
    }

    /// The plan a transfer would execute, checked (in [`TransferMode::Checked`]) — nothing is
    /// copied.
    pub fn plan(
        &self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<TransferPlan, TransferError> {
        let (d, h) = self.sides();
        match self.mode {
            TransferMode::Checked => shim::checked_plan(direction, d, h, layers, pairs),
            TransferMode::Unverified => {
                shim::legacy_plan(direction, d.geometry, h.geometry, layers, pairs)
            }
        }
    }

    /// Plans, checks, then executes a transfer. On any error nothing was copied and the refusal
    /// is counted.
    pub fn transfer(
        &mut self,
        direction: Direction,
        layers: Layers,
        pairs: &[PagePair],
    ) -> Result<TransferPlan, TransferError> {
        let plan = match self.plan(direction, layers, pairs) {
            Ok(p) => p,
            Err(e) => {
                self.stats.refused += 1;
                return Err(e);
            }
        };
        let runs = plan.flat_runs();
        let backend = self.device.backend().clone();
        let result = match direction {
            Direction::Backup => {
                backend.device_to_host(self.device.memory(), self.host.memory_mut(), &runs)
            }
            Direction::Load => {
                backend.host_to_device(self.host.memory(), self.device.memory_mut(), &runs)
            }
        };
        if let Err(e) = result {
            self.stats.refused += 1;
            return Err(TransferError::Backend(e));
        }
        let bytes = plan.total_bytes();
        let counted_pages = match layers {
            Layers::All | Layers::One(0) => pairs.len() as u64,
            Layers::One(_) => 0,
        };
        match direction {
            Direction::Backup => {
                self.stats.backups += 1;
                self.stats.pages_backed_up += counted_pages;
                self.stats.bytes_backed_up = self.stats.bytes_backed_up.saturating_add(bytes);
            }
            Direction::Load => {
                self.stats.loads += 1;
                self.stats.pages_loaded += counted_pages;
                self.stats.bytes_loaded = self.stats.bytes_loaded.saturating_add(bytes);
            }
        }
        Ok(plan)
    }

    /// Backs up `pairs` (device page -> host page), all layers.
    pub fn backup(&mut self, pairs: &[PagePair]) -> Result<TransferPlan, TransferError> {
        self.transfer(Direction::Backup, Layers::All, pairs)
    }

    /// Backs up `pairs` for one layer.
    pub fn backup_layer(
        &mut self,
        layer: u64,
        pairs: &[PagePair],
    ) -> Result<TransferPlan, TransferError> {
        self.transfer(Direction::Backup, Layers::One(layer), pairs)
    }

    /// Loads `pairs` (host page -> device page), all layers.
    pub fn load(&mut self, pairs: &[PagePair]) -> Result<TransferPlan, TransferError> {
        self.transfer(Direction::Load, Layers::All, pairs)
    }

    /// Loads `pairs` for one layer (SGLang's layer-wise load overlapping the forward pass).
    pub fn load_layer(
        &mut self,
        layer: u64,
        pairs: &[PagePair],
    ) -> Result<TransferPlan, TransferError> {
        self.transfer(Direction::Load, Layers::One(layer), pairs)
    }
}
