//! Raising the exception classes of `kvlayout.errors` (pure Python, so they carry attributes
//! such as `Incompatible.lines` and docstrings, and `except kvlayout.Incompatible` works).
//! The classes are looked up on first raise, once each.

use pyo3::call::PyCallArgs;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

static INVALID_GEOMETRY: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static INCOMPATIBLE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static TRANSFER_REFUSED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
static MODEL_ERROR: PyOnceLock<Py<PyType>> = PyOnceLock::new();

/// Builds `kvlayout.errors.<name>(*args)` as a `PyErr` (or the error of building it).
fn raise<'py>(
    py: Python<'py>,
    cell: &'static PyOnceLock<Py<PyType>>,
    name: &str,
    args: impl PyCallArgs<'py>,
) -> PyErr {
    let class = cell.get_or_try_init(py, || {
        let module = py.import("kvlayout.errors")?;
        Ok::<_, PyErr>(module.getattr(name)?.cast_into::<PyType>()?.unbind())
    });
    match class.and_then(|c| c.bind(py).call1(args)) {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

/// `InvalidGeometry(field, problem)`: the field path and what is wrong, with the value.
pub fn invalid_geometry(py: Python<'_>, field: &str, problem: &str) -> PyErr {
    raise(py, &INVALID_GEOMETRY, "InvalidGeometry", (field, problem))
}

/// `Incompatible(lines, header)`: one line per differing field, as `kvlayout check` prints.
pub fn incompatible(py: Python<'_>, lines: Vec<String>, header: String) -> PyErr {
    raise(py, &INCOMPATIBLE, "Incompatible", (lines, header))
}

/// `TransferRefused(reason, kind)`: the shim's refusal (`kind`: `page_out_of_range`,
/// `duplicate_destination`, `layer`, `too_many_pairs`, `length`, `negative_page`); nothing may
/// move.
pub fn transfer_refused(py: Python<'_>, reason: String, kind: &str) -> PyErr {
    raise(py, &TRANSFER_REFUSED, "TransferRefused", (reason, kind))
}

/// `ModelError(message)`: a model config that cannot be read or mapped.
pub fn model_error(py: Python<'_>, message: String) -> PyErr {
    raise(py, &MODEL_ERROR, "ModelError", (message,))
}
