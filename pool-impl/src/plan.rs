//! Transfer plans: what a backup or load moves, computed by the shim from checked geometry
//! and executed unchanged by a backend (CPU copies, or a CUDA kernel / `cudaMemcpyAsync` per
//! run).

use std::fmt;

/// One (device page, host page) pair of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagePair {
    /// Page index in the device pool.
    pub device_page: u64,
    /// Page index in the host pool.
    pub host_page: u64,
}

impl PagePair {
    /// A pair.
    pub const fn new(device_page: u64, host_page: u64) -> PagePair {
        PagePair {
            device_page,
            host_page,
        }
    }
}

/// Which way a transfer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Device -> host (HiCache write-back / backup).
    Backup,
    /// Host -> device (HiCache load on a prefix hit).
    Load,
}

impl Direction {
    /// The destination side's name (`host` for a backup).
    pub const fn destination(self) -> &'static str {
        match self {
            Direction::Backup => "host",
            Direction::Load => "device",
        }
    }

    /// The source side's name.
    pub const fn source(self) -> &'static str {
        match self {
            Direction::Backup => "device",
            Direction::Load => "host",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Backup => "backup",
            Direction::Load => "load",
        })
    }
}

/// Which layers a transfer covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layers {
    /// Every layer of every buffer.
    All,
    /// One layer (of every buffer that has it: buffers hold layers `0..layers`).
    One(u64),
}

/// One contiguous copy: `len_bytes` from `src_offset_bytes` of the source region to
/// `dst_offset_bytes` of the destination region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopyRun {
    /// Offset in the source region.
    pub src_offset_bytes: u64,
    /// Offset in the destination region.
    pub dst_offset_bytes: u64,
    /// Bytes to copy.
    pub len_bytes: u64,
}

/// The runs of one buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferPlan {
    /// Buffer name (`kv`, `index_k`).
    pub buffer: String,
    /// Bytes moved per page per layer (the payload or page stride the plan copies; in an
    /// unverified legacy plan, the host's page bytes used on both sides).
    pub item_bytes: u64,
    /// Layers copied.
    pub layers: Vec<u64>,
    /// Copies, in (layer, pair, segment) order.
    pub runs: Vec<CopyRun>,
}

/// A complete transfer: every run of every buffer. Built and checked by the shim before any
/// byte moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferPlan {
    /// Backup or load.
    pub direction: Direction,
    /// Layers covered.
    pub layers: Layers,
    /// The page pairs, as requested.
    pub pairs: Vec<PagePair>,
    /// Per buffer runs.
    pub buffers: Vec<BufferPlan>,
    /// Whether the shim's checks ran on this plan.
    pub verified: bool,
}

impl TransferPlan {
    /// Every run, buffer after buffer.
    pub fn runs(&self) -> impl Iterator<Item = &CopyRun> {
        self.buffers.iter().flat_map(|b| b.runs.iter())
    }

    /// Bytes the plan moves (saturating; plans are built with checked arithmetic).
    pub fn total_bytes(&self) -> u64 {
        self.runs().fold(0u64, |t, r| t.saturating_add(r.len_bytes))
    }

    /// All runs as one list (what a backend executes).
    pub fn flat_runs(&self) -> Vec<CopyRun> {
        self.runs().copied().collect()
    }
}

/// What a completed transfer moved (returned by [`crate::HiCache::backup`] and friends; the
/// full run list of a transfer is [`crate::HiCache::plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transferred {
    /// Backup or load.
    pub direction: Direction,
    /// Layers covered.
    pub layers: Layers,
    /// Page pairs moved.
    pub pairs: u64,
    /// Copy runs executed.
    pub runs: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Whether the shim's per-transfer checks ran ([`crate::shim::CHECKS_COMPILED`] and a
    /// checked pairing).
    pub verified: bool,
}

impl Transferred {
    /// Bytes copied.
    pub fn total_bytes(&self) -> u64 {
        self.bytes
    }
}
