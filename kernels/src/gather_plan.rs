//! The plan of a gathered backup (the device half is `Gpu::enqueue_gathered_backup`): the runs
//! of a backup, in list order, packed into device staging slots by a gather on the device, then
//! every host-contiguous stretch of a slot copied to the host pool by the copy engines. A
//! backup of random pages from a `layer_first` device pool to a `page_first` host pool has one
//! stretch per page and buffer (all its layers: 61 x 41,984 B and 61 x 8,448 B for
//! DeepSeek-V3.2), against one run per page, layer and buffer for the copy engines alone: they
//! pay per run, so the stretches are what lifts the backup from 0.55-0.79 of memcpy next to a
//! GEMM to 0.89 through the chooser (0.91 with the plan made before the timed window;
//! BENCHMARKS.md, "Session 5").
//!
//! The plan needs no sort when the list already lays each host stretch's runs one after the
//! other, as the pool shim does (page pair by page pair, each pair's layers in order): the
//! overlap check sorts the stretches only ([`host_stretches`]), and the chunks are made one at
//! a time ([`gather_chunks`]), so the device can start on the first while the host plans the
//! next.

use crate::copy_runs::ByteRun;

/// One slot's worth of a gathered backup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GatherChunk {
    /// The staging slot (chunk number modulo the slot count).
    pub slot: usize,
    /// Device pool -> staging: `src_offset_bytes` in the device pool, `dst_offset_bytes` in
    /// the whole staging buffer (inside slot `slot`).
    pub gather: Vec<ByteRun>,
    /// Staging -> host pool: `src_offset_bytes` in the whole staging buffer,
    /// `dst_offset_bytes` in the host pool; each a maximal host-contiguous stretch of the
    /// chunk's pieces, in list order.
    pub stretches: Vec<ByteRun>,
}

/// What a run list is made of on the host side, in list order ([`host_stretches`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostStretches {
    /// Non-empty runs.
    pub runs: u64,
    /// Non-empty runs after merging list neighbours that continue each other on both sides
    /// (merged in list order, as [`crate::RunOrder::AsGiven`] merges: what the copy engines
    /// would copy of the list as given; sorted first, a list may merge further).
    pub merged_runs: u64,
    /// Maximal stretches of consecutive non-empty runs, each starting on the host where the
    /// one before it ends.
    pub stretches: u64,
    /// Bytes of all the runs.
    pub bytes: u64,
}

impl HostStretches {
    /// Most gather pieces a plan of these runs can hold ([`gather_chunks`] with slots of
    /// `slot_bytes` and a first chunk of `first_chunk_bytes`): every run, plus one more piece
    /// per chunk boundary (a run cut there); at most one chunk per full slot, plus the smaller
    /// first chunks (64 at most: the first-chunk size doubles) and one partial chunk.
    pub fn max_gather_pieces(&self, slot_bytes: u64, first_chunk_bytes: u64) -> u64 {
        let ramp_chunks = if first_chunk_bytes == 0 || slot_bytes == 0 {
            0
        } else {
            let ratio = slot_bytes.div_ceil(first_chunk_bytes);
            u64::from(64 - ratio.leading_zeros())
        };
        let full_chunks = self.bytes.checked_div(slot_bytes).unwrap_or(0);
        self.runs
            .saturating_add(full_chunks)
            .saturating_add(ramp_chunks)
            .saturating_add(1)
    }

    /// True when gathering pays: the stretches are at most half as many as the merged runs
    /// (at least two runs the copy engines would copy one by one merge into each stretch on
    /// average). Otherwise the copy engines pay about the same per stretch as per run, and the
    /// gather would only add a pass through HBM and SM time (a `layer_first` host pool, a list
    /// laid layer by layer, or runs that already continue each other on the device too, give
    /// a stretch per merged run). An empty list counts as paying: there is nothing to copy
    /// either way.
    pub fn gathering_pays(&self) -> bool {
        self.stretches.saturating_mul(2) <= self.merged_runs
    }
}

/// The host-contiguous stretches of `runs` in list order (a backup: `dst_offset_bytes` is the
/// host offset). `None` when two runs write overlapping host bytes (the copies out of one
/// chunk run in no set order; such a list keeps the copy engines, whose batches do not order
/// overlapping destinations either), or when a run's host or device end, or the runs' total
/// length, would pass `u64::MAX` (none can for runs that fit their buffers without
/// overlapping). Sorts the stretches (one per page and buffer for the pool shim's lists), not
/// the runs.
pub fn host_stretches(runs: &[ByteRun]) -> Option<HostStretches> {
    let mut host_spans_bytes: Vec<(u64, u64)> = Vec::new(); // host (start, end) per stretch
    let (mut count_runs, mut merged_runs, mut bytes) = (0u64, 0u64, 0u64);
    // The device end of the (non-empty) run before.
    let mut last_src_end_bytes: Option<u64> = None;
    for r in runs.iter().filter(|r| r.len_bytes > 0) {
        count_runs += 1;
        bytes = bytes.checked_add(r.len_bytes)?;
        let end_bytes = r.dst_offset_bytes.checked_add(r.len_bytes)?;
        let src_end_bytes = r.src_offset_bytes.checked_add(r.len_bytes)?;
        match host_spans_bytes.last_mut() {
            Some((_, last_end_bytes)) if *last_end_bytes == r.dst_offset_bytes => {
                *last_end_bytes = end_bytes;
                if last_src_end_bytes != Some(r.src_offset_bytes) {
                    merged_runs += 1;
                }
            }
            _ => {
                host_spans_bytes.push((r.dst_offset_bytes, end_bytes));
                merged_runs += 1;
            }
        }
        last_src_end_bytes = Some(src_end_bytes);
    }
    let stretches = host_spans_bytes.len() as u64;
    host_spans_bytes.sort_unstable();
    if host_spans_bytes.windows(2).any(|w| w[0].1 > w[1].0) {
        return None;
    }
    Some(HostStretches {
        runs: count_runs,
        merged_runs,
        stretches,
        bytes,
    })
}

/// The chunks of a gathered backup of `runs` (the caller checks them for overlap first,
/// [`host_stretches`]), made one at a time: the runs in list order (empty ones skipped)
/// packed slot after slot of `slots` slots of `slot_bytes`, cutting a run that does not fit
/// the rest of a chunk. Chunk `i` holds at most `min(slot_bytes, first_chunk_bytes * 2^i)` bytes: small first chunks let
/// the copies out start sooner (the copies out of a chunk wait for its whole gather). Offsets
/// inside the staging buffer are `slot * slot_bytes + offset in the slot`; the caller's
/// staging buffer holds `slots * slot_bytes` bytes. Yields nothing when `slot_bytes`,
/// `first_chunk_bytes` or `slots` is zero, and stops for good (the caller must compare the
/// bytes planned) if a piece's start or end, on either side or in the staging, would pass
/// `u64::MAX`, which runs checked against their buffers never do. Overlapping host ranges are
/// not checked here: [`host_stretches`] checks them.
pub fn gather_chunks(
    runs: &[ByteRun],
    slot_bytes: u64,
    slots: usize,
    first_chunk_bytes: u64,
) -> GatherChunks<'_> {
    let usable = slot_bytes > 0 && slots > 0 && first_chunk_bytes > 0;
    GatherChunks {
        runs: if usable { runs } else { &[] },
        next_run: 0,
        done_in_run_bytes: 0,
        chunks: 0,
        slot_bytes,
        slots: slots.max(1),
        first_chunk_bytes,
    }
}

/// The iterator of [`gather_chunks`].
#[derive(Clone, Debug)]
pub struct GatherChunks<'a> {
    runs: &'a [ByteRun],
    next_run: usize,
    done_in_run_bytes: u64,
    chunks: u64,
    slot_bytes: u64,
    slots: usize,
    first_chunk_bytes: u64,
}

impl GatherChunks<'_> {
    /// Most bytes chunk `i` holds.
    fn limit_bytes(&self, i: u64) -> u64 {
        let doubled_bytes = u32::try_from(i)
            .ok()
            .and_then(|i| 1u64.checked_shl(i))
            .and_then(|f| self.first_chunk_bytes.checked_mul(f));
        doubled_bytes.map_or(self.slot_bytes, |b| b.min(self.slot_bytes))
    }
}

impl Iterator for GatherChunks<'_> {
    type Item = GatherChunk;

    fn next(&mut self) -> Option<GatherChunk> {
        let mut chunk = GatherChunk::default();
        self.next_into(&mut chunk).then_some(chunk)
    }
}

impl std::iter::FusedIterator for GatherChunks<'_> {}

impl GatherChunks<'_> {
    /// [`Iterator::next`] into `chunk` (its vectors cleared first, their memory kept): true
    /// when a chunk was planned. A caller planning backup after backup into one `GatherChunk`
    /// allocates no memory once it has held the largest chunk (the gathered backup's ring
    /// keeps one: a 1,048,576-run token backup planned into fresh vectors spent most of its
    /// host time in allocation and page faults, BENCHMARKS.md "page size 1").
    pub fn next_into(&mut self, chunk: &mut GatherChunk) -> bool {
        let planned = self.fill(chunk).is_some();
        if !planned {
            // The end, or an offset past u64::MAX: nothing more, ever (fused).
            self.runs = &[];
        }
        planned
    }

    /// Plans the next chunk into `chunk`; `None` at the end or when an offset would pass
    /// `u64::MAX`.
    fn fill(&mut self, chunk: &mut GatherChunk) -> Option<()> {
        chunk.gather.clear();
        chunk.stretches.clear();
        while self.runs.get(self.next_run)?.len_bytes == 0 {
            self.next_run += 1;
        }
        let slot = (self.chunks % self.slots as u64) as usize;
        let limit_bytes = self.limit_bytes(self.chunks);
        let slot_base_bytes = (slot as u64).checked_mul(self.slot_bytes)?;
        chunk.slot = slot;
        let mut used_bytes = 0u64;
        while used_bytes < limit_bytes {
            let Some(r) = self.runs.get(self.next_run) else {
                break;
            };
            let left_bytes = r.len_bytes - self.done_in_run_bytes;
            let take_bytes = left_bytes.min(limit_bytes - used_bytes);
            let src_at_bytes = r.src_offset_bytes.checked_add(self.done_in_run_bytes)?;
            let dst_at_bytes = r.dst_offset_bytes.checked_add(self.done_in_run_bytes)?;
            let staged_at_bytes = slot_base_bytes.checked_add(used_bytes)?;
            // The piece's ends, on all three sides, inside u64.
            src_at_bytes.checked_add(take_bytes)?;
            dst_at_bytes.checked_add(take_bytes)?;
            staged_at_bytes.checked_add(take_bytes)?;
            if take_bytes > 0 {
                chunk
                    .gather
                    .push(ByteRun::new(src_at_bytes, staged_at_bytes, take_bytes));
                match chunk.stretches.last_mut() {
                    Some(s)
                        if s.src_offset_bytes + s.len_bytes == staged_at_bytes
                            && s.dst_offset_bytes.checked_add(s.len_bytes)
                                == Some(dst_at_bytes) =>
                    {
                        s.len_bytes += take_bytes;
                    }
                    _ => chunk.stretches.push(ByteRun::new(
                        staged_at_bytes,
                        dst_at_bytes,
                        take_bytes,
                    )),
                }
            }
            used_bytes += take_bytes;
            if take_bytes == left_bytes {
                self.next_run += 1;
                self.done_in_run_bytes = 0;
            } else {
                self.done_in_run_bytes += take_bytes;
            }
        }
        self.chunks += 1;
        (!chunk.gather.is_empty()).then_some(())
    }
}

/// The whole plan of a gathered backup of `runs` in list order, in chunks of `slot_bytes`
/// ([`gather_chunks`] with no smaller first chunks). `None` when two runs write overlapping
/// host bytes ([`host_stretches`]), when `slot_bytes` or `slots` is zero, or when an offset
/// would pass `u64::MAX` (not possible for runs checked against their buffers). The plan holds
/// one chunk per `slot_bytes` of the runs' total length (the caller's slots are 64 MiB).
pub fn plan_gathered_backup(
    runs: &[ByteRun],
    slot_bytes: u64,
    slots: usize,
) -> Option<Vec<GatherChunk>> {
    if slot_bytes == 0 || slots == 0 {
        return None;
    }
    host_stretches(runs)?;
    let total_bytes = runs
        .iter()
        .try_fold(0u64, |t, r| t.checked_add(r.len_bytes))?;
    let chunks: Vec<GatherChunk> = gather_chunks(runs, slot_bytes, slots, slot_bytes).collect();
    let planned_bytes: u64 = chunks
        .iter()
        .flat_map(|c| &c.gather)
        .map(|r| r.len_bytes)
        .sum();
    (planned_bytes == total_bytes).then_some(chunks)
}
