//! The one transfer loop shared by [`crate::HiCache`] and [`crate::ConcurrentHiCache`]: runs
//! laid from the pairing's routes pair by pair, handed to a copy in bounded chunks, and a failure
//! part way turned into [`TransferError::Interrupted`] naming the pairs moved; and the counters
//! both keep ([`TransferStats::record`]).

use crate::backend::BackendError;
use crate::error::{PoolFact, TransferError};
use crate::plan::{CopyRun, Direction, Layers, PagePair, Transferred};
use crate::pool::KvPool;
use crate::route::{PoolFacts, Routes};
use crate::shim::{self, CHECKS_COMPILED};

/// Counters of one HiCache's transfers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Backup calls that moved data.
    pub backups: u64,
    /// Load calls that moved data.
    pub loads: u64,
    /// Pages backed up (pairs, counted once for all layers of an all-layer call; per-layer
    /// calls count pairs of layer 0 only).
    pub backed_up_pages: u64,
    /// Pages loaded (counted as for backups).
    pub loaded_pages: u64,
    /// Bytes copied device -> host.
    pub backed_up_bytes: u64,
    /// Bytes copied host -> device.
    pub loaded_bytes: u64,
    /// Transfers refused (by the shim's checks, or [`TransferError::Busy`]); no byte moved.
    pub refused: u64,
    /// Transfers the backend failed part way ([`TransferError::Interrupted`]); their bytes
    /// are not counted above.
    pub interrupted: u64,
    /// Page payloads verified against their backup's checksum at load (one per buffer, layer
    /// and page; [`crate::ChecksumMode`]), mismatches included.
    pub checksummed_pages: u64,
    /// Page payloads whose loaded bytes did not match their backup's checksum
    /// ([`TransferError::ChecksumMismatch`]; their loads count as moved above).
    pub checksum_mismatches: u64,
}

impl TransferStats {
    /// Counts one transfer's outcome: a call that moved data (an empty list is not counted; a
    /// load refused by its checksums moved its data), a refusal, or an interruption. Byte
    /// counters saturate. The checksum counters are kept by the cache that verifies
    /// ([`TransferStats::record_checksums`]).
    pub fn record(
        &mut self,
        direction: Direction,
        layers: Layers,
        result: &Result<Transferred, TransferError>,
    ) {
        let moved = match result {
            Ok(t) => Ok(t),
            Err(TransferError::ChecksumMismatch { transferred, .. }) => Ok(transferred),
            Err(e) => Err(e),
        };
        match moved {
            Ok(t) if t.pairs == 0 => {}
            Ok(t) => {
                let pages = match layers {
                    Layers::All | Layers::One(0) => t.pairs,
                    Layers::One(_) => 0,
                };
                let (calls, counted, bytes) = match direction {
                    Direction::Backup => (
                        &mut self.backups,
                        &mut self.backed_up_pages,
                        &mut self.backed_up_bytes,
                    ),
                    Direction::Load => (
                        &mut self.loads,
                        &mut self.loaded_pages,
                        &mut self.loaded_bytes,
                    ),
                };
                *calls = calls.saturating_add(1);
                *counted = counted.saturating_add(pages);
                *bytes = bytes.saturating_add(t.bytes);
            }
            Err(TransferError::Interrupted { .. }) => {
                self.interrupted = self.interrupted.saturating_add(1)
            }
            Err(_) => self.refused = self.refused.saturating_add(1),
        }
    }

    /// Counts the page payloads a load verified and those that mismatched.
    pub fn record_checksums(&mut self, checksummed_pages: u64, mismatches: u64) {
        self.checksummed_pages = self.checksummed_pages.saturating_add(checksummed_pages);
        self.checksum_mismatches = self.checksum_mismatches.saturating_add(mismatches);
    }

    /// Adds another handle's counters, each saturating at `u64::MAX` (the fields are public: a
    /// caller's values never make this panic or wrap).
    pub fn add(&mut self, other: TransferStats) {
        let sum = |a: &mut u64, b: u64| *a = a.saturating_add(b);
        sum(&mut self.backups, other.backups);
        sum(&mut self.loads, other.loads);
        sum(&mut self.backed_up_pages, other.backed_up_pages);
        sum(&mut self.loaded_pages, other.loaded_pages);
        sum(&mut self.backed_up_bytes, other.backed_up_bytes);
        sum(&mut self.loaded_bytes, other.loaded_bytes);
        sum(&mut self.refused, other.refused);
        sum(&mut self.interrupted, other.interrupted);
        sum(&mut self.checksummed_pages, other.checksummed_pages);
        sum(&mut self.checksum_mismatches, other.checksum_mismatches);
    }
}

/// What `pool` is now, to compare with what it was at pairing.
#[inline]
pub(crate) fn facts_of(pool: &impl KvPool) -> PoolFacts {
    PoolFacts {
        fingerprint: pool.fingerprint(),
        pages: pool.geometry().pages,
        len_bytes: pool.len_bytes(),
    }
}

/// The per-transfer checks of a checked pairing, all before any byte moves (see
/// [`crate::shim`]): the pools are the paired ones (with the checks compiled in), the layer,
/// the list's length against the destination's pages, every page index on both sides, no
/// destination page twice, and (checks compiled in) every pair's runs inside both regions.
#[inline]
pub(crate) fn check_transfer(
    routes: &Routes,
    (device, host): (PoolFacts, PoolFacts),
    direction: Direction,
    layers: Layers,
    pairs: &[PagePair],
) -> Result<(), TransferError> {
    if CHECKS_COMPILED && (device != routes.device || host != routes.host) {
        return Err(pool_changed(routes, device, host));
    }
    routes.check_layer(layers)?;
    shim::check_pair_pages(
        direction,
        routes.device.pages,
        routes.host.pages,
        pairs,
        true,
    )?;
    if CHECKS_COMPILED {
        routes.check_pair_ranges(layers, pairs)?;
    }
    Ok(())
}

/// The first fact that differs from the pairing's, device side first.
#[cold]
#[inline(never)]
fn pool_changed(routes: &Routes, device: PoolFacts, host: PoolFacts) -> TransferError {
    let facts = |f: PoolFacts| {
        [
            (PoolFact::Fingerprint, f.fingerprint),
            (PoolFact::Pages, f.pages),
            (PoolFact::LenBytes, f.len_bytes),
        ]
    };
    [
        ("device", routes.device, device),
        ("host", routes.host, host),
    ]
    .into_iter()
    .flat_map(|(side, paired, now)| {
        facts(paired)
            .into_iter()
            .zip(facts(now))
            .map(move |((fact, p), (_, a))| (side, fact, p, a))
    })
    .find(|&(_, _, p, a)| p != a)
    .map_or(
        TransferError::PoolChanged {
            side: "device",
            fact: PoolFact::Fingerprint,
            paired: routes.device.fingerprint,
            actual: device.fingerprint,
        },
        |(side, fact, paired, actual)| TransferError::PoolChanged {
            side,
            fact,
            paired,
            actual,
        },
    )
}

/// Runs handed to a copy at once, at most (whole pairs; at least one pair). Bounds the scratch
/// list however long the pair list (64 Ki runs = 1.5 MiB).
pub(crate) const CHUNK_RUNS: u64 = 1 << 16;

/// Pairs per chunk: the whole list when it fits [`CHUNK_RUNS`] (no division on the hot path),
/// else as many whole pairs as fit, at least one.
#[inline]
fn chunk_pairs(pairs: usize, runs_per_pair: u64) -> usize {
    if (pairs as u64).saturating_mul(runs_per_pair) <= CHUNK_RUNS {
        pairs.max(1)
    } else {
        usize::try_from(CHUNK_RUNS / runs_per_pair.max(1))
            .unwrap_or(1)
            .max(1)
    }
}

/// The error of a transfer that failed after `moved_runs` runs (pair-major order,
/// `runs_per_pair` each) with `source`; nothing moved gives [`TransferError::Backend`].
fn interrupted(
    pairs: &[PagePair],
    runs_per_pair: u64,
    moved_runs: u64,
    source: BackendError,
) -> TransferError {
    if moved_runs == 0 && !matches!(source, BackendError::Interrupted { .. }) {
        return TransferError::Backend(source);
    }
    // `moved_runs` counts runs of `pairs`, so the quotient is at most `pairs.len()`.
    let moved = usize::try_from(moved_runs / runs_per_pair.max(1)).unwrap_or(pairs.len());
    let torn = (!moved_runs.is_multiple_of(runs_per_pair.max(1)))
        .then(|| pairs.get(moved).copied())
        .flatten();
    TransferError::Interrupted {
        moved_pairs: pairs[..moved.min(pairs.len())].to_vec(),
        torn_pair: torn,
        moved_runs,
        source,
    }
}

/// Executes a transfer whose request already passed the checks: for each chunk of whole pairs,
/// the runs of every pair laid from `routes` into `scratch` (pair by pair: every buffer and
/// layer of a pair, then the next pair), then `copy` on them. A copy that fails reports how
/// many runs of its chunk it completed through [`BackendError::Interrupted`] (any other error:
/// none); the result names the pairs moved in full and the torn one.
pub(crate) fn run_transfer(
    routes: &Routes,
    direction: Direction,
    layers: Layers,
    pairs: &[PagePair],
    scratch: &mut Vec<CopyRun>,
    mut copy: impl FnMut(&[CopyRun]) -> Result<(), BackendError>,
) -> Result<Transferred, TransferError> {
    let mut done = Transferred {
        direction,
        layers,
        pairs: 0,
        runs: 0,
        bytes: 0,
        verified: CHECKS_COMPILED,
    };
    if pairs.is_empty() {
        return Ok(done);
    }
    let per_pair = routes.runs_per_pair(layers);
    for chunk in pairs.chunks(chunk_pairs(pairs.len(), per_pair)) {
        scratch.clear();
        for &p in chunk {
            routes.push_pair_runs(direction, layers, p, scratch);
        }
        if let Err(e) = copy(scratch) {
            let in_chunk = match &e {
                BackendError::Interrupted { completed_runs, .. } => *completed_runs,
                _ => 0,
            };
            return Err(interrupted(pairs, per_pair, done.runs + in_chunk, e));
        }
        done.pairs += chunk.len() as u64;
        done.runs += scratch.len() as u64;
        done.bytes += scratch.iter().map(|r| r.len_bytes).sum::<u64>();
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(pairs: u64, bytes: u64) -> Result<Transferred, TransferError> {
        Ok(Transferred {
            direction: Direction::Backup,
            layers: Layers::All,
            pairs,
            runs: pairs,
            bytes,
            verified: true,
        })
    }

    #[test]
    fn record_counts_calls_pages_on_layer_zero_and_outcomes() {
        let mut s = TransferStats::default();
        s.record(Direction::Backup, Layers::All, &ok(3, 300));
        s.record(Direction::Load, Layers::One(0), &ok(2, 20));
        // A later layer of a layer-wise load: a call and its bytes, its pages counted on layer 0.
        s.record(Direction::Load, Layers::One(1), &ok(2, 20));
        s.record(Direction::Load, Layers::All, &ok(0, 0));
        s.record(
            Direction::Load,
            Layers::All,
            &Err(TransferError::Layer {
                layer: 9,
                layers: 2,
            }),
        );
        s.record(
            Direction::Backup,
            Layers::All,
            &Err(interrupted(
                &[PagePair::new(0, 0)],
                2,
                1,
                BackendError::Driver("x".into()),
            )),
        );
        assert_eq!(
            s,
            TransferStats {
                backups: 1,
                loads: 2,
                backed_up_pages: 3,
                loaded_pages: 2,
                backed_up_bytes: 300,
                loaded_bytes: 40,
                refused: 1,
                interrupted: 1,
                checksummed_pages: 0,
                checksum_mismatches: 0,
            }
        );
    }

    #[test]
    fn chunks_hold_whole_pairs_and_at_least_one() {
        // 65,536 runs per chunk: 1,024 runs per pair -> 64 pairs; 100,000 runs per pair -> 1.
        assert_eq!(chunk_pairs(70, 1024), 64);
        assert_eq!(chunk_pairs(64, 1024), 64);
        assert_eq!(chunk_pairs(3, 100_000), 1);
        assert_eq!(chunk_pairs(0, 4), 1);
    }
}
