//! Reading a page-index list from Python without copying it: a `list` or `tuple` of ints, any
//! object with the buffer protocol (numpy `int64` arrays, `memoryview`, `array.array('q')`),
//! or any object with `__dlpack__` (torch CPU tensors, numpy, JAX, CuPy pinned host memory).
//! Arrays are read in place, element by element, through their strides; nothing is converted
//! to a Python list or a new array.
//!
//! The buffer protocol is called through CPython's own `PyObject_GetBuffer` (stable since
//! Python 3.0, in the limited API from 3.11; the `Py_buffer` layout is the same in 3.10), so
//! the abi3-py310 wheel reads buffers on 3.10 too. DLPack (`dlpack.h`, v0.8+ unversioned
//! capsule `"dltensor"`): the tensor is read while the capsule is alive and the capsule is
//! released unconsumed, so its producer's destructor frees it.
//!
//! Trust: the check trusts the exporter's pointer, shape and strides, as every buffer-protocol
//! and DLPack consumer does; an exporter that lies about them makes this read out of bounds.
//! What is cheap is refused: a negative length, and a length x stride span past `isize`.

use std::ffi::{CStr, c_char, c_int, c_void};

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// `Py_buffer` (Include/pybuffer.h).
#[repr(C)]
struct PyBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

/// `PyBUF_RECORDS_RO`: strides and format, read only.
const PYBUF_RECORDS_RO: c_int = 0x0010 | 0x0008 | 0x0004;

unsafe extern "C" {
    fn PyObject_CheckBuffer(obj: *mut ffi::PyObject) -> c_int;
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut PyBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut PyBuffer);
}

/// DLPack `DLDevice`.
#[repr(C)]
struct DlDevice {
    device_type: i32,
    device_id: i32,
}

/// DLPack `DLDataType`.
#[repr(C)]
struct DlDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

/// DLPack `DLTensor`.
#[repr(C)]
struct DlTensor {
    data: *mut c_void,
    device: DlDevice,
    ndim: i32,
    dtype: DlDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

/// DLPack `DLManagedTensor` (only `dl_tensor` is read).
#[repr(C)]
struct DlManagedTensor {
    dl_tensor: DlTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DlManagedTensor)>,
}

/// `kDLCPU`, `kDLCUDAHost` (pinned host memory), `kDLROCMHost`, `kDLCUDAManaged`: readable
/// by the CPU.
const DL_HOST_READABLE: [i32; 4] = [1, 3, 11, 13];
/// `kDLInt`.
const DL_INT: u8 = 0;

/// One page-index list, borrowed: reading element `i` needs no allocation.
pub enum PageList<'a> {
    /// A list: each element converted when read.
    List(&'a Bound<'a, PyList>, &'a str),
    /// A tuple: each element converted when read.
    Tuple(&'a Bound<'a, PyTuple>, &'a str),
    /// Strided int64 memory, alive for `'a`.
    Raw {
        ptr: *const u8,
        len: usize,
        stride_bytes: isize,
    },
}

/// A strided run of int64 in memory.
#[derive(Clone, Copy)]
pub struct Raw {
    ptr: *const u8,
    stride_bytes: isize,
}

impl Raw {
    /// Element `i`.
    ///
    /// # Safety
    /// `i` must be below the list's length.
    #[inline(always)]
    pub unsafe fn read(self, i: usize) -> i64 {
        // SAFETY: the exporter guarantees `len` elements at `ptr + k * stride_bytes`; unaligned
        // reads are allowed.
        unsafe { (self.ptr.offset(i as isize * self.stride_bytes) as *const i64).read_unaligned() }
    }
}

impl PageList<'_> {
    /// The in-memory run, when the list is an array.
    #[inline]
    pub fn raw(&self) -> Option<Raw> {
        match self {
            PageList::Raw {
                ptr, stride_bytes, ..
            } => Some(Raw {
                ptr: *ptr,
                stride_bytes: *stride_bytes,
            }),
            PageList::List(..) | PageList::Tuple(..) => None,
        }
    }

    /// Number of indices.
    pub fn len(&self) -> usize {
        match self {
            PageList::List(l, _) => l.len(),
            PageList::Tuple(t, _) => t.len(),
            PageList::Raw { len, .. } => *len,
        }
    }

    /// Element `i` (`i < len()`).
    #[inline]
    pub fn get(&self, i: usize) -> PyResult<i64> {
        match self {
            PageList::List(l, what) => {
                // SAFETY: the list is alive (borrowed for 'a) and the GIL held; an index past a
                // list shortened meanwhile returns NULL with IndexError set.
                let item = unsafe { ffi::PyList_GetItem(l.as_ptr(), i as ffi::Py_ssize_t) };
                int_at(l.py(), item, what, i)
            }
            PageList::Tuple(t, what) => {
                // SAFETY: as for lists; PyTuple_GetItem borrows too.
                let item = unsafe { ffi::PyTuple_GetItem(t.as_ptr(), i as ffi::Py_ssize_t) };
                int_at(t.py(), item, what, i)
            }
            PageList::Raw {
                ptr, stride_bytes, ..
            } => {
                // SAFETY: `i < len`, and the exporter guarantees `len` elements at
                // `ptr + k * stride_bytes`; unaligned reads are allowed.
                let p = unsafe { ptr.offset(i as isize * *stride_bytes) } as *const i64;
                // SAFETY: `p` is element `i` of the exported int64 array (above), readable
                // while the view is held; `read_unaligned` needs no alignment.
                Ok(unsafe { p.read_unaligned() })
            }
        }
    }
}

/// An int64 from a borrowed list/tuple item (NULL: the error already set, e.g. a list that
/// an item's `__index__` shortened).
#[inline]
fn int_at(py: Python<'_>, item: *mut ffi::PyObject, what: &str, i: usize) -> PyResult<i64> {
    if item.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: `item` is a live object borrowed from its container (non-null, above), the GIL
    // held; a type check runs no Python code.
    if unsafe { ffi::PyBool_Check(item) } != 0 {
        return Err(PyTypeError::new_err(format!(
            "{what}[{i}]: a bool, not a page index"
        )));
    }
    // SAFETY: a live object borrowed from its container, the GIL held. An exact int converts
    // without running Python code, so the borrow stays valid; anything else may run
    // `__index__`, which could drop the container's reference: hold our own for that call.
    let v = if unsafe { ffi::PyLong_CheckExact(item) } != 0 {
        // SAFETY: `item` is a live exact int (checked above); converting it runs no Python code.
        unsafe { ffi::PyLong_AsLongLong(item) }
    } else {
        // SAFETY: `item` is live (borrowed from its container, GIL held); this takes a strong
        // reference of our own before any `__index__` can run.
        let owned = unsafe { Bound::from_borrowed_ptr(py, item) };
        // SAFETY: `owned` holds the object alive for the call.
        unsafe { ffi::PyLong_AsLongLong(owned.as_ptr()) }
    };
    // SAFETY: the GIL is held; PyErr_Occurred only reads the thread's error indicator.
    if v == -1 && unsafe { !ffi::PyErr_Occurred().is_null() } {
        let e = PyErr::fetch(py);
        if e.is_instance_of::<PyOverflowError>(py) {
            // An int past the int64 range is a page no pool has: refused as out of range.
            return Err(crate::errors::transfer_refused(
                py,
                format!("{what}[{i}]: page past the int64 range, out of range"),
                "page_out_of_range",
            ));
        }
        return Err(PyTypeError::new_err(format!(
            "{what}[{i}]: not an int64 page index: {e}"
        )));
    }
    Ok(v)
}

/// Refuses a negative length or a span (`len` x `stride_bytes`) that no memory can hold.
fn checked_run(what: &str, len: i64, stride_bytes: i64) -> PyResult<usize> {
    let ok = len >= 0
        && len
            .checked_mul(stride_bytes.checked_abs().unwrap_or(i64::MAX))
            .is_some_and(|span| span <= isize::MAX as i64);
    if !ok {
        return Err(PyValueError::new_err(format!(
            "{what}: the exporter reports {len} elements {stride_bytes} bytes apart: not a readable array"
        )));
    }
    Ok(len as usize)
}

/// A held buffer view, released on drop.
struct BufferGuard(PyBuffer);

impl Drop for BufferGuard {
    fn drop(&mut self) {
        // SAFETY: obtained by a successful PyObject_GetBuffer, released once, GIL held.
        unsafe { PyBuffer_Release(&mut self.0) };
    }
}

/// `q`, or `l` where a C long is 8 bytes, with an optional native or native-endian prefix.
fn is_int64_format(format: &[u8]) -> bool {
    let native_order: &[u8] = if cfg!(target_endian = "little") {
        b"@=<"
    } else {
        b"@=>!"
    };
    let f = match format {
        [p, rest @ ..] if native_order.contains(p) => rest,
        f => f,
    };
    match f {
        b"q" => true,
        b"l" => std::mem::size_of::<std::ffi::c_long>() == 8,
        _ => false,
    }
}

/// Calls `f` with `obj` read as a page list; `what` names the argument in errors.
pub fn with_pages<R>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    f: impl FnOnce(&PageList<'_>) -> PyResult<R>,
) -> PyResult<R> {
    if let Ok(list) = obj.cast::<PyList>() {
        return f(&PageList::List(list, what));
    }
    if let Ok(tuple) = obj.cast::<PyTuple>() {
        return f(&PageList::Tuple(tuple, what));
    }
    // SAFETY: `obj` is a live object and the GIL is held.
    if unsafe { PyObject_CheckBuffer(obj.as_ptr()) } == 1 {
        return with_buffer(obj, what, f);
    }
    if obj.hasattr(pyo3::intern!(obj.py(), "__dlpack__"))? {
        return with_dlpack(obj, what, f);
    }
    Err(PyTypeError::new_err(format!(
        "{what}: expected a list or tuple of ints, an int64 array (buffer protocol) or a tensor with __dlpack__, got {}",
        obj.get_type().name()?
    )))
}

fn with_buffer<R>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    f: impl FnOnce(&PageList<'_>) -> PyResult<R>,
) -> PyResult<R> {
    let mut view = std::mem::MaybeUninit::<PyBuffer>::zeroed();
    // SAFETY: `view` is writable storage for one Py_buffer; the GIL is held.
    if unsafe { PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), PYBUF_RECORDS_RO) } != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    // SAFETY: initialised by the successful call above.
    let view = BufferGuard(unsafe { view.assume_init() });
    let v = &view.0;
    let format: &[u8] = if v.format.is_null() {
        b"B"
    } else {
        // SAFETY: a NUL-terminated format string owned by the view, alive while it is held.
        unsafe { CStr::from_ptr(v.format) }.to_bytes()
    };
    if v.itemsize != 8 || !is_int64_format(format) {
        return Err(PyTypeError::new_err(format!(
            "{what}: page indices must be int64, got buffer format {:?} ({} bytes per item)",
            String::from_utf8_lossy(format),
            v.itemsize
        )));
    }
    if v.ndim != 1 {
        return Err(PyTypeError::new_err(format!(
            "{what}: page indices must be one-dimensional, got {} dimensions",
            v.ndim
        )));
    }
    // SAFETY: ndim == 1, so shape (and strides, requested) hold one entry each.
    let len = unsafe { *v.shape };
    let stride_bytes = if v.strides.is_null() {
        8
    } else {
        // SAFETY: non-null, and ndim == 1: one stride entry, in bytes (PEP 3118).
        unsafe { *v.strides }
    };
    let len = checked_run(what, len as i64, stride_bytes as i64)?;
    f(&PageList::Raw {
        ptr: v.buf as *const u8,
        len,
        stride_bytes,
    })
}

fn with_dlpack<R>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    f: impl FnOnce(&PageList<'_>) -> PyResult<R>,
) -> PyResult<R> {
    let py = obj.py();
    if obj.hasattr(pyo3::intern!(py, "__dlpack_device__"))? {
        let (device_type, _id): (i32, i32) = obj
            .call_method0(pyo3::intern!(py, "__dlpack_device__"))?
            .extract()?;
        if !DL_HOST_READABLE.contains(&device_type) {
            return Err(PyTypeError::new_err(format!(
                "{what}: page indices are in device memory (DLPack device type {device_type}); the check reads them on the CPU: pass a CPU tensor (e.g. .cpu()) of the same indices"
            )));
        }
    }
    let capsule = obj.call_method0(pyo3::intern!(py, "__dlpack__"))?;
    // SAFETY: a capsule named "dltensor" holds a DLManagedTensor (DLPack spec); it stays alive
    // while `capsule` is held. A wrong name sets an error and returns NULL.
    let managed = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dltensor".as_ptr()) }
        as *const DlManagedTensor;
    if managed.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: checked non-null above.
    let t = unsafe { &(*managed).dl_tensor };
    if !DL_HOST_READABLE.contains(&t.device.device_type) {
        return Err(PyTypeError::new_err(format!(
            "{what}: page indices are in device memory (DLPack device type {})",
            t.device.device_type
        )));
    }
    if t.dtype.code != DL_INT || t.dtype.bits != 64 || t.dtype.lanes != 1 {
        return Err(PyTypeError::new_err(format!(
            "{what}: page indices must be int64, got DLPack dtype code {} bits {} lanes {}",
            t.dtype.code, t.dtype.bits, t.dtype.lanes
        )));
    }
    if t.ndim != 1 {
        return Err(PyTypeError::new_err(format!(
            "{what}: page indices must be one-dimensional, got {} dimensions",
            t.ndim
        )));
    }
    // SAFETY: ndim == 1: shape has one entry, strides (when present) one entry in elements.
    let len = unsafe { *t.shape };
    let stride_bytes = if t.strides.is_null() {
        8
    } else {
        // SAFETY: non-null, and ndim == 1: one stride entry, in elements (DLPack).
        (unsafe { *t.strides } as isize).saturating_mul(8)
    };
    let len = checked_run(what, len, stride_bytes as i64)?;
    // SAFETY: data + byte_offset is the first element.
    let ptr = unsafe { (t.data as *const u8).add(t.byte_offset as usize) };
    let r = f(&PageList::Raw {
        ptr,
        len,
        stride_bytes,
    });
    drop(capsule);
    r
}

/// `PyBUF_STRIDES`: shape and strides (no format), any layout.
const PYBUF_STRIDES: c_int = 0x0010 | 0x0008;

/// The shape and item size of `obj`'s buffer (`Py_buffer.shape`, `.itemsize`), or `None` when
/// `obj` has no buffer protocol or its exporter refuses a shaped view (the exporter's error is
/// dropped: [`with_bytes`] reports the object's problem naming the caller's argument).
pub fn buffer_shape(obj: &Bound<'_, PyAny>) -> Option<(Vec<u64>, u64)> {
    // SAFETY: `obj` is a live object and the GIL is held.
    if unsafe { PyObject_CheckBuffer(obj.as_ptr()) } != 1 {
        return None;
    }
    let mut view = std::mem::MaybeUninit::<PyBuffer>::zeroed();
    // SAFETY: `view` is writable storage for one Py_buffer; the GIL is held.
    if unsafe { PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), PYBUF_STRIDES) } != 0 {
        drop(PyErr::fetch(obj.py()));
        return None;
    }
    // SAFETY: initialised by the successful call above.
    let view = BufferGuard(unsafe { view.assume_init() });
    let ndim = usize::try_from(view.0.ndim).ok()?;
    let itemsize = u64::try_from(view.0.itemsize).ok()?;
    if ndim == 0 || view.0.shape.is_null() {
        return Some((Vec::new(), itemsize));
    }
    // SAFETY: a PyBUF_STRIDES view has `ndim` shape entries at `shape`, alive with the view.
    let shape = unsafe { std::slice::from_raw_parts(view.0.shape, ndim) };
    let shape = shape
        .iter()
        .map(|&d| u64::try_from(d).ok())
        .collect::<Option<Vec<u64>>>()?;
    Some((shape, itemsize))
}

/// `PyBUF_SIMPLE`: one C-contiguous run of bytes, read only.
const PYBUF_SIMPLE: c_int = 0;

/// Calls `f` with the bytes of `obj`, a C-contiguous buffer-protocol object (a numpy array of
/// any dtype, `bytes`, `bytearray`, `memoryview`), read in place; `what` names the argument.
/// An object whose exporter refuses a C-contiguous view (a transposed or strided numpy array)
/// raises the exporter's exception type (numpy: `ValueError`) naming `what`, what was expected
/// and the exporter's reason, with the exporter's exception as its cause.
pub fn with_bytes<R>(
    obj: &Bound<'_, PyAny>,
    what: &str,
    f: impl FnOnce(&[u8]) -> PyResult<R>,
) -> PyResult<R> {
    // SAFETY: `obj` is a live object and the GIL is held.
    if unsafe { PyObject_CheckBuffer(obj.as_ptr()) } != 1 {
        return Err(PyTypeError::new_err(format!(
            "{what}: expected a C-contiguous buffer (numpy array, bytes, bytearray, memoryview; a \
             CPU torch tensor through kvlayout's wrapper), got {}",
            obj.get_type().name()?
        )));
    }
    let mut view = std::mem::MaybeUninit::<PyBuffer>::zeroed();
    // SAFETY: `view` is writable storage for one Py_buffer; the GIL is held.
    if unsafe { PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), PYBUF_SIMPLE) } != 0 {
        let py = obj.py();
        let cause = PyErr::fetch(py);
        let named = PyErr::from_type(
            cause.get_type(py),
            format!(
                "{what}: expected a C-contiguous buffer; the {} given cannot be read as one: {}",
                obj.get_type().name()?,
                cause.value(py)
            ),
        );
        named.set_cause(py, Some(cause));
        return Err(named);
    }
    // SAFETY: initialised by the successful call above.
    let view = BufferGuard(unsafe { view.assume_init() });
    let len = usize::try_from(view.0.len)
        .map_err(|_| PyValueError::new_err(format!("{what}: negative buffer length")))?;
    if len == 0 {
        return f(&[]);
    }
    // SAFETY: a PyBUF_SIMPLE view is `len` contiguous readable bytes at `buf`, alive while the
    // view is held (until `view` drops, after `f` returns).
    let bytes = unsafe { std::slice::from_raw_parts(view.0.buf as *const u8, len) };
    f(bytes)
}
