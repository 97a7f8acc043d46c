//! Page checksums from Python (`kvlayout.checksum/v1`, `kvlayout_core::checksum`), computed in
//! Rust on the bytes of a numpy array or CPU tensor in place, or on the device of a CUDA tensor
//! ([`crate::checksum_cuda`]): `page_checksum` of one payload,
//! and the host-side table of a [`crate::guard::TransferGuard`] with a checksum mode
//! (`record_backup` / `verify_load`).

use std::collections::HashMap;

use kvlayout_core::PoolGeometry;
use kvlayout_core::checksum::PageChecksumKey;
use kvlayout_pool::ChecksumMode;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::checksum_cuda;
use crate::errors;
use crate::geometry::{Geometry, geometry_err};
use crate::pages::{buffer_shape, with_bytes};

/// A checksum call's `layer` argument: a layer index `0..layers` as an int (numpy integers
/// too); a bool or another type is a `TypeError`, a negative or oversized int a `ValueError`,
/// each naming `layer` and the value (pyo3's own conversion named neither).
pub fn layer_index(layer: &Bound<'_, PyAny>) -> PyResult<u64> {
    let Some(l) = crate::model::index_int(layer)? else {
        return Err(PyTypeError::new_err(format!(
            "layer: {} is not a layer index (pass an int, 0..layers)",
            layer.repr()?
        )));
    };
    l.extract::<u64>().map_err(|_| {
        PyValueError::new_err(format!(
            "layer: {} is not a layer index (0..layers)",
            l.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })
}

/// How one layer's region of a buffer lays its pages, for reading `data`: the page stride, and
/// what a shaped `data`'s rows may be ([`check_rows`]).
pub struct Region {
    /// The buffer's name.
    pub buffer: String,
    /// Distance between consecutive pages.
    pub stride_bytes: u64,
    /// Bytes of one row of a page (a token's entry; `compress_ratio` tokens' in v3) and rows per
    /// page, when a page is its rows back to back with no padding (SGLang's per-layer tensor,
    /// `[tokens][heads][head dim]`, is such rows); `None` when the stride pads the payload.
    pub rows: Option<(u64, u64)>,
}

/// The key of layer `layer` of the buffer named `buffer`, and how the buffer's layer region
/// lays its pages.
pub fn key_of(
    py: Python<'_>,
    g: &PoolGeometry,
    buffer: &str,
    layer: u64,
) -> PyResult<(usize, PageChecksumKey, Region)> {
    let b = g.buffer_index(buffer).ok_or_else(|| {
        let names: Vec<&str> = g.buffers.iter().map(|b| b.name()).collect();
        errors::invalid_geometry(
            py,
            "buffer",
            &format!("no buffer named {buffer:?} (buffers: {})", names.join(", ")),
        )
    })?;
    let key = g
        .page_checksum_key(b, layer)
        .map_err(|e| geometry_err(py, &e))?;
    let pg = g.page_geometry(b).map_err(|e| geometry_err(py, &e))?;
    let region = Region {
        buffer: buffer.to_string(),
        stride_bytes: pg.page_stride_bytes,
        rows: (pg.page_payload_bytes == pg.page_stride_bytes)
            .then_some((pg.bytes_per_token, pg.rows_per_page)),
    };
    Ok((b, key, region))
}

/// The shape and item size of `data`: a buffer-protocol object's, or a torch tensor's
/// (`shape`, `element_size()`); `None` when neither can be read (the object is refused or read
/// flat by the caller).
fn shape_of(data: &Bound<'_, PyAny>) -> Option<(Vec<u64>, u64)> {
    if let Some(s) = buffer_shape(data) {
        return Some(s);
    }
    let shape: Vec<u64> = data.getattr("shape").ok()?.extract().ok()?;
    let item: u64 = data.call_method0("element_size").ok()?.extract().ok()?;
    Some((shape, item))
}

/// Refuses a `data` of two or more dimensions whose rows (bytes per leading index: the product
/// of every dimension but the first, times the item size) are not the buffer's page stride, nor
/// one of a page's rows where pages have no padding (`[tokens][token bytes]`, SGLang's
/// per-layer tensor): its pages would be read at other places than its rows say (trial
/// finding: rows of 4,080 B in a 4,096-B-stride region were checksummed at 4,096-B strides).
/// Flat data (1-D bytes, any length) is read as laid `[page][page stride]`, as before.
pub fn check_rows(data: &Bound<'_, PyAny>, region: &Region, what: &str) -> PyResult<()> {
    let Some((shape, item)) = shape_of(data) else {
        return Ok(());
    };
    if shape.len() < 2 {
        return Ok(());
    }
    let row = shape[1..]
        .iter()
        .fold(u128::from(item), |a, &d| a.saturating_mul(u128::from(d)));
    let stride = region.stride_bytes;
    if row == u128::from(stride) || region.rows.is_some_and(|(r, _)| row == u128::from(r)) {
        return Ok(());
    }
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    let alt = match region.rows {
        Some((r, n)) if r != stride => {
            format!(" or {r} bytes (one of a page's {n} rows, as SGLang's per-layer tensor)")
        }
        _ => String::new(),
    };
    Err(PyValueError::new_err(format!(
        "{what}: rows of {row} bytes (shape ({}), {item}-byte items), but buffer {:?} has a \
         page stride of {stride} bytes: a region of 2 or more dimensions is read a page per \
         row, so its rows must be {stride} bytes{alt}; pass the layer's region shaped so, or \
         flat (1-D bytes)",
        dims.join(", "),
        region.buffer
    )))
}

/// The checksum of each page of `pages` in `data` (one layer of one buffer laid `[page][page
/// stride]`: an SGLang per-layer tensor), with the page's index.
pub fn page_sums(
    key: &PageChecksumKey,
    stride_bytes: u64,
    data: &[u8],
    pages: &[u64],
    what: &str,
) -> PyResult<Vec<u64>> {
    pages
        .iter()
        .map(|&p| {
            let start = p.checked_mul(stride_bytes);
            let end = start.and_then(|s| s.checked_add(key.payload_bytes));
            match (start, end) {
                (Some(s), Some(e)) if e <= data.len() as u64 => Ok(kvlayout_core::checksum::page_checksum(
                    key.token_fingerprint,
                    key.layer_id,
                    &data[s as usize..e as usize],
                )),
                _ => Err(PyValueError::new_err(format!(
                    "{what}: page {p} ({stride_bytes} B stride, {} B payload) ends past the {} bytes given",
                    key.payload_bytes,
                    data.len()
                ))),
            }
        })
        .collect()
}

/// The bytes of `data`: a buffer-protocol object in place, or a CPU torch tensor through
/// `kvlayout.tensors._host_bytes` (a zero-copy uint8 view); `what` names the caller's argument
/// in either's errors.
fn with_data<R>(
    data: &Bound<'_, PyAny>,
    what: &str,
    f: impl FnOnce(&[u8]) -> PyResult<R>,
) -> PyResult<R> {
    if data.hasattr(pyo3::intern!(data.py(), "__dlpack__"))?
        && !data.hasattr(pyo3::intern!(data.py(), "__array_interface__"))?
    {
        let view = data
            .py()
            .import("kvlayout.tensors")?
            .call_method1("_host_bytes", (data, what))?;
        return with_bytes(&view, what, f);
    }
    with_bytes(data, what, f)
}

/// The checksum of each page of `pages` in `data` (one layer of one buffer laid `[page][page
/// stride]`): on the device for a CUDA torch tensor, else in Rust on the CPU, in place.
pub fn layer_sums(
    data: &Bound<'_, PyAny>,
    key: &PageChecksumKey,
    region: &Region,
    pages: &[u64],
    what: &str,
) -> PyResult<Vec<u64>> {
    if let Some(t) = checksum_cuda::cuda_tensor(data, what)? {
        check_rows(data, region, what)?;
        return checksum_cuda::page_sums(&t, key, region.stride_bytes, pages, what);
    }
    with_data(data, what, |bytes| {
        check_rows(data, region, what)?;
        page_sums(key, region.stride_bytes, bytes, pages, what)
    })
}

/// Whether `data` is something [`layer_sums`] reads (a CUDA torch tensor, or a C-contiguous
/// buffer or CPU torch tensor, with rows [`check_rows`] accepts), without reading its bytes: a
/// guard whose checksum is off refuses the `data` the other modes would refuse.
pub fn check_data(data: &Bound<'_, PyAny>, region: &Region, what: &str) -> PyResult<()> {
    if checksum_cuda::cuda_tensor(data, what)?.is_some() {
        return check_rows(data, region, what);
    }
    with_data(data, what, |_| check_rows(data, region, what))
}

/// The checksum of one page payload of `buffer`, layer `layer` (a layer index `0..layers`;
/// the checksum is seeded with the model layer id) of `geometry` (`kvlayout.checksum/v1`): 64
/// bits, equal to the Rust core's and the CLI's. `payload`: exactly one page payload
/// (`page_size_tokens x bytes_per_token` bytes, no padding), any C-contiguous buffer, a CPU
/// torch tensor, or a CUDA torch tensor (checksummed on its device, on PyTorch's current stream).
///
/// Raises `InvalidGeometry` for an unknown buffer or a layer out of range, `ValueError` when
/// `payload` is not one page payload (naming both lengths).
#[pyfunction]
pub fn page_checksum(
    py: Python<'_>,
    geometry: PyRef<'_, Geometry>,
    buffer: &str,
    layer: &Bound<'_, PyAny>,
    payload: &Bound<'_, PyAny>,
) -> PyResult<u64> {
    let layer = layer_index(layer)?;
    let (_, key, _) = key_of(py, &geometry.inner, buffer, layer)?;
    if let Some(t) = checksum_cuda::cuda_tensor(payload, "payload")? {
        if t.len_bytes != key.payload_bytes {
            return Err(PyValueError::new_err(format!(
                "payload bytes: {} bytes given to a checksum of a {}-byte page payload",
                t.len_bytes, key.payload_bytes
            )));
        }
        return Ok(checksum_cuda::page_sums(&t, &key, key.payload_bytes, &[0], "payload")?[0]);
    }
    with_data(payload, "payload", |bytes| {
        key.checksum(bytes)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    })
}

/// The host-side table of a guard: per (buffer index, layer, host page) the checksum recorded
/// at backup.
#[derive(Default)]
pub struct Table {
    pub recorded: HashMap<(usize, u64, u64), u64>,
}

/// Parses a guard's `checksum` argument.
pub fn mode_arg(text: &str) -> PyResult<ChecksumMode> {
    ChecksumMode::parse(text).map_err(PyValueError::new_err)
}
