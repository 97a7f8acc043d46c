//! [`CpuMem`]: a zeroed, page-aligned byte region, the memory of the CPU backend's pools.
//!
//! Page-aligned so that a copy between two regions has the alignment its offsets give it and
//! nothing else. With `Vec<u8>` (16-byte aligned from the heap, or 16 past a page from `mmap`)
//! glibc's `memmove` ran its `rep movsb` path at half speed when source and destination sat at
//! other offsets within a cache line, which depended on where the heap had put them: the main
//! job (`replay`, 33 GB of 16-KiB index-K pages copied from a staging region into the device
//! pool) took 30-33 s or 15 s from the same binary started from another path (BENCHMARKS.md,
//! "Trace replay").

use std::alloc::Layout;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::{BackendError, Memory};

/// Alignment of every region: one 4 KiB page.
pub const CPU_MEM_ALIGN_BYTES: usize = 4096;

/// A zeroed byte region of the CPU backend, aligned to [`CPU_MEM_ALIGN_BYTES`]; derefs to
/// `[u8]`.
pub struct CpuMem {
    /// The first byte of the region: `base` rounded up to [`CPU_MEM_ALIGN_BYTES`].
    ptr: NonNull<u8>,
    len: usize,
    /// The allocation (`calloc`'d, [`CPU_MEM_ALIGN_BYTES`] longer than the region), `None`
    /// for an empty region.
    allocation: Option<(NonNull<u8>, Layout)>,
}

// SAFETY: `CpuMem` owns its region exclusively, like a `Vec<u8>`.
unsafe impl Send for CpuMem {}
// SAFETY: shared access only reads, like `&[u8]`.
unsafe impl Sync for CpuMem {}

impl CpuMem {
    /// `len_bytes` zeroed bytes (`calloc`-like: the OS maps pages lazily, so a large host pool
    /// of which a workload touches a few pages costs only those pages). `side` names the pool
    /// in the error (`device` or `host`): [`BackendError::Alloc`] when the size does not fit
    /// the address space or the allocator refuses, never an abort.
    ///
    /// # Errors
    ///
    /// [`BackendError::Alloc`] naming `side` and `len_bytes` when the size does not fit the address
    /// space or the allocator refuses.
    pub fn zeroed(side: &'static str, len_bytes: u64) -> Result<CpuMem, BackendError> {
        let err = |reason: &str| BackendError::Alloc {
            side,
            len_bytes,
            reason: reason.into(),
        };
        let len = usize::try_from(len_bytes).map_err(|_| err("larger than the address space"))?;
        if len == 0 {
            return Ok(CpuMem {
                ptr: NonNull::dangling(),
                len: 0,
                allocation: None,
            });
        }
        // Over-allocated by one page at the allocator's own alignment and rounded up inside,
        // not allocated at a 4 KiB alignment: `alloc_zeroed` with an alignment above 16 bytes
        // writes every byte (std's `System`), which would map the whole of a large host pool.
        let padded = len
            .checked_add(CPU_MEM_ALIGN_BYTES)
            .ok_or_else(|| err("larger than the address space"))?;
        let layout = Layout::from_size_align(padded, 1).map_err(|_| err("layout overflow"))?;
        // SAFETY: `layout` has a non-zero size.
        let base = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| err("allocator returned null"))?;
        let skip = base.as_ptr().align_offset(CPU_MEM_ALIGN_BYTES);
        // SAFETY: `skip < CPU_MEM_ALIGN_BYTES` (a `u8` pointer can always be aligned), so
        // `[skip, skip + len)` lies inside the `len + CPU_MEM_ALIGN_BYTES` bytes allocated.
        let ptr = unsafe { base.add(skip) };
        Ok(CpuMem {
            ptr,
            len,
            allocation: Some((base, layout)),
        })
    }

    /// Shortens the region to `len` bytes (no effect when `len` is not shorter); the allocation
    /// is kept and freed whole. Tests use it to stand for a pool whose memory shrank.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl From<&[u8]> for CpuMem {
    /// A region holding a copy of `bytes`.
    ///
    /// # Panics
    /// When the allocation fails, as `Vec::from` would (use [`CpuMem::zeroed`] for an error).
    fn from(bytes: &[u8]) -> CpuMem {
        let mut m = CpuMem::zeroed("host", bytes.len() as u64).expect("allocating a CpuMem");
        m.copy_from_slice(bytes);
        m
    }
}

impl Drop for CpuMem {
    fn drop(&mut self) {
        if let Some((base, layout)) = self.allocation {
            // SAFETY: allocated in `zeroed` at `base` with exactly this layout, freed once.
            unsafe { std::alloc::dealloc(base.as_ptr(), layout) }
        }
    }
}

impl Deref for CpuMem {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` holds `len` initialized (zeroed or written) bytes owned by `self`
        // (`len` never grows past the allocation); dangling but aligned when `len` is 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for CpuMem {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `deref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Memory for CpuMem {
    fn len_bytes(&self) -> u64 {
        self.len as u64
    }
}

impl std::fmt::Debug for CpuMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuMem({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_zeroed_page_aligned_and_truncate_only_shortens() {
        let mut m = CpuMem::zeroed("host", 10_000).unwrap();
        assert_eq!(m.as_ptr() as usize % 4096, 0);
        assert_eq!(m.len(), 10_000);
        assert!(m.iter().all(|&b| b == 0));
        m[9_999] = 7;
        m.truncate(20_000);
        assert_eq!(m.len(), 10_000);
        m.truncate(5_000);
        assert_eq!((m.len(), m.len_bytes()), (5_000, 5_000));
        let empty = CpuMem::zeroed("device", 0).unwrap();
        assert!(empty.is_empty());
        let e = CpuMem::zeroed("device", u64::MAX).unwrap_err();
        assert!(
            matches!(e, BackendError::Alloc { side: "device", .. }),
            "{e}"
        );
    }
}
