//! The CPU backend: every pool is one zeroed, page-aligned [`CpuMem`]; copies are
//! `copy_from_slice` per run.
//! The device pool then lives in ordinary memory and behaves byte for byte like a GPU pool.

use super::cpu_mem::CpuMem;
use super::{Backend, BackendError, check_range, check_runs};
use crate::plan::{CopyRun, Direction};

/// Pools in ordinary memory (the embedded default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuBackend;

fn alloc(side: &'static str, len_bytes: u64) -> Result<CpuMem, BackendError> {
    CpuMem::zeroed(side, len_bytes)
}

fn read(side: &'static str, mem: &[u8], offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
    check_range(side, offset, out.len() as u64, mem.len() as u64)?;
    let start = offset as usize;
    out.copy_from_slice(&mem[start..start + out.len()]);
    Ok(())
}

fn write(side: &'static str, mem: &mut [u8], offset: u64, data: &[u8]) -> Result<(), BackendError> {
    check_range(side, offset, data.len() as u64, mem.len() as u64)?;
    let start = offset as usize;
    mem[start..start + data.len()].copy_from_slice(data);
    Ok(())
}

/// The CPU run copy, the one every CPU path uses (this backend, the fault-injecting one, and
/// the kernels crate's tests as the reference of its GPU copy).
///
/// Contract: copies `len_bytes` from `src[src_offset_bytes..]` to `dst[dst_offset_bytes..]`
/// for every run, in list order, after checking every run first: on error no byte is written.
/// The error is [`BackendError::OutOfRange`] for the first run, in list order, whose source
/// range (named `direction.source()`: `device` for a backup) or destination range
/// (`direction.destination()`) reaches past its slice, with its range computed without
/// overflow (`end_bytes` saturates). Where destination ranges overlap, the later run wins.
/// An empty list copies nothing and succeeds.
///
/// # Errors
///
/// [`BackendError::OutOfRange`] for the first run, in list order, outside its source or destination
/// slice (the contract above); no byte is written then.
pub fn copy_runs(
    direction: Direction,
    src: &[u8],
    dst: &mut [u8],
    runs: &[CopyRun],
) -> Result<(), BackendError> {
    check_runs(direction, src.len() as u64, dst.len() as u64, runs)?;
    for r in runs {
        // In range: checked above against both lengths (both fit a usize: they are slices).
        let (s, d, n) = (
            r.src_offset_bytes as usize,
            r.dst_offset_bytes as usize,
            r.len_bytes as usize,
        );
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
    }
    Ok(())
}

// SAFETY: every copy finishes before the call that makes it returns (the default enqueue);
// `wait` does nothing; `shares_waits_with` is the default (false).
unsafe impl Backend for CpuBackend {
    type DeviceMem = CpuMem;
    type HostMem = CpuMem;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn alloc_device(&self, len_bytes: u64) -> Result<CpuMem, BackendError> {
        alloc("device", len_bytes)
    }

    fn alloc_host(&self, len_bytes: u64) -> Result<CpuMem, BackendError> {
        alloc("host", len_bytes)
    }

    fn read_device(&self, mem: &CpuMem, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        read("device", mem, offset, out)
    }

    fn write_device(&self, mem: &mut CpuMem, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        write("device", mem, offset, data)
    }

    fn read_host(&self, mem: &CpuMem, offset: u64, out: &mut [u8]) -> Result<(), BackendError> {
        read("host", mem, offset, out)
    }

    fn write_host(&self, mem: &mut CpuMem, offset: u64, data: &[u8]) -> Result<(), BackendError> {
        write("host", mem, offset, data)
    }

    fn device_to_host(
        &self,
        src: &CpuMem,
        dst: &mut CpuMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        copy_runs(Direction::Backup, src, dst, runs)
    }

    fn host_to_device(
        &self,
        src: &CpuMem,
        dst: &mut CpuMem,
        runs: &[CopyRun],
    ) -> Result<(), BackendError> {
        copy_runs(Direction::Load, src, dst, runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_with_one_bad_run_moves_no_byte() {
        let b = CpuBackend;
        let src = CpuMem::from(&[7u8; 64][..]);
        let mut dst = b.alloc_host(32).unwrap();
        let runs = [
            CopyRun {
                src_offset_bytes: 0,
                dst_offset_bytes: 0,
                len_bytes: 16,
            },
            CopyRun {
                src_offset_bytes: 0,
                dst_offset_bytes: 24,
                len_bytes: 16,
            },
        ];
        let err = b.device_to_host(&src, &mut dst, &runs).unwrap_err();
        assert_eq!(
            err,
            BackendError::OutOfRange {
                side: "host",
                start_bytes: 24,
                end_bytes: 40,
                len_bytes: 32
            }
        );
        assert_eq!(&dst[..], &[0u8; 32][..]);
    }

    fn run(src: u64, dst: u64, len: u64) -> CopyRun {
        CopyRun {
            src_offset_bytes: src,
            dst_offset_bytes: dst,
            len_bytes: len,
        }
    }

    /// The contract of the one CPU run copy, clause by clause.
    #[test]
    fn copy_runs_contract_order_sides_overflow_and_overlap() {
        let src = CpuMem::from(&[1u8, 2, 3, 4, 5, 6, 7, 8][..]);
        let mut dst = vec![0u8; 4];
        // In list order; overlapping destinations: the later run wins (bytes 3, 4 then 5, 6 at
        // 1..3).
        copy_runs(
            Direction::Backup,
            &src,
            &mut dst,
            &[run(2, 0, 2), run(4, 1, 2)],
        )
        .unwrap();
        assert_eq!(dst, [3, 5, 6, 0]);
        // An empty list copies nothing.
        copy_runs(Direction::Load, &src, &mut dst, &[]).unwrap();
        assert_eq!(dst, [3, 5, 6, 0]);
        // The first bad run in list order; its source range before its destination; sides
        // named by the direction (a load reads the host).
        let err = copy_runs(
            Direction::Load,
            &src,
            &mut dst,
            &[run(0, 0, 1), run(7, 9, 2), run(9, 0, 1)],
        )
        .unwrap_err();
        assert_eq!(
            err,
            BackendError::OutOfRange {
                side: "host",
                start_bytes: 7,
                end_bytes: 9,
                len_bytes: 8,
            }
        );
        // An end past u64::MAX saturates instead of wrapping into range.
        let err = copy_runs(Direction::Backup, &src, &mut dst, &[run(0, u64::MAX, 2)]).unwrap_err();
        assert_eq!(
            err,
            BackendError::OutOfRange {
                side: "host",
                start_bytes: u64::MAX,
                end_bytes: u64::MAX,
                len_bytes: 4,
            }
        );
        // Nothing moved by the refused lists.
        assert_eq!(dst, [3, 5, 6, 0]);
    }
}
