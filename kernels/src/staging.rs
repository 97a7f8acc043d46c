//! The staged transfer path's host half: a checked run list between a host pool and a device
//! pool cut into chunks that fit a staging buffer, and the host threads' gather into and
//! scatter from that buffer.
//!
//! A staged load (host -> device) gathers each chunk's runs from the host pool into pinned
//! staging memory with host threads ([`gather_into_staging`]), sends the chunk with ONE
//! contiguous copy, and scatters it on the device into the device pool (the run-list kernel on a
//! few SMs). A staged backup is the mirror: a device gather into device staging, one contiguous
//! copy back, then host threads scatter into the host pool ([`scatter_from_staging`]). The copy
//! engines then see one large copy per chunk instead of one driver entry per run (the driver
//! spends 0.4-0.9 us of host time per run of `cuMemcpyBatchAsync` on an H200, BENCHMARKS.md).
//!
//! Every function here is plain CPU code: the CPU tests check a whole staged transfer (plan,
//! gather, a CPU stand-in for the device half, scatter) against the pool crate's CPU run copy,
//! bit for bit.

use rayon::prelude::*;

use crate::copy_runs::ByteRun;
use crate::error::KernelError;

/// Staging offsets are multiples of this, so the device half can use 16-byte accesses when
/// the device pool's offsets allow.
pub const STAGING_ALIGN_BYTES: u64 = 16;

/// One piece of a staged transfer: `len_bytes` at `host_offset_bytes` of the host pool, at
/// `device_offset_bytes` of the device pool, and at `staging_offset_bytes` of its chunk's
/// staging buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StagedPiece {
    /// Offset in the host pool.
    pub host_offset_bytes: u64,
    /// Offset in the device pool.
    pub device_offset_bytes: u64,
    /// Offset in the chunk's staging buffer (a multiple of [`STAGING_ALIGN_BYTES`]).
    pub staging_offset_bytes: u64,
    /// Bytes.
    pub len_bytes: u64,
}

/// The pieces that go through one staging buffer together, in host-address order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StagedChunk {
    /// Pieces, in staging (and host-address) order.
    pub pieces: Vec<StagedPiece>,
    /// Staging bytes used: the end of the last piece.
    pub used_bytes: u64,
}

/// Which way a staged transfer goes; the host pool is the source of a load and the destination
/// of a backup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StagedDirection {
    /// Host pool -> device pool (`ByteRun::src` is the host offset).
    Load,
    /// Device pool -> host pool (`ByteRun::dst` is the host offset).
    Backup,
}

/// Cuts `runs` (already checked against both pools) into chunks of at most
/// `chunk_bytes` staging bytes and `max_pieces` pieces, in host-address order; a run longer
/// than a chunk is split. Empty runs are dropped (they move nothing).
///
/// Errors: `chunk_bytes` below [`STAGING_ALIGN_BYTES`] or `max_pieces` zero
/// ([`KernelError::Spec`]); for a backup, two runs writing overlapping host bytes
/// ([`KernelError::Spec`] naming both): the host threads write pieces in parallel, so their
/// destinations must be disjoint.
pub fn plan_staged_chunks(
    runs: &[ByteRun],
    direction: StagedDirection,
    chunk_bytes: u64,
    max_pieces: usize,
) -> Result<Vec<StagedChunk>, KernelError> {
    if chunk_bytes < STAGING_ALIGN_BYTES {
        return Err(KernelError::spec(
            "chunk_bytes",
            format!(
                "a staging chunk needs at least {STAGING_ALIGN_BYTES} bytes, got {chunk_bytes}"
            ),
        ));
    }
    if max_pieces == 0 {
        return Err(KernelError::spec(
            "max_pieces",
            "a staging chunk needs room for at least 1 piece",
        ));
    }
    let host_dev = |r: &ByteRun| match direction {
        StagedDirection::Load => (r.src_offset_bytes, r.dst_offset_bytes),
        StagedDirection::Backup => (r.dst_offset_bytes, r.src_offset_bytes),
    };
    let mut sorted: Vec<ByteRun> = runs.iter().copied().filter(|r| r.len_bytes > 0).collect();
    sorted.sort_by_key(|r| host_dev(r).0);
    if direction == StagedDirection::Backup {
        for w in sorted.windows(2) {
            let (a, b) = (host_dev(&w[0]).0, host_dev(&w[1]).0);
            // No overflow: every run was checked to fit its pools (u64 ends).
            if a + w[0].len_bytes > b {
                return Err(KernelError::spec(
                    "runs",
                    format!(
                        "a staged backup needs disjoint host ranges: {:?} and {:?} overlap",
                        w[0], w[1]
                    ),
                ));
            }
        }
    }
    let mut chunks = Vec::new();
    let mut cur = StagedChunk::default();
    for r in &sorted {
        let (mut host, mut dev) = host_dev(r);
        let mut left = r.len_bytes;
        while left > 0 {
            let at = cur.used_bytes.next_multiple_of(STAGING_ALIGN_BYTES);
            if cur.pieces.len() == max_pieces || at >= chunk_bytes {
                chunks.push(std::mem::take(&mut cur));
                continue;
            }
            let len = left.min(chunk_bytes - at);
            // A run that would be split although it fits a fresh chunk starts one instead.
            if len < left && left <= chunk_bytes && !cur.pieces.is_empty() {
                chunks.push(std::mem::take(&mut cur));
                continue;
            }
            cur.pieces.push(StagedPiece {
                host_offset_bytes: host,
                device_offset_bytes: dev,
                staging_offset_bytes: at,
                len_bytes: len,
            });
            cur.used_bytes = at + len;
            host += len;
            dev += len;
            left -= len;
        }
    }
    if !cur.pieces.is_empty() {
        chunks.push(cur);
    }
    Ok(chunks)
}

/// The chunk's pieces as device runs: for a load `(staging, device, len)` (the device scatter
/// reads staging), for a backup `(device, staging, len)` (the device gather writes it).
pub fn device_runs(chunk: &StagedChunk, direction: StagedDirection) -> Vec<ByteRun> {
    chunk
        .pieces
        .iter()
        .map(|p| match direction {
            StagedDirection::Load => {
                ByteRun::new(p.staging_offset_bytes, p.device_offset_bytes, p.len_bytes)
            }
            StagedDirection::Backup => {
                ByteRun::new(p.device_offset_bytes, p.staging_offset_bytes, p.len_bytes)
            }
        })
        .collect()
}

/// Disjoint mutable ranges `(offset, len)`, given in ascending non-overlapping order, of `buf`.
fn disjoint_mut(
    mut buf: &mut [u8],
    ranges: impl Iterator<Item = (u64, u64)>,
) -> Result<Vec<&mut [u8]>, KernelError> {
    let mut out = Vec::new();
    let mut consumed: u64 = 0;
    for (offset, len) in ranges {
        let end = offset.checked_add(len);
        let fits = offset >= consumed && end.is_some_and(|e| e - consumed <= buf.len() as u64);
        if !fits {
            return Err(KernelError::Length {
                what: format!("staged piece of {len} bytes at offset {offset}: buffer"),
                expected: offset.saturating_add(len),
                actual: consumed + buf.len() as u64,
                unit: "bytes",
            });
        }
        let rest = std::mem::take(&mut buf);
        let (_, from) = rest.split_at_mut((offset - consumed) as usize);
        let (piece, tail) = from.split_at_mut(len as usize);
        out.push(piece);
        buf = tail;
        consumed = offset + len;
    }
    Ok(out)
}

fn range(buf: &[u8], offset: u64, len: u64) -> Result<&[u8], KernelError> {
    let end = offset.checked_add(len).filter(|&e| e <= buf.len() as u64);
    match end {
        Some(end) => Ok(&buf[offset as usize..end as usize]),
        None => Err(KernelError::Length {
            what: format!("staged piece of {len} bytes at offset {offset}: buffer"),
            expected: offset.saturating_add(len),
            actual: buf.len() as u64,
            unit: "bytes",
        }),
    }
}

/// A load's host half: copies every piece of `chunk` from `host_pool` into `staging` (its
/// staging offset), on the rayon threads. Errors ([`KernelError::Length`]) when a piece lies
/// outside either buffer; then nothing is promised about `staging`.
pub fn gather_into_staging(
    host_pool: &[u8],
    chunk: &StagedChunk,
    staging: &mut [u8],
) -> Result<(), KernelError> {
    let outs = disjoint_mut(
        staging,
        chunk
            .pieces
            .iter()
            .map(|p| (p.staging_offset_bytes, p.len_bytes)),
    )?;
    let ins: Vec<&[u8]> = chunk
        .pieces
        .iter()
        .map(|p| range(host_pool, p.host_offset_bytes, p.len_bytes))
        .collect::<Result<_, _>>()?;
    outs.into_par_iter()
        .zip(ins)
        .for_each(|(o, i)| o.copy_from_slice(i));
    Ok(())
}

/// A backup's host half: copies every piece of `chunk` from `staging` into `host_pool` (its host
/// offset), on the rayon threads. The pieces' host ranges must be ascending and disjoint (as
/// [`plan_staged_chunks`] makes them); otherwise, or when a piece lies outside either buffer,
/// [`KernelError::Length`] and nothing is written.
pub fn scatter_from_staging(
    staging: &[u8],
    chunk: &StagedChunk,
    host_pool: &mut [u8],
) -> Result<(), KernelError> {
    let ins: Vec<&[u8]> = chunk
        .pieces
        .iter()
        .map(|p| range(staging, p.staging_offset_bytes, p.len_bytes))
        .collect::<Result<_, _>>()?;
    let outs = disjoint_mut(
        host_pool,
        chunk
            .pieces
            .iter()
            .map(|p| (p.host_offset_bytes, p.len_bytes)),
    )?;
    outs.into_par_iter()
        .zip(ins)
        .for_each(|(o, i)| o.copy_from_slice(i));
    Ok(())
}

/// `runs` with every run longer than `max_len_bytes` cut into pieces of `max_len_bytes` (the
/// last shorter), in order: the device half gives each run a warp, so short runs spread a
/// chunk over every SM and keep its scatter or gather short. A zero `max_len_bytes` leaves the
/// runs as they are.
pub fn split_runs(runs: &[ByteRun], max_len_bytes: u64) -> Vec<ByteRun> {
    if max_len_bytes == 0 {
        return runs.to_vec();
    }
    let mut out = Vec::with_capacity(runs.len());
    for r in runs {
        let mut at = 0;
        while at < r.len_bytes {
            let len = (r.len_bytes - at).min(max_len_bytes);
            out.push(ByteRun::new(
                r.src_offset_bytes + at,
                r.dst_offset_bytes + at,
                len,
            ));
            at += len;
        }
    }
    out
}
