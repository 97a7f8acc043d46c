//! `TransferGuard`: a device/host pool pair checked once at construction (the full geometry
//! comparison, as `kvlayout check`), then every transfer's page lists checked by the Rust shim
//! (`kvlayout_pool::shim`: layer present, list no longer than the destination pool, every page
//! in range on both sides, no destination page named twice) before the engine moves a byte.
//!
//! The guard is immutable (a frozen pyclass) so one guard may serve several threads (SGLang's
//! load and backup threads): the per-call scratch lists live behind a `Mutex` taken with
//! `try_lock`; a call that finds it held (another thread inside a check, or a reentrant call
//! from an `__index__`/`__dlpack__`) allocates its own for that call.

use std::sync::Mutex;

use kvlayout_core::Level;
use kvlayout_pool::shim::DestinationBitmap;
use kvlayout_pool::{Direction, LayerMap, Layers, PagePair, TransferError};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBool;

use crate::checksum::{self, key_of, layer_index, layer_sums, mode_arg};
use crate::errors;
use crate::geometry::{Geometry, header};
use crate::pages::{PageList, with_pages};
use kvlayout_pool::ChecksumMode;

/// A checked device/host pool pair.
///
/// `TransferGuard(device, host)` compares the two geometries (pool level) and raises
/// `Incompatible` (`.lines`: the CLI's diff lines) when they cannot exchange pages.
/// `check_pages(direction, layer, src_pages, dst_pages)` then checks one transfer.
#[pyclass(module = "kvlayout._kvlayout", frozen)]
pub struct TransferGuard {
    device: Py<Geometry>,
    host: Py<Geometry>,
    device_pages: u64,
    host_pages: u64,
    /// Which layer of each buffer `layer` names: the pool crate's mapping, the one its
    /// transfers use (a model layer id when any buffer gives `layer_ids`, else an index).
    layers: LayerMap,
    /// Kept between calls so a warm, uncontended check allocates nothing.
    scratch: Mutex<Scratch>,
    /// Page checksums: which host pages (`kvlayout_pool::ChecksumMode`).
    checksum: ChecksumMode,
    /// The checksums recorded at backup (`record_backup`), verified at load (`verify_load`).
    table: Mutex<checksum::Table>,
}

/// The per-call working memory of a check.
#[derive(Default)]
struct Scratch {
    /// Pairs of the transfer being checked (16 B per page, bounded by the destination pool's
    /// page count).
    pairs: Vec<PagePair>,
    /// Destinations seen in the list being checked (the shim's bitmap, all clear between
    /// calls).
    seen: DestinationBitmap,
}

/// Reads `layer`: `None`, or an int (not a bool; numpy integers too) that fits an `i64`.
fn layer_arg(py: Python<'_>, layer: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    let Some(l) = layer else { return Ok(None) };
    if l.is_none() {
        return Ok(None);
    }
    if l.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "layer: {} is a bool, not a layer index (pass an int or None)",
            l.repr()?
        )));
    }
    let Some(l) = crate::model::index_int(l)? else {
        return Err(PyTypeError::new_err(format!(
            "layer: expected an int or None, got {}",
            l.get_type().name()?
        )));
    };
    l.extract::<i64>().map(Some).map_err(|_| {
        errors::transfer_refused(
            py,
            format!(
                "layer {}: out of range (past the int64 range)",
                l.repr().map(|r| r.to_string()).unwrap_or_default()
            ),
            "layer",
        )
    })
}

fn kind(e: &TransferError) -> &'static str {
    match e {
        TransferError::Layer { .. } | TransferError::ModelLayer { .. } => "layer",
        TransferError::PageOutOfRange { .. } => "page_out_of_range",
        TransferError::DuplicateDestination { .. } => "duplicate_destination",
        TransferError::TooManyPairs { .. } => "too_many_pairs",
        _ => "refused",
    }
}

fn refused(py: Python<'_>, e: TransferError) -> PyErr {
    errors::transfer_refused(py, e.to_string(), kind(&e))
}

/// Reads both lists into `scratch` as (device page, host page) pairs; a negative index is
/// refused by name.
fn fill(
    py: Python<'_>,
    direction: Direction,
    src: &PageList<'_>,
    dst: &PageList<'_>,
    scratch: &mut Vec<PagePair>,
) -> PyResult<()> {
    scratch.clear();
    if let (Some(s), Some(d)) = (src.raw(), dst.raw()) {
        // Both in memory: a tight loop over the two strided runs.
        for i in 0..src.len() {
            // SAFETY: `i < len` for both (lengths checked equal by the caller).
            let (sv, dv) = unsafe { (s.read(i), d.read(i)) };
            if (sv | dv) < 0 {
                return Err(negative(py, i, sv, dv));
            }
            scratch.push(match direction {
                Direction::Backup => PagePair::new(sv as u64, dv as u64),
                Direction::Load => PagePair::new(dv as u64, sv as u64),
            });
        }
        return Ok(());
    }
    for i in 0..src.len() {
        scratch.push(read_pair(py, direction, src, dst, i)?);
    }
    Ok(())
}

#[cold]
fn negative(py: Python<'_>, i: usize, s: i64, d: i64) -> PyErr {
    let (what, v) = if s < 0 {
        ("src_pages", s)
    } else {
        ("dst_pages", d)
    };
    errors::transfer_refused(
        py,
        format!("{what}[{i}]: page {v} is negative"),
        "page_out_of_range",
    )
}

fn read_pair(
    py: Python<'_>,
    direction: Direction,
    src: &PageList<'_>,
    dst: &PageList<'_>,
    i: usize,
) -> PyResult<PagePair> {
    let (s, d) = (src.get(i)?, dst.get(i)?);
    let page = |v: i64, what: &str| {
        u64::try_from(v).map_err(|_| {
            errors::transfer_refused(
                py,
                format!("{what}[{i}]: page {v} is negative"),
                "page_out_of_range",
            )
        })
    };
    let (s, d) = (page(s, "src_pages")?, page(d, "dst_pages")?);
    Ok(match direction {
        Direction::Backup => PagePair::new(s, d),
        Direction::Load => PagePair::new(d, s),
    })
}

/// A page list as non-negative indices.
fn page_vec(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    with_pages(obj, what, |list| {
        (0..list.len())
            .map(|i| {
                let v = list.get(i)?;
                u64::try_from(v).map_err(|_| {
                    PyValueError::new_err(format!("{what}[{i}]: negative page index {v}"))
                })
            })
            .collect()
    })
}

/// The (device, host) pages of equal-length lists whose host page the mode covers, after
/// every page of both lists is checked: in range of its pool (`device_pages` / `host_pages`
/// pages) and no destination named twice (`dst_is_host`: a backup's destinations are host
/// pages, a load's device pages). Lists of different lengths raise `ValueError`; the others
/// `TransferRefused` (kinds `page_out_of_range`, `duplicate_destination`) naming the list, the
/// index and the values; nothing is recorded or verified then.
fn covered(
    py: Python<'_>,
    mode: ChecksumMode,
    device_pages: &Bound<'_, PyAny>,
    host_pages: &Bound<'_, PyAny>,
    device_count: u64,
    host_count: u64,
    dst_is_host: bool,
) -> PyResult<(Vec<u64>, Vec<u64>)> {
    let dev = page_vec(device_pages, "device_pages")?;
    let host = page_vec(host_pages, "host_pages")?;
    if dev.len() != host.len() {
        return Err(PyValueError::new_err(format!(
            "device_pages has {} pages, host_pages {}",
            dev.len(),
            host.len()
        )));
    }
    for (what, list, count, pool) in [
        ("device_pages", &dev, device_count, "device"),
        ("host_pages", &host, host_count, "host"),
    ] {
        if let Some((i, p)) = list.iter().enumerate().find(|&(_, &p)| p >= count) {
            return Err(errors::transfer_refused(
                py,
                format!(
                    "{what}[{i}]: {pool} page {p} out of range (the {pool} pool has {count} pages)"
                ),
                "page_out_of_range",
            ));
        }
    }
    let (what, dst) = if dst_is_host {
        ("host_pages", &host)
    } else {
        ("device_pages", &dev)
    };
    let mut first = std::collections::HashMap::with_capacity(dst.len());
    for (i, &p) in dst.iter().enumerate() {
        if let Some(j) = first.insert(p, i) {
            return Err(errors::transfer_refused(
                py,
                format!("{what}[{i}]: page {p} is already the destination of {what}[{j}]"),
                "duplicate_destination",
            ));
        }
    }
    Ok(dev
        .into_iter()
        .zip(host)
        .filter(|&(_, h)| mode.covers(h))
        .unzip())
}

#[pymethods]
impl TransferGuard {
    /// Pairs `device` with `host`; raises `Incompatible` when their geometries differ in any
    /// compared field (page size, buffer set, per buffer layers, arrangement, sections, page
    /// stride). `checksum`: `"off"` (default), `"all"` or `"sampled:N"` (host pages that are
    /// multiples of N): which pages `record_backup` records and `verify_load` verifies
    /// (`kvlayout.checksum/v1`, computed in Rust); a bad mode raises `ValueError`. With
    /// `"off"` those two still check every argument (buffer, layer, both page lists, `data`'s
    /// type, contiguity and rows) and raise as in the other modes, so a call wired wrong fails
    /// while checksums are off, not first when they are turned on; they read no bytes and
    /// return 0.
    #[new]
    #[pyo3(signature = (device, host, checksum = "off"))]
    fn new(
        py: Python<'_>,
        device: Py<Geometry>,
        host: Py<Geometry>,
        checksum: &str,
    ) -> PyResult<TransferGuard> {
        let checksum = mode_arg(checksum)?;
        let (d, h) = (device.get(), host.get());
        if let Err(m) = kvlayout_core::compare_at(&d.inner, &h.inner, Level::Pool) {
            let lines: Vec<String> = m.diffs.iter().map(ToString::to_string).collect();
            let head = header(lines.len(), &d.inner, &h.inner, Level::Pool);
            return Err(errors::incompatible(py, lines, head));
        }
        Ok(TransferGuard {
            device_pages: d.inner.pages,
            host_pages: h.inner.pages,
            layers: LayerMap::new(&d.inner, &h.inner),
            scratch: Mutex::new(Scratch {
                pairs: Vec::new(),
                seen: DestinationBitmap::new(d.inner.pages.max(h.inner.pages)),
            }),
            device,
            host,
            checksum,
            table: Mutex::new(checksum::Table::default()),
        })
    }

    /// The checksum mode: `"off"`, `"all"` or `"sampled:N"`.
    #[getter]
    fn checksum(&self) -> String {
        self.checksum.to_string()
    }

    /// The checksum (`kvlayout.checksum/v1`) of each device page of `pages` of `buffer`, layer
    /// `layer` (an index `0..layers`), read from `data`: that layer's device region of the
    /// buffer laid `[page][page stride]` (an SGLang per-layer tensor): a C-contiguous numpy
    /// array or buffer of any dtype, or a CPU torch tensor, read in place in Rust, or a CUDA
    /// torch tensor, read in place on its device by the Rust kernel on PyTorch's current stream
    /// (`crate::checksum_cuda`; `ValueError` naming `data` when libcuda cannot be loaded). Flat
    /// (1-D) `data` is read at page-stride offsets; `data` of 2 or more dimensions must have rows
    /// (bytes per leading index) of the page stride, or of one page row where pages have no
    /// padding (SGLang's `[tokens][heads][head dim]`): [`checksum::check_rows`]. Raises
    /// `InvalidGeometry` (unknown buffer, layer out of range), `ValueError` (a page past the end
    /// of `data`, a negative page, rows of another size naming both byte counts and the buffer).
    fn page_checksums(
        &self,
        py: Python<'_>,
        buffer: &str,
        layer: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        pages: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<u64>> {
        let layer = layer_index(layer)?;
        let (_, key, region) = key_of(py, &self.device.get().inner, buffer, layer)?;
        let pages = page_vec(pages, "pages")?;
        layer_sums(data, &key, &region, &pages, "data")
    }

    /// Records the checksums of a backup (device pages -> host pages) of `buffer`, layer
    /// `layer`, from `data` (the device layer region, as `page_checksums` reads it), for the
    /// host pages the mode covers; returns how many were recorded (0 when the mode is off:
    /// the arguments are checked all the same, no bytes are read).
    /// Call it with the backup (the device pages must hold what is being backed up). Raises
    /// `TransferRefused` (kind `page_out_of_range`: a page past its pool, either list;
    /// `duplicate_destination`: a host page named twice) and records nothing then; `ValueError`
    /// or `TypeError` naming `layer` for a layer that is not an index.
    fn record_backup(
        &self,
        py: Python<'_>,
        buffer: &str,
        layer: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        device_pages: &Bound<'_, PyAny>,
        host_pages: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        let layer = layer_index(layer)?;
        let (b, key, region) = key_of(py, &self.device.get().inner, buffer, layer)?;
        let (dev, host) = covered(
            py,
            self.checksum,
            device_pages,
            host_pages,
            self.device_pages,
            self.host_pages,
            true,
        )?;
        if self.checksum == ChecksumMode::Off {
            checksum::check_data(data, &region, "data")?;
            return Ok(0);
        }
        let sums = layer_sums(data, &key, &region, &dev, "data")?;
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        for (&h, sum) in host.iter().zip(sums) {
            table.recorded.insert((b, layer, h), sum);
        }
        Ok(host.len() as u64)
    }

    /// Verifies a load (host pages -> device pages) of `buffer`, layer `layer`, after the copy
    /// and before the layer is used: each device page in `data` against the checksum recorded
    /// for its host page (pages the mode does not cover, or never recorded, are skipped).
    /// Returns how many pages verified; raises `TransferRefused` (`kind`
    /// `"checksum_mismatch"`, `.pages`: the (host, device) pages refused, to treat as a miss)
    /// naming buffer, layer, pages and both checksums; `page_out_of_range` or
    /// `duplicate_destination` (a device page named twice) before any page is read.
    fn verify_load(
        &self,
        py: Python<'_>,
        buffer: &str,
        layer: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
        host_pages: &Bound<'_, PyAny>,
        device_pages: &Bound<'_, PyAny>,
    ) -> PyResult<u64> {
        let layer = layer_index(layer)?;
        let (b, key, region) = key_of(py, &self.device.get().inner, buffer, layer)?;
        let (dev, host) = covered(
            py,
            self.checksum,
            device_pages,
            host_pages,
            self.device_pages,
            self.host_pages,
            false,
        )?;
        if self.checksum == ChecksumMode::Off {
            checksum::check_data(data, &region, "data")?;
            return Ok(0);
        }
        let recorded: Vec<Option<u64>> = {
            let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
            host.iter()
                .map(|&h| table.recorded.get(&(b, layer, h)).copied())
                .collect()
        };
        let (dev, host, recorded): (Vec<u64>, Vec<u64>, Vec<u64>) = {
            let mut out = (Vec::new(), Vec::new(), Vec::new());
            for ((d, h), r) in dev.iter().zip(&host).zip(recorded) {
                if let Some(r) = r {
                    out.0.push(*d);
                    out.1.push(*h);
                    out.2.push(r);
                }
            }
            out
        };
        let sums = layer_sums(data, &key, &region, &dev, "data")?;
        let bad: Vec<(u64, u64, u64, u64)> = (0..dev.len())
            .filter(|&i| sums[i] != recorded[i])
            .map(|i| (host[i], dev[i], recorded[i], sums[i]))
            .collect();
        if let Some(&(h, d, r, l)) = bad.first() {
            let reason = format!(
                "checksum mismatch on {} of {} page(s) of {buffer} layer {layer} (model layer {}), \
                 refused (treat them as a miss); first: host page {h} -> device page {d}: \
                 checksum {r:#018x} at backup, {l:#018x} after load",
                bad.len(),
                dev.len(),
                key.layer_id
            );
            let err = errors::transfer_refused(py, reason, "checksum_mismatch");
            let pages: Vec<(u64, u64)> = bad.iter().map(|&(h, d, _, _)| (h, d)).collect();
            err.value(py).setattr("pages", pages)?;
            return Err(err);
        }
        Ok(dev.len() as u64)
    }

    /// The device pool's geometry.
    #[getter]
    fn device(&self, py: Python<'_>) -> Py<Geometry> {
        self.device.clone_ref(py)
    }

    /// The host pool's geometry.
    #[getter]
    fn host(&self, py: Python<'_>) -> Py<Geometry> {
        self.host.clone_ref(py)
    }

    /// The pool fingerprint both sides share.
    #[getter]
    fn fingerprint(&self) -> u64 {
        self.device.get().fingerprint
    }

    /// Checks one transfer before it moves a byte; returns `None` or raises `TransferRefused`.
    ///
    /// - `direction`: `"load"` (host -> device: `src_pages` are host pages, `dst_pages` device
    ///   pages) or `"backup"` (device -> host).
    /// - `layer`: a layer, or `None` for all layers. For a geometry whose buffers carry
    ///   `layer_ids` (hybrid models: `describe("gpt-oss-20b")`), the model layer id: the
    ///   buffers that serve it take part, the others are skipped, and a layer no buffer serves
    ///   is refused naming it. Otherwise a plain index `0..layers` of the deepest buffer.
    ///   A bool is refused (`TypeError`).
    /// - `src_pages`, `dst_pages`: equal-length int64 page indices (page, not token, indices):
    ///   a list or tuple of ints, a numpy int64 array or any buffer-protocol object, or a CPU
    ///   tensor with `__dlpack__`; arrays are read in place.
    ///
    /// Trust: array lists are read through the exporter's pointer, shape and strides, as every
    /// buffer-protocol and DLPack consumer does (a lying exporter makes this read out of
    /// bounds); a negative length or a span past the address space is refused (`ValueError`).
    ///
    /// Refusals (`TransferRefused.kind`): `layer` (past the deepest buffer, or a model layer id
    /// no buffer serves), `length` (lists of
    /// different lengths), `too_many_pairs` (more pages than the destination pool holds),
    /// `page_out_of_range` (either side, or negative), `duplicate_destination`.
    #[pyo3(signature = (direction, layer, src_pages, dst_pages))]
    fn check_pages(
        &self,
        py: Python<'_>,
        direction: &str,
        layer: Option<&Bound<'_, PyAny>>,
        src_pages: &Bound<'_, PyAny>,
        dst_pages: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let direction = match direction {
            "load" => Direction::Load,
            "backup" => Direction::Backup,
            other => {
                return Err(PyValueError::new_err(format!(
                    "direction: {other:?} (expected \"load\" or \"backup\")"
                )));
            }
        };
        let layers = match layer_arg(py, layer)? {
            None => Layers::All,
            Some(l) => Layers::One(u64::try_from(l).map_err(|_| {
                errors::transfer_refused(py, format!("layer {l} is negative"), "layer")
            })?),
        };
        self.layers.check(layers).map_err(|e| refused(py, e))?;
        let (device_pages, host_pages) = (self.device_pages, self.host_pages);
        // Uncontended: the guard's own scratch. Held (another thread, or a reentrant call from
        // Python code run while reading a list): this call's own.
        let mut own;
        let mut held = self.scratch.try_lock().ok();
        let s: &mut Scratch = match held.as_deref_mut() {
            Some(s) => s,
            None => {
                own = Scratch::default();
                &mut own
            }
        };
        let (scratch, seen) = (&mut s.pairs, &mut s.seen);
        with_pages(src_pages, "src_pages", |src| {
            with_pages(dst_pages, "dst_pages", |dst| {
                if src.len() != dst.len() {
                    return Err(errors::transfer_refused(
                        py,
                        format!(
                            "src_pages has {} pages, dst_pages {}: one destination page per source page",
                            src.len(),
                            dst.len()
                        ),
                        "length",
                    ));
                }
                // Pigeonhole, before reading the lists: more pairs than destination pages names
                // some destination twice (and bounds the scratch list).
                let dst_pool_pages = match direction {
                    Direction::Backup => host_pages,
                    Direction::Load => device_pages,
                };
                if src.len() as u64 > dst_pool_pages {
                    return Err(refused(
                        py,
                        TransferError::TooManyPairs {
                            pairs: src.len() as u64,
                            side: direction.destination(),
                            pages: dst_pool_pages,
                        },
                    ));
                }
                fill(py, direction, src, dst, scratch)?;
                // The shim's checks: ranges on both sides, then duplicates through its bitmap.
                seen.check_pair_pages(direction, device_pages, host_pages, scratch)
                    .map_err(|e| refused(py, e))
            })
        })
    }

    /// The buffers that hold `layer` and its index in each: `{buffer name: layer index}`.
    /// `layer` as in `check_pages` (a model layer id when the buffers carry `layer_ids`, else
    /// an index); a buffer that does not serve it is left out. Raises `TransferRefused`
    /// (`kind == "layer"`) when no buffer serves it, `TypeError` for a bool or a non-int.
    fn layer_indices<'py>(
        &self,
        py: Python<'py>,
        layer: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let l = match layer_arg(py, Some(layer))? {
            Some(l) => l,
            None => return Err(PyTypeError::new_err("layer: expected an int, got None")),
        };
        let out = pyo3::types::PyDict::new(py);
        if let Ok(l) = u64::try_from(l) {
            for (i, b) in self.device.get().inner.buffers.iter().enumerate() {
                if let Some(index) = self.layers.index(i, l) {
                    out.set_item(&b.name, index)?;
                }
            }
        }
        if out.is_empty() {
            return Err(errors::transfer_refused(
                py,
                format!("layer {l}: no buffer serves it"),
                "layer",
            ));
        }
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!(
            "TransferGuard(fingerprint={:#018x}, device_pages={}, host_pages={}, layers={})",
            self.device.get().fingerprint,
            self.device_pages,
            self.host_pages,
            self.layers.deepest_layers()
        )
    }
}
