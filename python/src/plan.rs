//! `page_plan`, `token_plan` and `Plan`: the core's transfer plans between two pools
//! (`kvlayout_core::plan`), and `Geometry.regions()`'s rows.

use kvlayout_core::plan::{self, PlanError};
use kvlayout_core::{GeometryError, PoolGeometry};
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict, PyList};

use crate::errors;
use crate::geometry::{Geometry, geometry_err};
use crate::pages::with_pages;

/// A transfer plan between two pools: per buffer, byte runs `(src_offset_bytes,
/// dst_offset_bytes, length_bytes)` inside the two sides' regions of that buffer (see
/// `Geometry.regions()`), merged into maximal runs.
#[pyclass(frozen, module = "kvlayout._kvlayout")]
pub struct Plan {
    inner: plan::Plan,
    src_regions: Vec<String>,
    dst_regions: Vec<String>,
}

#[pymethods]
impl Plan {
    /// `"pool"` (whole pages) or `"token"` (token runs with head slices).
    #[getter]
    fn level(&self) -> &'static str {
        self.inner.level.name()
    }

    /// `{buffer: [(src_offset_bytes, dst_offset_bytes, length_bytes), ...]}`, in the
    /// destination's buffer order.
    #[getter]
    fn runs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for b in &self.inner.buffers {
            let runs: Vec<(u64, u64, u64)> = b
                .runs
                .iter()
                .map(|r| (r.src_offset_bytes, r.dst_offset_bytes, r.len_bytes))
                .collect();
            d.set_item(&b.buffer, PyList::new(py, runs)?)?;
        }
        Ok(d)
    }

    /// `{buffer: (source region name, destination region name)}`: the regions
    /// (`Geometry.regions()`) each buffer's offsets are in.
    #[getter]
    fn regions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for b in &self.inner.buffers {
            let pair = (
                &self.src_regions[b.src_region],
                &self.dst_regions[b.dst_region],
            );
            d.set_item(&b.buffer, pair)?;
        }
        Ok(d)
    }

    /// `{buffer: (lo, hi)}`: the global heads moved, for buffers split by heads on both sides
    /// (`lo == hi` when this source rank holds none of the destination's heads).
    #[getter]
    fn head_ranges<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for b in &self.inner.buffers {
            if let Some(h) = &b.heads {
                d.set_item(&b.buffer, (h.start, h.end))?;
            }
        }
        Ok(d)
    }

    /// Bytes moved over every buffer.
    #[getter]
    fn bytes_total(&self) -> u64 {
        self.inner.bytes_total()
    }

    /// Runs over every buffer.
    #[getter]
    fn run_count(&self) -> usize {
        self.inner.run_count()
    }

    fn __repr__(&self) -> String {
        format!(
            "Plan(level={}, buffers={}, runs={}, bytes_total={})",
            self.inner.level,
            self.inner.buffers.len(),
            self.inner.run_count(),
            self.inner.bytes_total()
        )
    }
}

/// A page list as `u64`s; a negative page is refused naming its position.
fn pages(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u64>> {
    with_pages(obj, what, |list| {
        let mut out = Vec::with_capacity(list.len());
        for i in 0..list.len() {
            let p = list.get(i)?;
            let p = u64::try_from(p).map_err(|_| {
                errors::transfer_refused(
                    obj.py(),
                    format!("{what}[{i}]: page {p} is negative"),
                    "negative_page",
                )
            })?;
            out.push(p);
        }
        Ok(out)
    })
}

/// `PlanError` -> `InvalidGeometry` (a pool breaks a rule), `Incompatible` (the diff lines at
/// the plan's level) or `TransferRefused(reason, kind)` (`kind`: `page_out_of_range`,
/// `duplicate_destination`, `length`, `heads`, `state`, `overflow`).
fn plan_err(py: Python<'_>, src: &PoolGeometry, dst: &PoolGeometry, e: PlanError) -> PyErr {
    match e {
        PlanError::Geometry { side, error } => {
            errors::invalid_geometry(py, &format!("{side} pool: {}", error.field), &error.problem)
        }
        PlanError::Incompatible { level, lines } => {
            let head = crate::geometry::header(lines.len(), src, dst, level);
            errors::incompatible(py, lines, head)
        }
        other => errors::transfer_refused(py, other.to_string(), other.kind()),
    }
}

fn region_names(py: Python<'_>, g: &PoolGeometry) -> PyResult<Vec<String>> {
    let regions = g
        .regions()
        .map_err(|e: GeometryError| geometry_err(py, &e))?;
    Ok(regions.into_iter().map(|r| r.name).collect())
}

type Planner = fn(&PoolGeometry, &PoolGeometry, &[u64], &[u64]) -> Result<plan::Plan, PlanError>;

fn run_planner(
    py: Python<'_>,
    planner: Planner,
    src: &Geometry,
    dst: &Geometry,
    src_pages: &Bound<'_, PyAny>,
    dst_pages: &Bound<'_, PyAny>,
) -> PyResult<Plan> {
    let (sp, dp) = (
        pages(src_pages, "src_pages")?,
        pages(dst_pages, "dst_pages")?,
    );
    let (s, d) = (&src.inner, &dst.inner);
    let inner = py
        .detach(|| planner(s, d, &sp, &dp))
        .map_err(|e| plan_err(py, s, d, e))?;
    Ok(Plan {
        inner,
        src_regions: region_names(py, s)?,
        dst_regions: region_names(py, d)?,
    })
}

/// Whole pages: page `src_pages[i]` of `src` -> `dst_pages[i]` of `dst` in every layer of
/// every buffer, for pools compatible at the `pool` level (any memory layouts). Page lists: a
/// list or tuple of ints, an int64 array or a `__dlpack__` tensor. Raises `Incompatible` (the
/// `pool`-level diff lines), `TransferRefused` (`kind`: `page_out_of_range`,
/// `duplicate_destination`, `length` for lists of different lengths, `negative_page`, `state`).
#[pyfunction]
pub fn page_plan(
    py: Python<'_>,
    src: &Geometry,
    dst: &Geometry,
    src_pages: &Bound<'_, PyAny>,
    dst_pages: &Bound<'_, PyAny>,
) -> PyResult<Plan> {
    run_planner(py, plan::page_plan, src, dst, src_pages, dst_pages)
}

/// Token runs with head slices, for pools compatible at the `token` level (page sizes,
/// tensor-parallel head splits and memory layouts may differ, except that `section_major` and
/// `planes` pages cannot be cut or glued: those buffers need equal page sizes): the source
/// pages are one stream of rows (tokens, or one row per `compress_ratio` tokens) cut into the
/// destination's pages; per row, layer and section the run holds the heads both ranks have
/// (one head per rank when heads are replicated over ranks), and for a section with
/// `split_groups` the slice of each group both ranks hold, group by group. A pool of `state`
/// buffers alone is planned slot by slot (its pages are request slots). Raises as `page_plan`
/// (at the `token` level), and `TransferRefused` with `kind` `length` when the two lists hold
/// different token counts, `heads` when a section's bytes per head differ.
#[pyfunction]
pub fn token_plan(
    py: Python<'_>,
    src: &Geometry,
    dst: &Geometry,
    src_pages: &Bound<'_, PyAny>,
    dst_pages: &Bound<'_, PyAny>,
) -> PyResult<Plan> {
    run_planner(py, plan::token_plan, src, dst, src_pages, dst_pages)
}

/// `Geometry.regions()`: one dict per region (`name`, `pool_offset_bytes`, `len_bytes`,
/// `buffers`: one dict per buffer with its placement, its `page_size_tokens`,
/// `compress_ratio` and `rows_per_page`).
pub fn regions<'py>(py: Python<'py>, g: &PoolGeometry) -> PyResult<Bound<'py, PyList>> {
    let err = |e: GeometryError| geometry_err(py, &e);
    let out = PyList::empty(py);
    for region in g.regions().map_err(err)? {
        let buffers = PyList::empty(py);
        for &b in &region.buffers {
            let p = g.placement(b).map_err(err)?;
            let buf = &g.buffers[b];
            let d = PyDict::new(py);
            d.set_item("name", buf.name())?;
            d.set_item("layers", p.layers)?;
            d.set_item("pages", p.pages)?;
            d.set_item(
                "page_size_tokens",
                g.buffer_page_size_tokens(b).map_err(err)?,
            )?;
            d.set_item("compress_ratio", buf.compress_ratio)?;
            d.set_item("rows_per_page", g.buffer_page_rows(b).map_err(err)?)?;
            d.set_item("offset_bytes", p.offset_bytes)?;
            d.set_item("page_step_bytes", p.page_step_bytes)?;
            d.set_item("layer_step_bytes", p.layer_step_bytes)?;
            d.set_item("head_step_bytes", p.head_step_bytes)?;
            d.set_item("heads", p.heads)?;
            d.set_item("run_bytes", p.run_bytes)?;
            d.set_item("runs", p.runs)?;
            d.set_item("run_step_bytes", p.run_step_bytes)?;
            let sections: Vec<u64> = (0..buf.layout.sections().len())
                .map(|i| buf.layout.section_bytes(i))
                .collect::<Result<_, _>>()
                .map_err(|e| err(kvlayout_core::layout_error(b, buf, e)))?;
            d.set_item("section_bytes_per_token", sections)?;
            buffers.append(d)?;
        }
        let d = PyDict::new(py);
        d.set_item("name", &region.name)?;
        d.set_item("pool_offset_bytes", region.pool_offset_bytes)?;
        d.set_item("len_bytes", region.len_bytes)?;
        d.set_item("buffers", buffers)?;
        out.append(d)?;
    }
    Ok(out)
}
