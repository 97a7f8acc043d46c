//! The plan of a gathered backup (the device half is `Gpu::enqueue_gathered_backup`): the runs
//! of a backup, in host-address order, packed into device staging slots by a gather on the
//! device, then every host-contiguous stretch of a slot copied to the host pool by the copy
//! engines. A backup of random pages from a `layer_first` device pool to a `page_first` host
//! pool has one stretch per page and buffer (all its layers: 61 x 41,984 B and 61 x 8,448 B for
//! DeepSeek-V3.2), against one run per page, layer and buffer for the copy engines alone: they
//! pay per run, so the stretches are what lifts the backup from 0.71-0.76 of memcpy next to a
//! GEMM to 0.81 through the chooser, and to 0.91 with the plan made ahead (BENCHMARKS.md,
//! "Session 4").

use crate::copy_runs::ByteRun;

/// One slot's worth of a gathered backup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatherChunk {
    /// The staging slot (chunk number modulo the slot count).
    pub slot: usize,
    /// Device pool -> staging: `src_offset_bytes` in the device pool, `dst_offset_bytes` in
    /// the whole staging buffer (inside slot `slot`).
    pub gather: Vec<ByteRun>,
    /// Staging -> host pool: `src_offset_bytes` in the whole staging buffer,
    /// `dst_offset_bytes` in the host pool; each a maximal host-contiguous stretch.
    pub stretches: Vec<ByteRun>,
}

/// Packs `runs` (a backup's runs sorted by host offset, `dst_offset_bytes`; empty runs are
/// skipped) into chunks of at most `slot_bytes` staging bytes, slot after slot of `slots`,
/// cutting a run that does not fit the rest of a slot. Returns `None` when two runs write
/// overlapping host bytes or are not in host order (the copies out of one chunk run in no set
/// order; such a list keeps the copy engines, whose batches do not order overlapping
/// destinations either), when `slot_bytes` or `slots` is zero, or when an offset would pass
/// `u64::MAX` (not possible for runs checked against their buffers). The plan holds one chunk
/// per `slot_bytes` of the runs' total length (the caller's slots are 64 MiB). Offsets inside the
/// staging buffer are `slot * slot_bytes + offset in the slot`; the caller's staging buffer
/// holds `slots * slot_bytes` bytes.
pub fn plan_gathered_backup(
    runs: &[ByteRun],
    slot_bytes: u64,
    slots: usize,
) -> Option<Vec<GatherChunk>> {
    if slot_bytes == 0 || slots == 0 {
        return None;
    }
    let mut chunks: Vec<GatherChunk> = Vec::new();
    let mut used_bytes = slot_bytes; // forces a first chunk
    let mut host_end_bytes = 0u64;
    for r in runs.iter().filter(|r| r.len_bytes > 0) {
        if r.dst_offset_bytes < host_end_bytes {
            return None;
        }
        host_end_bytes = r.dst_offset_bytes.checked_add(r.len_bytes)?;
        let (mut src_at_bytes, mut dst_at_bytes, mut left_bytes) =
            (r.src_offset_bytes, r.dst_offset_bytes, r.len_bytes);
        while left_bytes > 0 {
            if used_bytes == slot_bytes {
                chunks.push(GatherChunk {
                    slot: chunks.len() % slots,
                    gather: Vec::new(),
                    stretches: Vec::new(),
                });
                used_bytes = 0;
            }
            let chunk = chunks.last_mut()?;
            let take_bytes = left_bytes.min(slot_bytes - used_bytes);
            let staged_at_bytes = (chunk.slot as u64)
                .checked_mul(slot_bytes)?
                .checked_add(used_bytes)?;
            chunk
                .gather
                .push(ByteRun::new(src_at_bytes, staged_at_bytes, take_bytes));
            match chunk.stretches.last_mut() {
                Some(s)
                    if s.src_offset_bytes + s.len_bytes == staged_at_bytes
                        && s.dst_offset_bytes + s.len_bytes == dst_at_bytes =>
                {
                    s.len_bytes += take_bytes;
                }
                _ => chunk
                    .stretches
                    .push(ByteRun::new(staged_at_bytes, dst_at_bytes, take_bytes)),
            }
            used_bytes += take_bytes;
            // Inside the run (checked against the host end above; a device offset past
            // u64::MAX gives up rather than wrap).
            src_at_bytes = src_at_bytes.checked_add(take_bytes)?;
            dst_at_bytes += take_bytes;
            left_bytes -= take_bytes;
        }
    }
    Some(chunks)
}

/// True when gathering pays: the stretches to copy out are at most half as many as the gather
/// runs (at least two runs merge into each stretch on average). Otherwise the copy engines pay
/// about the same per stretch as per run, and the gather would only add a pass through HBM and
/// SM time (a `layer_first` host pool, or host pages in reverse order, give one stretch per
/// run). An empty plan counts as paying: there is nothing to copy either way.
pub fn gathering_pays(chunks: &[GatherChunk]) -> bool {
    let runs: usize = chunks.iter().map(|c| c.gather.len()).sum();
    let stretches: usize = chunks.iter().map(|c| c.stretches.len()).sum();
    stretches.saturating_mul(2) <= runs
}
