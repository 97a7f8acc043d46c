//! Device and host pools: a [`PoolGeometry`] and one memory region holding it.
//!
//! Every offset comes from the geometry ([`PoolGeometry::page_offset_bytes`],
//! [`PoolGeometry::page_segments`], [`TokenLayout::offset_bytes`]); nothing here computes a size
//! from a dtype or a shape. A device pool is `layer_first` (SGLang and vLLM device pools: one
//! tensor per layer); a host pool is any of the four memory layouts and takes every geometry fact
//! from the device pool instance ([`HostPool::mirror_of`]) — or, when it comes from elsewhere
//! ([`HostPool::from_geometry`]), is checked once when paired ([`crate::HiCache::pair`]).
//!
//! [`TokenLayout::offset_bytes`]: kvlayout_core::TokenLayout::offset_bytes

use kvlayout_core::{GeometryError, MemoryLayout, PoolGeometry, layout_error};

use crate::backend::{Backend, BackendError, CpuBackend, Memory};
pub use crate::error::PoolError;
use crate::plan::CopyRun;

/// What device and host pools share: geometry, fingerprint, byte access, and token / page
/// accessors that place bytes by the geometry (the Rust counterpart of SGLang's
/// `index_buf_accessor.py`, for every layout).
pub trait KvPool {
    /// The pool's geometry.
    fn geometry(&self) -> &PoolGeometry;
    /// [`PoolGeometry::fingerprint`], computed once at construction.
    fn fingerprint(&self) -> u64;
    /// Length of the memory region in bytes ([`PoolGeometry::total_bytes`]).
    fn len_bytes(&self) -> u64;
    /// Reads `out.len()` raw bytes at `offset_bytes` of the region.
    ///
    /// # Errors
    ///
    /// [`PoolError::Backend`] ([`BackendError::OutOfRange`]) when the range is not inside the
    /// region.
    fn read_bytes(&self, offset_bytes: u64, out: &mut [u8]) -> Result<(), PoolError>;
    /// Writes raw bytes at `offset_bytes` of the region.
    ///
    /// # Errors
    ///
    /// As [`KvPool::read_bytes`].
    fn write_bytes(&mut self, offset_bytes: u64, data: &[u8]) -> Result<(), PoolError>;

    /// The whole region (tests compare pools byte for byte before and after a transfer).
    ///
    /// # Errors
    ///
    /// [`PoolError::Backend`] ([`BackendError::Alloc`]) when the region does not fit the address
    /// space; the errors of [`KvPool::read_bytes`].
    fn snapshot(&self) -> Result<Vec<u8>, PoolError> {
        let len = usize::try_from(self.len_bytes()).map_err(|_| {
            PoolError::Backend(BackendError::Alloc {
                side: "snapshot",
                len_bytes: self.len_bytes(),
                reason: "larger than the address space".into(),
            })
        })?;
        let mut out = vec![0u8; len];
        self.read_bytes(0, &mut out)?;
        Ok(out)
    }

    /// Reads `out.len()` bytes at `page_offset_bytes` of the canonical page (the arrangement's
    /// byte order, as on a `layer_first` device) of `layer`, `page` of buffer `buffer`,
    /// gathering them from the pool's segments (several under `page_head`, `page_head_token`, `layer_head`, `page_unified`).
    ///
    /// # Errors
    ///
    /// [`PoolError::PageRange`] or a geometry error naming the index when `buffer`, `layer` or
    /// `page` is out of range, or the bytes reach past the page; the errors of
    /// [`KvPool::read_bytes`].
    fn read_page_bytes(
        &self,
        buffer: usize,
        layer: u64,
        page: u64,
        page_offset_bytes: u64,
        out: &mut [u8],
    ) -> Result<(), PoolError> {
        let ranges = page_ranges(
            self.geometry(),
            buffer,
            layer,
            page,
            page_offset_bytes,
            out.len() as u64,
        )?;
        for (at, pool_off, len) in ranges {
            let at = (at - page_offset_bytes) as usize;
            self.read_bytes(pool_off, &mut out[at..at + len as usize])?;
        }
        Ok(())
    }

    /// Writes `data` at `page_offset_bytes` of the canonical page of `layer`, `page` of
    /// `buffer`.
    ///
    /// # Errors
    ///
    /// As [`KvPool::read_page_bytes`].
    fn write_page_bytes(
        &mut self,
        buffer: usize,
        layer: u64,
        page: u64,
        page_offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), PoolError> {
        let ranges = page_ranges(
            self.geometry(),
            buffer,
            layer,
            page,
            page_offset_bytes,
            data.len() as u64,
        )?;
        for (at, pool_off, len) in ranges {
            let at = (at - page_offset_bytes) as usize;
            self.write_bytes(pool_off, &data[at..at + len as usize])?;
        }
        Ok(())
    }

    /// The canonical page payload (the buffer's page size in tokens x bytes per token; a
    /// `state` buffer's page is one slot).
    ///
    /// # Errors
    ///
    /// As [`KvPool::read_page_bytes`].
    fn read_page(&self, buffer: usize, layer: u64, page: u64) -> Result<Vec<u8>, PoolError> {
        let g = self.geometry().page_geometry(buffer)?;
        let mut out = vec![0u8; g.page_payload_bytes as usize];
        self.read_page_bytes(buffer, layer, page, 0, &mut out)?;
        Ok(out)
    }

    /// Writes a canonical page payload.
    ///
    /// # Errors
    ///
    /// As [`KvPool::read_page_bytes`], plus `data` of another length than the page payload.
    fn write_page(
        &mut self,
        buffer: usize,
        layer: u64,
        page: u64,
        data: &[u8],
    ) -> Result<(), PoolError> {
        let g = self.geometry().page_geometry(buffer)?;
        if data.len() as u64 != g.page_payload_bytes {
            return Err(PoolError::TokenShape {
                buffer: self.geometry().buffer(buffer)?.name().to_string(),
                field: "page payload bytes".into(),
                expected: g.page_payload_bytes,
                got: data.len() as u64,
            });
        }
        self.write_page_bytes(buffer, layer, page, 0, data)
    }

    /// One token's entry, section by section (each section's bytes in element order; under
    /// `head_major` the heads' runs are concatenated).
    ///
    /// # Errors
    ///
    /// As [`KvPool::read_page_bytes`], plus a `token` past the page's rows.
    fn read_token(
        &self,
        buffer: usize,
        layer: u64,
        page: u64,
        token: u64,
    ) -> Result<Vec<Vec<u8>>, PoolError> {
        let geom = self.geometry();
        let buf = geom.buffer(buffer)?;
        let layout = &buf.layout;
        let t = geom.buffer_page_rows(buffer)?;
        let err = |e| PoolError::Geometry(layout_error(buffer, buf, e));
        let mut out = Vec::with_capacity(layout.sections().len());
        for s in 0..layout.sections().len() {
            let run_bytes = layout.run_bytes(s).map_err(err)?;
            let runs = layout.runs(s).map_err(err)?;
            let mut bytes = vec![0u8; layout.section_bytes(s).map_err(err)? as usize];
            for r in 0..runs {
                let off = layout.offset_bytes(s, token, r, t).map_err(err)?;
                let at = (r * run_bytes) as usize;
                self.read_page_bytes(
                    buffer,
                    layer,
                    page,
                    off,
                    &mut bytes[at..at + run_bytes as usize],
                )?;
            }
            out.push(bytes);
        }
        Ok(out)
    }

    /// Writes one token's entry, one slice per section in layout order, each exactly the
    /// section's bytes per token.
    ///
    /// # Errors
    ///
    /// As [`KvPool::read_token`], plus [`PoolError::TokenShape`] when the slices are not one per
    /// section of the section's bytes per token.
    fn write_token(
        &mut self,
        buffer: usize,
        layer: u64,
        page: u64,
        token: u64,
        sections: &[&[u8]],
    ) -> Result<(), PoolError> {
        let buf = self.geometry().buffer(buffer)?.clone();
        let layout = &buf.layout;
        let t = self.geometry().buffer_page_rows(buffer)?;
        let err = |e| PoolError::Geometry(layout_error(buffer, &buf, e));
        if sections.len() != layout.sections().len() {
            return Err(PoolError::TokenShape {
                buffer: buf.name().to_string(),
                field: "sections".into(),
                expected: layout.sections().len() as u64,
                got: sections.len() as u64,
            });
        }
        for (s, data) in sections.iter().enumerate() {
            let expected = layout.section_bytes(s).map_err(err)?;
            if data.len() as u64 != expected {
                return Err(PoolError::TokenShape {
                    buffer: buf.name().to_string(),
                    field: format!("sections[{s}] ({}) bytes", layout.sections()[s].name()),
                    expected,
                    got: data.len() as u64,
                });
            }
        }
        for (s, data) in sections.iter().enumerate() {
            let run_bytes = layout.run_bytes(s).map_err(err)?;
            for r in 0..layout.runs(s).map_err(err)? {
                let off = layout.offset_bytes(s, token, r, t).map_err(err)?;
                let at = (r * run_bytes) as usize;
                self.write_page_bytes(
                    buffer,
                    layer,
                    page,
                    off,
                    &data[at..at + run_bytes as usize],
                )?;
            }
        }
        Ok(())
    }
}

/// The runs that copy a canonical page payload held at `src_offset_bytes` of a source region into
/// `layer`, `page` of buffer `buffer` of a pool of `geometry` (one run per pool segment, in
/// canonical order: several under `page_head`, `page_head_token`, `layer_head`, `page_unified`), for [`crate::HiCache::write_device_runs`].
///
/// # Errors
///
/// As [`KvPool::read_page_bytes`] (a bad buffer, layer or page), or an overflowing source offset.
pub fn page_copy_runs(
    geometry: &PoolGeometry,
    buffer: usize,
    layer: u64,
    page: u64,
    src_offset_bytes: u64,
) -> Result<Vec<CopyRun>, PoolError> {
    let payload_bytes = geometry.page_geometry(buffer)?.page_payload_bytes;
    page_ranges(geometry, buffer, layer, page, 0, payload_bytes)?
        .into_iter()
        .map(|(at, pool_off, len)| {
            let src = src_offset_bytes
                .checked_add(at)
                .ok_or_else(|| GeometryError::new("source offset", "overflow computing a run"))?;
            Ok(CopyRun {
                src_offset_bytes: src,
                dst_offset_bytes: pool_off,
                len_bytes: len,
            })
        })
        .collect()
}

/// Maps `[page_offset, page_offset + len)` of the canonical page to pool ranges:
/// `(canonical offset, pool offset, len)` in canonical order.
fn page_ranges(
    geom: &PoolGeometry,
    buffer: usize,
    layer: u64,
    page: u64,
    page_offset_bytes: u64,
    len_bytes: u64,
) -> Result<Vec<(u64, u64, u64)>, PoolError> {
    let name = || {
        geom.buffer(buffer)
            .map(|b| b.name().to_string())
            .unwrap_or_default()
    };
    let payload = geom.page_geometry(buffer)?.page_payload_bytes;
    let end = page_offset_bytes
        .checked_add(len_bytes)
        .filter(|&e| e <= payload)
        .ok_or_else(|| PoolError::PageRange {
            buffer: name(),
            start_bytes: page_offset_bytes,
            end_bytes: page_offset_bytes.saturating_add(len_bytes),
            page_bytes: payload,
        })?;
    let overflow = || GeometryError::new("page offset", "overflow computing a pool offset");
    if !geom.memory_layout.splits_pages() {
        let start = geom.page_offset_bytes(buffer, layer, page)?;
        let at = start.checked_add(page_offset_bytes).ok_or_else(overflow)?;
        return Ok(vec![(page_offset_bytes, at, len_bytes)]);
    }
    let mut out = Vec::new();
    for seg in geom.page_segments(buffer, layer, page)? {
        let seg_end = seg
            .page_offset_bytes
            .checked_add(seg.len_bytes)
            .ok_or_else(overflow)?;
        if seg_end <= page_offset_bytes || seg.page_offset_bytes >= end {
            continue;
        }
        let a = page_offset_bytes.max(seg.page_offset_bytes);
        let e = end.min(seg_end);
        let at = seg
            .pool_offset_bytes
            .checked_add(a - seg.page_offset_bytes)
            .ok_or_else(overflow)?;
        out.push((a, at, e - a));
    }
    out.sort_unstable();
    Ok(out)
}

/// Write access to the bytes of one paired pool ([`crate::HiCache::device_writer`],
/// [`crate::HiCache::host_writer`]): raw bytes, canonical pages and tokens, placed by the
/// pool's geometry. It holds the pool but never hands it out, so the pool cannot be replaced
/// or resized through it.
pub struct PoolWriter<'a, P: KvPool> {
    pool: &'a mut P,
}

impl<'a, P: KvPool> PoolWriter<'a, P> {
    pub(crate) fn new(pool: &'a mut P) -> Self {
        PoolWriter { pool }
    }

    /// The pool, read only.
    pub fn pool(&self) -> &P {
        self.pool
    }

    /// [`KvPool::write_bytes`].
    ///
    /// # Errors
    ///
    /// As [`KvPool::write_bytes`].
    pub fn write_bytes(&mut self, offset_bytes: u64, data: &[u8]) -> Result<(), PoolError> {
        self.pool.write_bytes(offset_bytes, data)
    }

    /// [`KvPool::write_page_bytes`].
    ///
    /// # Errors
    ///
    /// As [`KvPool::write_page_bytes`].
    pub fn write_page_bytes(
        &mut self,
        buffer: usize,
        layer: u64,
        page: u64,
        page_offset_bytes: u64,
        data: &[u8],
    ) -> Result<(), PoolError> {
        self.pool
            .write_page_bytes(buffer, layer, page, page_offset_bytes, data)
    }

    /// [`KvPool::write_page`].
    ///
    /// # Errors
    ///
    /// As [`KvPool::write_page`].
    pub fn write_page(
        &mut self,
        buffer: usize,
        layer: u64,
        page: u64,
        data: &[u8],
    ) -> Result<(), PoolError> {
        self.pool.write_page(buffer, layer, page, data)
    }

    /// [`KvPool::write_token`].
    ///
    /// # Errors
    ///
    /// As [`KvPool::write_token`].
    pub fn write_token(
        &mut self,
        buffer: usize,
        layer: u64,
        page: u64,
        token: u64,
        sections: &[&[u8]],
    ) -> Result<(), PoolError> {
        self.pool.write_token(buffer, layer, page, token, sections)
    }
}

fn fingerprint_of(geometry: &PoolGeometry) -> Result<u64, PoolError> {
    geometry.fingerprint().map_err(PoolError::Fingerprint)
}

/// A device KV pool: `layer_first`, one region (CPU: ordinary memory; CUDA: device memory).
pub struct DevicePool<B: Backend = CpuBackend> {
    geometry: PoolGeometry,
    fingerprint: u64,
    backend: B,
    mem: B::DeviceMem,
}

impl DevicePool<CpuBackend> {
    /// A device pool in ordinary memory.
    ///
    /// # Errors
    ///
    /// An invalid geometry (the field and value), a memory layout other than `layer_first`, or an
    /// allocation failure.
    pub fn new(geometry: PoolGeometry) -> Result<Self, PoolError> {
        DevicePool::new_in(CpuBackend, geometry)
    }
}

impl<B: Backend> DevicePool<B> {
    /// A device pool on `backend`.
    ///
    /// # Errors
    ///
    /// As [`DevicePool::new`].
    pub fn new_in(backend: B, geometry: PoolGeometry) -> Result<Self, PoolError> {
        geometry.validate()?;
        if geometry.memory_layout != MemoryLayout::LayerFirst {
            return Err(PoolError::DeviceLayout {
                got: geometry.memory_layout,
            });
        }
        let fingerprint = fingerprint_of(&geometry)?;
        let mem = backend.alloc_device(geometry.total_bytes()?)?;
        Ok(DevicePool {
            geometry,
            fingerprint,
            backend,
            mem,
        })
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The memory region (for a backend executing a plan).
    pub fn memory(&self) -> &B::DeviceMem {
        &self.mem
    }

    pub(crate) fn memory_mut(&mut self) -> &mut B::DeviceMem {
        &mut self.mem
    }
}

/// [`KvPool`] for a pool type over its backend's side: `$read` / `$write` are the
/// [`Backend`] methods of that side (`read_device` / `write_device`, or the host's). One
/// implementation for both pools: they differ only in which side of the backend holds them.
macro_rules! kv_pool_on_side {
    ($pool:ident, $read:ident, $write:ident) => {
        impl<B: Backend> KvPool for $pool<B> {
            fn geometry(&self) -> &PoolGeometry {
                &self.geometry
            }

            fn fingerprint(&self) -> u64 {
                self.fingerprint
            }

            fn len_bytes(&self) -> u64 {
                self.mem.len_bytes()
            }

            fn read_bytes(&self, offset_bytes: u64, out: &mut [u8]) -> Result<(), PoolError> {
                Ok(self.backend.$read(&self.mem, offset_bytes, out)?)
            }

            fn write_bytes(&mut self, offset_bytes: u64, data: &[u8]) -> Result<(), PoolError> {
                Ok(self.backend.$write(&mut self.mem, offset_bytes, data)?)
            }
        }
    };
}

kv_pool_on_side!(DevicePool, read_device, write_device);

/// A host KV pool (CPU: ordinary memory; CUDA: pinned host memory) in any memory layout.
pub struct HostPool<B: Backend = CpuBackend> {
    geometry: PoolGeometry,
    fingerprint: u64,
    backend: B,
    mem: B::HostMem,
    mirrored: bool,
}

/// The geometry of a host mirror of a device pool of geometry `device` (what
/// [`HostPool::mirror_of`] allocates): only `pages`, `memory_layout` and `name` changed, so
/// every compared field is the device's. For callers that need the mirror's geometry without
/// allocating it (the replay compares and fingerprints the full-depth pools, while it allocates
/// a prefix of their layers).
pub fn mirror_geometry(
    device: &PoolGeometry,
    host_pages: u64,
    memory_layout: MemoryLayout,
) -> PoolGeometry {
    PoolGeometry {
        name: format!("host mirror of {}", device.name),
        pages: host_pages,
        memory_layout,
        ..device.clone()
    }
}

impl<B: Backend> HostPool<B> {
    /// The host mirror of `device`: the device pool's geometry with only `pages`,
    /// `memory_layout` and `name` changed — no formula of its own, so dtype, sections, page size,
    /// page stride and layer counts are the device instance's.
    ///
    /// # Errors
    ///
    /// `host_pages` of 0, `page_head` over a buffer whose sections are not `[heads, ...]` (MLA,
    /// index-K), overflow, allocation failure.
    pub fn mirror_of(
        device: &DevicePool<B>,
        host_pages: u64,
        memory_layout: MemoryLayout,
    ) -> Result<Self, PoolError> {
        let geometry = mirror_geometry(device.geometry(), host_pages, memory_layout);
        let mut pool = HostPool::from_geometry_in(device.backend().clone(), geometry)?;
        pool.mirrored = true;
        Ok(pool)
    }

    /// A host pool from a foreign geometry (a geometry file another engine wrote) on
    /// `backend`. Pairing it with a device pool checks geometry once ([`crate::HiCache::pair`]).
    ///
    /// # Errors
    ///
    /// An invalid geometry (the field and value), a size that overflows, or an allocation failure
    /// ([`PoolError`]).
    pub fn from_geometry_in(backend: B, geometry: PoolGeometry) -> Result<Self, PoolError> {
        geometry.validate()?;
        let fingerprint = fingerprint_of(&geometry)?;
        let mem = backend.alloc_host(geometry.total_bytes()?)?;
        Ok(HostPool {
            geometry,
            fingerprint,
            backend,
            mem,
            mirrored: false,
        })
    }

    /// Whether this pool was made by [`HostPool::mirror_of`].
    pub fn is_mirror(&self) -> bool {
        self.mirrored
    }

    /// The memory region.
    pub fn memory(&self) -> &B::HostMem {
        &self.mem
    }

    pub(crate) fn memory_mut(&mut self) -> &mut B::HostMem {
        &mut self.mem
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }
}

impl HostPool<CpuBackend> {
    /// A host pool in ordinary memory from a foreign geometry.
    ///
    /// # Errors
    ///
    /// As [`HostPool::from_geometry_in`].
    pub fn from_geometry(geometry: PoolGeometry) -> Result<Self, PoolError> {
        HostPool::from_geometry_in(CpuBackend, geometry)
    }
}

kv_pool_on_side!(HostPool, read_host, write_host);
