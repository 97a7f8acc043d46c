//! Page content checksums on a HiCache pairing ([`ChecksumMode`]): a backup records each page's
//! checksum ([`kvlayout_core::checksum`], `kvlayout.checksum/v1`) in a host-side table beside the
//! host page; a load verifies the device page after the copy and before the call returns (so
//! before the layer is handed to the model). A mismatch refuses those pages
//! ([`TransferError::ChecksumMismatch`]: the caller treats them as a miss and recomputes them),
//! names buffer, layer, pages and both values, and is counted
//! ([`crate::TransferStats::checksum_mismatches`]).
//!
//! The geometry check proves both sides lay a page out alike; the checksum proves the bytes that
//! arrive are the bytes that left: a short or torn copy, a stale destination, a host page
//! overwritten after its backup. Checksums are computed on the device pool's pages under the
//! device geometry (its buffers' token fingerprints and model layer ids), at backup from the
//! source page, at load from the destination page, so they also catch a host pool that stores
//! the page under another layout (the seed bug, with the geometry check off).

use std::num::NonZeroU64;
use std::sync::Mutex;

use kvlayout_core::checksum::PageChecksumKey;
use kvlayout_core::{GeometryError, PoolGeometry};

use crate::backend::BackendError;
use crate::error::{PoolError, TransferError};
use crate::plan::{Direction, Layers, PagePair, Transferred};
use crate::pool::KvPool;

/// Which pages a pairing checksums.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ChecksumMode {
    /// No checksum (the default): no table, no cost.
    #[default]
    Off,
    /// Host pages whose index is a multiple of N: recorded at backup, verified at load. A
    /// fixed sample (by host page index), so every verified page was recorded.
    Sampled(NonZeroU64),
    /// Every page.
    All,
}

impl ChecksumMode {
    /// Parses `off`, `all` or `sampled:N` (N >= 1; `sampled:1` is `all`'s coverage).
    ///
    /// # Errors
    /// A message naming the text and the accepted forms.
    pub fn parse(text: &str) -> Result<ChecksumMode, String> {
        match text {
            "off" => Ok(ChecksumMode::Off),
            "all" => Ok(ChecksumMode::All),
            _ => text
                .strip_prefix("sampled:")
                .and_then(|n| n.parse::<u64>().ok())
                .and_then(NonZeroU64::new)
                .map(ChecksumMode::Sampled)
                .ok_or_else(|| {
                    format!("checksum mode '{text}': expected off, all or sampled:N with N >= 1")
                }),
        }
    }

    /// Whether host page `host_page` is checksummed.
    pub fn covers(self, host_page: u64) -> bool {
        match self {
            ChecksumMode::Off => false,
            ChecksumMode::All => true,
            ChecksumMode::Sampled(n) => host_page.is_multiple_of(n.get()),
        }
    }
}

impl std::fmt::Display for ChecksumMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChecksumMode::Off => f.write_str("off"),
            ChecksumMode::All => f.write_str("all"),
            ChecksumMode::Sampled(n) => write!(f, "sampled:{n}"),
        }
    }
}

/// One page of one layer of one buffer whose loaded bytes do not match its backup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageMismatch {
    /// Buffer name.
    pub buffer: String,
    /// Layer index in the buffer (`0..layers`).
    pub layer: u64,
    /// The model layer id the checksum is seeded with (`layer_ids[layer]`, else `layer`).
    pub layer_id: u64,
    /// The host page loaded from.
    pub host_page: u64,
    /// The device page loaded into.
    pub device_page: u64,
    /// The checksum recorded at backup.
    pub recorded: u64,
    /// The checksum of the device page after the load.
    pub loaded: u64,
}

impl std::fmt::Display for PageMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "buffer {} layer {} (model layer {}), host page {} -> device page {}: checksum {:#018x} at backup, {:#018x} after load",
            self.buffer,
            self.layer,
            self.layer_id,
            self.host_page,
            self.device_page,
            self.recorded,
            self.loaded
        )
    }
}

/// The host-side table of a pairing with checksums on: per buffer, layer and host page, the
/// checksum recorded at the last backup (none before one).
pub(crate) struct ChecksumTable {
    mode: ChecksumMode,
    /// `[buffer][layer]` keys, from the device geometry.
    keys: Vec<Vec<PageChecksumKey>>,
    names: Vec<String>,
    host_pages: u64,
    /// `[buffer][layer][host page]`, flattened per buffer. Behind a lock so a concurrent cache
    /// ([`crate::ConcurrentHiCache`]) shares the table: an entry is written by a backup holding
    /// its host page exclusively and read by a load holding it shared.
    recorded: Mutex<Vec<Vec<Option<u64>>>>,
    /// One page payload, read back from the device pool.
    scratch: Vec<u8>,
}

/// The checksum of one device page payload of one (buffer, layer) of a transfer's pair, to
/// record (backup) or to compare (load).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PageSum {
    buffer: usize,
    layer: u64,
    pair: PagePair,
    sum: u64,
}

impl ChecksumTable {
    /// A table for `mode` (`None` when off) over the device geometry and `host_pages` host pages.
    pub(crate) fn new(
        mode: ChecksumMode,
        device: &PoolGeometry,
        host_pages: u64,
    ) -> Result<Option<ChecksumTable>, TransferError> {
        if mode == ChecksumMode::Off {
            return Ok(None);
        }
        let mut keys = Vec::new();
        let mut recorded = Vec::new();
        for (b, buf) in device.buffers.iter().enumerate() {
            let per: Vec<PageChecksumKey> = (0..buf.layers)
                .map(|l| device.page_checksum_key(b, l))
                .collect::<Result<_, _>>()?;
            let entries = buf
                .layers
                .checked_mul(host_pages)
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| {
                    GeometryError::new(
                        "checksum table",
                        format!(
                            "{} layers x {host_pages} host pages of {} overflow",
                            buf.layers,
                            buf.name()
                        ),
                    )
                })?;
            keys.push(per);
            recorded.push(vec![None; entries]);
        }
        Ok(Some(ChecksumTable {
            mode,
            keys,
            names: device
                .buffers
                .iter()
                .map(|b| b.name().to_string())
                .collect(),
            host_pages,
            recorded: Mutex::new(recorded),
            scratch: Vec::new(),
        }))
    }

    pub(crate) fn mode(&self) -> ChecksumMode {
        self.mode
    }

    fn layer_range(&self, b: usize, layers: Layers) -> std::ops::Range<u64> {
        let n = self.keys[b].len() as u64;
        match layers {
            Layers::All => 0..n,
            Layers::One(l) if l < n => l..l + 1,
            Layers::One(_) => 0..0,
        }
    }

    fn slot(&self, s: &PageSum) -> usize {
        // In range: the layer is one of the buffer's and the host page one of the pool's
        // (checked before the transfer), and the table's size fits a usize (checked in `new`).
        (s.layer * self.host_pages + s.pair.host_page) as usize
    }

    /// The checksums of the device pages of the covered pairs of `pairs`, every buffer and the
    /// layers of `layers`: `checksum(key, buffer, layer, device page)` computes one (the
    /// caller reads the device page payload). For `only_recorded`, the (buffer, layer, host
    /// page)s never backed up with a checksum are skipped (a load verifies only those).
    pub(crate) fn sums(
        &self,
        layers: Layers,
        pairs: &[PagePair],
        only_recorded: bool,
        mut checksum: impl FnMut(&PageChecksumKey, usize, u64, u64) -> Result<u64, TransferError>,
    ) -> Result<Vec<PageSum>, TransferError> {
        let mut out = Vec::new();
        for &pair in pairs.iter().filter(|p| self.mode.covers(p.host_page)) {
            for b in 0..self.keys.len() {
                for layer in self.layer_range(b, layers) {
                    let mut s = PageSum {
                        buffer: b,
                        layer,
                        pair,
                        sum: 0,
                    };
                    if only_recorded && self.recorded_at(&s).is_none() {
                        continue;
                    }
                    s.sum = checksum(&self.keys[b][layer as usize], b, layer, pair.device_page)?;
                    out.push(s);
                }
            }
        }
        Ok(out)
    }

    /// [`ChecksumTable::sums`] reading the device pages from `device`.
    pub(crate) fn device_sums(
        &mut self,
        device: &impl KvPool,
        layers: Layers,
        pairs: &[PagePair],
        only_recorded: bool,
    ) -> Result<Vec<PageSum>, TransferError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let out = self.sums(layers, pairs, only_recorded, |key, b, l, page| {
            // A page payload fits in memory: the pool holds it.
            scratch.resize(key.payload_bytes as usize, 0);
            device
                .read_page_bytes(b, l, page, 0, &mut scratch)
                .map_err(pool_error)?;
            Ok(key.checksum(&scratch)?)
        });
        self.scratch = scratch;
        out
    }

    fn recorded(&self) -> std::sync::MutexGuard<'_, Vec<Vec<Option<u64>>>> {
        self.recorded.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn recorded_at(&self, s: &PageSum) -> Option<u64> {
        self.recorded()[s.buffer][self.slot(s)]
    }

    /// Records the checksums of a backup (device pages' checksums, under their host pages).
    pub(crate) fn record(&self, sums: &[PageSum]) {
        let mut recorded = self.recorded();
        for s in sums {
            recorded[s.buffer][self.slot(s)] = Some(s.sum);
        }
    }

    /// Compares the checksums of the device pages a load wrote with those recorded for their
    /// host pages: the pages verified (one per buffer, layer and page; pages never backed up
    /// with a checksum are skipped) and the mismatches.
    pub(crate) fn compare(&self, sums: &[PageSum]) -> (u64, Vec<PageMismatch>) {
        let mut verified = 0u64;
        let mut mismatches = Vec::new();
        for s in sums {
            let Some(recorded) = self.recorded_at(s) else {
                continue;
            };
            verified += 1;
            if s.sum != recorded {
                mismatches.push(PageMismatch {
                    buffer: self.names[s.buffer].clone(),
                    layer: s.layer,
                    layer_id: self.keys[s.buffer][s.layer as usize].layer_id,
                    host_page: s.pair.host_page,
                    device_page: s.pair.device_page,
                    recorded,
                    loaded: s.sum,
                });
            }
        }
        (verified, mismatches)
    }
}

/// Whether a transfer's bytes moved, so its pages are checksummed: a copy that ran, and a
/// backup that failed part way (torn: its host pages hold old and new bytes; recording the
/// device pages' checksums makes a later load of them mismatch, never pass). A checked
/// pairing reports a torn copy as [`TransferError::Interrupted`], an unverified one as
/// [`TransferError::Backend`]; a refusal (nothing moved) records nothing.
pub(crate) fn copied(direction: Direction, result: &Result<Transferred, TransferError>) -> bool {
    match result {
        Ok(t) => t.pairs > 0,
        Err(
            TransferError::Interrupted { .. }
            | TransferError::Backend(BackendError::Interrupted { .. } | BackendError::Driver(_)),
        ) => direction == Direction::Backup,
        Err(_) => false,
    }
}

/// The result of a load whose pages were verified: `transferred` when every verified page
/// matched, else [`TransferError::ChecksumMismatch`] (counted in `stats`).
pub(crate) fn load_verdict(
    stats: &mut crate::TransferStats,
    transferred: Transferred,
    (checksummed_pages, mismatches): (u64, Vec<PageMismatch>),
) -> Result<Transferred, TransferError> {
    stats.record_checksums(checksummed_pages, mismatches.len() as u64);
    if mismatches.is_empty() {
        Ok(transferred)
    } else {
        Err(TransferError::ChecksumMismatch {
            transferred,
            checksummed_pages,
            mismatches,
        })
    }
}

/// The pairs of a load that `mismatches` refuse, each once, in order (what a caller treats as
/// a miss).
pub fn refused_pairs(mismatches: &[PageMismatch]) -> Vec<PagePair> {
    let mut out: Vec<PagePair> = Vec::new();
    for m in mismatches {
        let pair = PagePair {
            device_page: m.device_page,
            host_page: m.host_page,
        };
        if !out.contains(&pair) {
            out.push(pair);
        }
    }
    out
}

fn pool_error(e: PoolError) -> TransferError {
    match e {
        PoolError::Geometry(g) => TransferError::Geometry(g),
        PoolError::Backend(b) => TransferError::Backend(b),
        other => TransferError::Geometry(GeometryError::new("checksum", other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_cover_by_host_page() {
        assert_eq!(ChecksumMode::parse("off"), Ok(ChecksumMode::Off));
        assert_eq!(ChecksumMode::parse("all"), Ok(ChecksumMode::All));
        let four = ChecksumMode::parse("sampled:4").unwrap();
        assert_eq!(four.to_string(), "sampled:4");
        // Host pages 0, 4, 8 of 0..10.
        let covered: Vec<u64> = (0..10).filter(|&p| four.covers(p)).collect();
        assert_eq!(covered, [0, 4, 8]);
        for bad in ["sampled:0", "sampled:", "some", "sampled:x"] {
            let e = ChecksumMode::parse(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("sampled:N"), "{e}");
        }
        assert!(!ChecksumMode::Off.covers(0));
    }
}
