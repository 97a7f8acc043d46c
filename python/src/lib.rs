//! `kvlayout._kvlayout`: the Rust core of the Python package `kvlayout` (pyo3, abi3 for
//! CPython >= 3.10). The Python package (`python/kvlayout/`) re-exports everything here and adds
//! the pure-Python parts (`geometry_from_tensors`, the engine adapters).
//!
//! Errors are raised as the Python classes of `kvlayout.errors` (imported on first raise, so the
//! extension never imports torch, numpy or ml_dtypes): `InvalidGeometry` (bad input, the field
//! and the value), `Incompatible` (`.lines`: the CLI's diff lines), `TransferRefused` (the
//! shim's refusal), `ModelError` (a model config that cannot be mapped).

use pyo3::prelude::*;

mod checksum;
mod checksum_cuda;
mod errors;
mod geometry;
mod guard;
mod model;
mod pages;
mod plan;

/// The extension module.
#[pymodule]
fn _kvlayout(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<geometry::Geometry>()?;
    m.add_class::<guard::TransferGuard>()?;
    m.add_function(wrap_pyfunction!(checksum::page_checksum, m)?)?;
    m.add_class::<plan::Plan>()?;
    m.add_function(wrap_pyfunction!(plan::page_plan, m)?)?;
    m.add_function(wrap_pyfunction!(plan::token_plan, m)?)?;
    m.add_function(wrap_pyfunction!(geometry::compare, m)?)?;
    m.add_function(wrap_pyfunction!(geometry::check, m)?)?;
    m.add_function(wrap_pyfunction!(model::describe, m)?)?;
    m.add_function(wrap_pyfunction!(model::totals, m)?)?;
    m.add_function(wrap_pyfunction!(geometry::formats, m)?)?;
    m.add("SCHEMA", kvlayout_core::file::SCHEMA)?;
    m.add("CHECKS_COMPILED", kvlayout_pool::shim::CHECKS_COMPILED)?;
    Ok(())
}
