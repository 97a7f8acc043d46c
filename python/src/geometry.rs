//! `Geometry` (a pool geometry, schema `kvlayout.geometry/v1`), `compare`, `check`,
//! `describe` and `formats`: the CLI's `check`, `describe --json` and `formats --json` as
//! Python calls, with the same lines and fingerprints.

use std::borrow::Cow;
use std::path::PathBuf;

use kvlayout_core::{
    BufferGeometry, GeometryError, Level, MemoryLayout, PoolGeometry, TokenLayout,
    arrangement_text, compare_at, file, formats as builtin,
};
use pyo3::prelude::*;
use pyo3::types::{PyAny, PyDict, PyString};
use serde_json::{Value, json};

use crate::errors;

/// A pool geometry: page size, page count, memory layout and buffers (each with its layer count
/// and token layout), validated. Immutable; equal to another when every field is equal.
///
/// Build it with `Geometry.from_json(text)`, `Geometry.from_file(path)`,
/// `kvlayout.describe(model)` or `kvlayout.geometry_from_tensors(...)`.
#[pyclass(frozen, module = "kvlayout._kvlayout", eq)]
#[derive(PartialEq)]
pub struct Geometry {
    pub(crate) inner: PoolGeometry,
    pub(crate) fingerprint: u64,
}

/// `GeometryError` -> `InvalidGeometry(field, problem)`.
pub fn geometry_err(py: Python<'_>, e: &GeometryError) -> PyErr {
    errors::invalid_geometry(py, &e.field, &e.problem)
}

impl Geometry {
    /// Validates `inner` and computes its fingerprint.
    pub fn new(py: Python<'_>, inner: PoolGeometry) -> PyResult<Geometry> {
        inner.validate().map_err(|e| geometry_err(py, &e))?;
        let fingerprint = inner
            .fingerprint()
            .map_err(|e| errors::invalid_geometry(py, "fingerprint", &e.to_string()))?;
        Ok(Geometry { inner, fingerprint })
    }
}

/// A JSON value as the Python object `json.loads` makes of it.
pub(crate) fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (v.to_string(),))
}

/// The file form (`arrangement`, `sections`, alignment) of one token layout.
fn layout_json(layout: &TokenLayout) -> Value {
    let pool = PoolGeometry {
        name: String::new(),
        page_size_tokens: 1,
        pages: 1,
        memory_layout: MemoryLayout::LayerFirst,
        buffers: vec![BufferGeometry::new(Cow::Borrowed("b"), 1, layout.clone())],
    };
    let mut v: Value = serde_json::from_str(&file::to_json(&pool)).expect("own JSON parses");
    let mut b = v["buffers"][0].take();
    if let Value::Object(m) = &mut b {
        m.remove("name");
        m.remove("layers");
    }
    b
}

fn geometry_result<T>(py: Python<'_>, r: Result<T, GeometryError>) -> PyResult<T> {
    r.map_err(|e| geometry_err(py, &e))
}

#[pymethods]
impl Geometry {
    /// Reads and validates a geometry file's text (`kvlayout.geometry/v1`, `/v2` or `/v3`; one
    /// leading UTF-8 BOM is skipped). Raises `InvalidGeometry` naming the field and the bad
    /// value (unknown schema, dtype or arrangement, zero dimension, block that does not divide,
    /// odd fp4 count, overflow, JSON syntax with line and column, text that is not valid
    /// Unicode such as a lone surrogate); `TypeError` when `text` is not a `str`.
    #[staticmethod]
    fn from_json(py: Python<'_>, text: &Bound<'_, PyString>) -> PyResult<Geometry> {
        // A lone surrogate has no UTF-8 form: the geometry is invalid, not the call.
        let text = text.to_str().map_err(|e| {
            errors::invalid_geometry(py, "text", &format!("not valid Unicode: {e}"))
        })?;
        let inner = geometry_result(py, file::from_json(text))?;
        Geometry::new(py, inner)
    }

    /// Reads a geometry file (at most 16 MiB) from `path` (str or os.PathLike).
    #[staticmethod]
    fn from_file(py: Python<'_>, path: PathBuf) -> PyResult<Geometry> {
        let inner = file::read_path(&path).map_err(|e| {
            errors::invalid_geometry(py, &format!("{}: {}", path.display(), e.field), &e.problem)
        })?;
        Geometry::new(py, inner)
    }

    /// The geometry file (pretty JSON, trailing newline), as `kvlayout describe --json` writes it.
    fn to_json(&self) -> String {
        file::to_json(&self.inner)
    }

    /// The pool fingerprint (64-bit int): FNV-1a over exactly the compared fields; equal to
    /// the one `kvlayout check` / `kvlayout describe` print (there as hex).
    #[getter]
    fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// The `storage` fingerprint (64-bit int): the pool fingerprint and the memory layout; two
    /// stored page objects are interchangeable only when these agree.
    #[getter]
    fn storage_fingerprint(&self, py: Python<'_>) -> PyResult<u64> {
        self.inner
            .storage_fingerprint()
            .map_err(|e| errors::invalid_geometry(py, "storage_fingerprint", &e.to_string()))
    }

    /// The `token`-level fingerprint of each buffer, `{buffer name: int}`: what a transfer
    /// engine converting between two different pools needs to agree on (attention kind,
    /// dtypes, per-head shapes, scale relations, orders, arrangement).
    /// In buffer order.
    #[getter]
    fn token_fingerprints<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (n, f) in self.inner.token_fingerprints() {
            d.set_item(n, f)?;
        }
        Ok(d)
    }

    /// Free text, never compared.
    #[getter]
    fn name(&self) -> &str {
        &self.inner.name
    }

    /// Tokens per page.
    #[getter]
    fn page_size_tokens(&self) -> u64 {
        self.inner.page_size_tokens
    }

    /// Pages in the pool (capacity; not compared).
    #[getter]
    fn pages(&self) -> u64 {
        self.inner.pages
    }

    /// `layer_first`, `page_first`, `page_first_direct`, `page_head`, `page_head_token`,
    /// `layer_head` or `page_unified` (not compared at the pool level; `page_unified`'s parameter is
    /// [`Geometry::heads_per_group`]).
    #[getter]
    fn memory_layout(&self) -> &'static str {
        self.inner.memory_layout.name()
    }

    /// Heads per group of a `page_unified` pool (SGLang's `head_num // head_group_num`), else
    /// `None`.
    #[getter]
    fn heads_per_group(&self) -> Option<u64> {
        match self.inner.memory_layout {
            MemoryLayout::PageUnified { heads_per_group } => Some(heads_per_group),
            _ => None,
        }
    }

    /// One dict per buffer: the geometry file's buffer object (`name`, `layers`, `arrangement`,
    /// `sections` with `name`, `dtype`, `shape` per token, `scales`, `block_elems`, the v2
    /// fields where present: `page_size_tokens`, `attention`, `layer_ids`, `shard`, section
    /// `order`, and the v3 ones: `compress_ratio` (absent = 1), section `split_groups`), plus
    /// `arrangement_text` (as diff lines print it), `bytes_per_token` (one row of one layer: a
    /// token's entry, or one row of `compress_ratio` tokens), `rows_per_page` (tokens per page /
    /// `compress_ratio`), `bytes_per_page` (payload of one page of one layer: rows x row
    /// bytes), `page_stride_bytes`, `heads_held` (`[lo, hi)`, the model heads this rank holds,
    /// for a heads split: one head `rank / (tp_size / heads_total)` when heads are replicated
    /// over ranks), `layout_fingerprint` (the token layout's own fingerprint, as `kvlayout
    /// formats`).
    #[getter]
    fn buffers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let g = &self.inner;
        let file: Value = serde_json::from_str(&file::to_json(g)).expect("own JSON parses");
        let mut out = Vec::with_capacity(g.buffers.len());
        for (i, (b, mut v)) in g
            .buffers
            .iter()
            .zip(file["buffers"].as_array().cloned().unwrap_or_default())
            .enumerate()
        {
            let pg = geometry_result(py, g.page_geometry(i))?;
            v["arrangement_text"] = json!(arrangement_text(&b.layout));
            v["bytes_per_token"] = json!(pg.bytes_per_token);
            v["rows_per_page"] = json!(pg.rows_per_page);
            if let Some((lo, hi)) = b.shard.and_then(|s| s.heads_held()) {
                v["heads_held"] = json!([lo, hi]);
            }
            v["bytes_per_page"] = json!(pg.page_payload_bytes);
            v["page_stride_bytes"] = json!(pg.page_stride_bytes);
            v["layout_fingerprint"] = json!(b.layout.fingerprint());
            out.push(v);
        }
        to_py(py, &Value::Array(out))
    }

    /// Bytes per token over every buffer and layer (sum of bytes per token x layers). Raises
    /// `InvalidGeometry` naming `compress_ratio` when a buffer stores one row per several
    /// tokens (no whole bytes per token; `describe(..., totals)` gives its share).
    #[getter]
    fn bytes_per_token(&self, py: Python<'_>) -> PyResult<u64> {
        geometry_result(py, self.inner.bytes_per_token_all_layers())
    }

    /// Bytes of one page over every buffer and layer, at each buffer's page stride.
    #[getter]
    fn bytes_per_page(&self, py: Python<'_>) -> PyResult<u64> {
        let g = &self.inner;
        let mut total = 0u64;
        for (i, b) in g.buffers.iter().enumerate() {
            let pg = geometry_result(py, g.page_geometry(i))?;
            total = pg
                .page_stride_bytes
                .checked_mul(b.layers)
                .and_then(|x| x.checked_add(total))
                .ok_or_else(|| {
                    errors::invalid_geometry(py, "bytes_per_page", "overflow past 64 bits")
                })?;
        }
        Ok(total)
    }

    /// Bytes of the whole pool in its memory layout (every buffer, layer and page).
    #[getter]
    fn total_bytes(&self, py: Python<'_>) -> PyResult<u64> {
        geometry_result(py, self.inner.total_bytes())
    }

    /// The contiguous regions the pool occupies, in buffer order: one per buffer (named after
    /// it), or one named `pool` for the whole pool under `page_first_direct` and `page_unified`. Each is a dict:
    /// `name`, `pool_offset_bytes` (where it starts when the regions lie one after another),
    /// `len_bytes`, and `buffers`, one dict per buffer it holds: `name`, `layers`, `pages`,
    /// `page_size_tokens`, and its placement: head `h` of page `p` of layer `l` starts at
    /// `offset_bytes + p * page_step_bytes + l * layer_step_bytes + h * head_step_bytes` and
    /// is `run_bytes` long (`heads` is 1 except under `page_head`, `page_head_token` and
    /// `layer_head`, where it counts heads, and `page_unified`, where it counts head groups;
    /// under `page_head_token` a piece is `runs` runs, `run_step_bytes` apart); plus
    /// `section_bytes_per_token` (one entry per section).
    fn regions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyList>> {
        crate::plan::regions(py, &self.inner)
    }

    /// The geometry of a pool that mirrors this one (a HiCache host pool made from the device
    /// pool, as `HostPool::mirror_of` does in Rust): every compared field taken from `self`,
    /// only `pages`, `memory_layout` (default: the same) and `name` differ. Raises
    /// `InvalidGeometry` when the result breaks a rule (zero pages, `page_head` over a buffer
    /// without a head axis, overflow), for `memory_layout="page_unified"` without
    /// `heads_per_group` (or one that does not divide the heads), and for `heads_per_group`
    /// with any other layout.
    #[pyo3(signature = (pages, memory_layout = None, name = None, heads_per_group = None))]
    fn mirror(
        &self,
        py: Python<'_>,
        pages: &Bound<'_, PyAny>,
        memory_layout: Option<&str>,
        name: Option<String>,
        heads_per_group: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Geometry> {
        let mut g = self.inner.clone();
        g.pages = crate::model::count_arg(py, "pages", pages)?;
        let per_group = heads_per_group
            .map(|h| crate::model::count_arg(py, "heads_per_group", h))
            .transpose()?;
        match (memory_layout, per_group) {
            (Some("page_unified"), Some(heads_per_group)) => {
                g.memory_layout = MemoryLayout::PageUnified { heads_per_group };
            }
            (Some("page_unified"), None) => {
                return Err(errors::invalid_geometry(
                    py,
                    "heads_per_group",
                    "missing: memory_layout \"page_unified\" needs heads_per_group (SGLang: \
                     head_num // head_group_num)",
                ));
            }
            (m, Some(h)) => {
                return Err(errors::invalid_geometry(
                    py,
                    "heads_per_group",
                    &format!(
                        "{h} given with memory_layout {:?}: only page_unified takes it",
                        m.unwrap_or(self.inner.memory_layout.name())
                    ),
                ));
            }
            (Some(m), None) => {
                g.memory_layout = MemoryLayout::from_name(m).ok_or_else(|| {
                    errors::invalid_geometry(
                        py,
                        "memory_layout",
                        &format!(
                            "unknown memory layout {m:?} (expected layer_first, page_first, \
                             page_first_direct, page_head, page_head_token, layer_head or \
                             page_unified)"
                        ),
                    )
                })?;
            }
            (None, None) => {}
        }
        g.name = name.unwrap_or_else(|| format!("mirror of {}", self.inner.name));
        Geometry::new(py, g)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let from_json = slf.get_type().getattr("from_json")?;
        Ok((from_json, (slf.get().to_json(),)))
    }

    fn __repr__(&self) -> String {
        let names: Vec<&str> = self.inner.buffers.iter().map(|b| b.name()).collect();
        format!(
            "Geometry(name={:?}, page_size_tokens={}, pages={}, memory_layout={}, buffers=[{}], fingerprint={:#018x})",
            self.inner.name,
            self.inner.page_size_tokens,
            self.inner.pages,
            self.inner.memory_layout.name(),
            names.join(", "),
            self.fingerprint
        )
    }

    fn __hash__(&self) -> u64 {
        self.fingerprint
    }
}

fn parse_level(level: &str) -> PyResult<Level> {
    level.parse::<Level>().map_err(|e| {
        Python::attach(|py| errors::invalid_geometry(py, "level", &format!("{level:?}: {e}")))
    })
}

/// The diff lines of `compare_at`, as `kvlayout check --level` prints them.
fn diff_lines(a: &PoolGeometry, b: &PoolGeometry, level: Level) -> Vec<String> {
    match compare_at(a, b, level) {
        Ok(()) => Vec::new(),
        Err(m) => m.diffs.iter().map(ToString::to_string).collect(),
    }
}

/// The diff lines of `kvlayout check --level LEVEL A B` (one per differing field,
/// `field: A value, B value`); `[]` when the two pools are compatible at that level.
/// `level`: `"pool"` (whole pages move between the pools; default), `"storage"` (`pool` plus
/// `memory_layout`: stored page objects interchangeable) or `"token"` (tokens convertible per
/// head: prefill/decode at different TP sizes; page size ignored, except that `section_major`
/// and `planes` pages cannot be cut or glued, so those buffers still need equal page sizes).
#[pyfunction]
#[pyo3(signature = (a, b, level = "pool"))]
pub fn compare(a: &Geometry, b: &Geometry, level: &str) -> PyResult<Vec<String>> {
    Ok(diff_lines(&a.inner, &b.inner, parse_level(level)?))
}

/// Returns `None` when compatible at `level`; raises `Incompatible` (`.lines`: the diff lines
/// of `compare`; `.header`: the count, the level and both sides' fingerprints at that level).
#[pyfunction]
#[pyo3(signature = (a, b, level = "pool"))]
pub fn check(py: Python<'_>, a: &Geometry, b: &Geometry, level: &str) -> PyResult<()> {
    let level = parse_level(level)?;
    let lines = diff_lines(&a.inner, &b.inner, level);
    if lines.is_empty() {
        return Ok(());
    }
    let head = header(lines.len(), &a.inner, &b.inner, level);
    Err(errors::incompatible(py, lines, head))
}

/// A side's fingerprint at `level`, as the CLI prints it (per buffer for `token`).
fn level_fingerprint(g: &PoolGeometry, level: Level) -> String {
    let hex = |r: Result<u64, kvlayout_core::LayoutError>| match r {
        Ok(f) => format!("{f:#018x}"),
        Err(e) => format!("invalid ({e})"),
    };
    match level {
        Level::Pool => hex(g.fingerprint()),
        Level::Storage => hex(g.storage_fingerprint()),
        Level::Token => g
            .token_fingerprints()
            .into_iter()
            .map(|(n, f)| format!("{n}={f:#018x}"))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// `incompatible: N differing fields at level L (L fingerprints A, B)`, the CLI's first line
/// without the file names.
pub fn header(n: usize, a: &PoolGeometry, b: &PoolGeometry, level: Level) -> String {
    format!(
        "incompatible: {n} differing field{} at level {level} ({level} fingerprints {}, {})",
        if n == 1 { "" } else { "s" },
        level_fingerprint(a, level),
        level_fingerprint(b, level)
    )
}

/// The built-in token layouts, as `kvlayout formats --json` (fingerprint as an int), each with
/// its file form (`arrangement`, `sections`, alignment) under `"layout"`.
#[pyfunction]
pub fn formats(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    let mut rows = Vec::new();
    for f in builtin::all() {
        let l = &f.layout;
        let bad = |e: kvlayout_core::LayoutError| {
            errors::invalid_geometry(py, f.name, &format!("built-in format invalid: {e}"))
        };
        rows.push(json!({
            "name": f.name,
            "bytes_per_token": l.bytes_per_token().map_err(bad)?,
            "value_bytes_per_token": l.value_bytes_per_token().map_err(bad)?,
            "scale_bytes_per_token": l.scale_bytes_per_token().map_err(bad)?,
            "bytes_per_page_64": l.page_stride_bytes(64).map_err(bad)?,
            "arrangement": arrangement_text(l),
            "fingerprint": l.fingerprint(),
            "source": f.source,
            "layout": layout_json(l),
        }));
    }
    to_py(py, &Value::Array(rows))
}
