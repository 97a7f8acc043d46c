//! The geometry file, schemas `kvlayout.geometry/v1`, `/v2` and `/v3`: read, validated,
//! written.
//!
//! v2 adds only optional fields (per buffer `page_size_tokens`, `attention`, `layer_ids`,
//! `shard`; per section `order`; dtypes `i32`, `i64`), and v3 more (per buffer
//! `compress_ratio`; per section `split_groups`; a heads split with fewer heads than ranks):
//! every v1 file reads as it did, and a file that uses a later schema's field is refused
//! naming the field and the schema it needs. The writer emits the earliest schema that holds
//! the pool's fields ([`BufferGeometry::needs_v2_file`], [`BufferGeometry::needs_v3_file`]),
//! so a v1 or v2 pool is written exactly as before.
//!
//! The file is read into typed serde models (`model`): an unknown field, a field given twice,
//! a wrong type or a missing field is serde's own error, with its path from
//! `serde_path_to_error` and its line and column; no `serde_json::Value` is built.
//!
//! Reading never trusts a number to size an allocation: every `Vec` built here is bounded by
//! the input's length, files are read up to [`MAX_FILE_BYTES`], buffer and section counts are
//! capped ([`MAX_BUFFERS`], [`MAX_SECTIONS`], [`MAX_RANK`]) so every check stays cheap, and the
//! pool's byte total is computed with checked arithmetic.
//!
//! [`BufferGeometry::needs_v2_file`]: crate::BufferGeometry::needs_v2_file
//! [`BufferGeometry::needs_v3_file`]: crate::BufferGeometry::needs_v3_file

mod convert;
mod model;

use std::io::Read;
use std::path::Path;

use serde::de::IgnoredAny;
use serde_json::error::Category;

use crate::geometry::{GeometryError, PoolGeometry};
use model::{Names, TopLevel, TopLevelKeys};

/// The v1 schema string.
pub const SCHEMA: &str = "kvlayout.geometry/v1";
/// The v2 schema string (hybrid, windowed, stateful, sharded pools).
pub const SCHEMA_V2: &str = "kvlayout.geometry/v2";
/// The v3 schema string (compressed rows, replicated heads, grouped shards).
pub const SCHEMA_V3: &str = "kvlayout.geometry/v3";

/// Largest geometry file read (16 MiB; a real pool's file is a few KiB).
pub const MAX_FILE_BYTES: u64 = 16 << 20;
/// Most buffers in one pool (real engines: 1 to 4).
pub const MAX_BUFFERS: usize = 1024;
/// Most sections in one buffer (real layouts: 1 to 4).
pub const MAX_SECTIONS: usize = 1024;
/// Most dimensions in one section's shape.
pub const MAX_RANK: usize = 16;

/// Reads a geometry file from `path` (at most [`MAX_FILE_BYTES`]) and validates it.
///
/// # Errors
/// The path's problem (`file: cannot read: ...`), or any error of [`from_json`].
pub fn read_path(path: &Path) -> Result<PoolGeometry, GeometryError> {
    let file = std::fs::File::open(path)
        .map_err(|e| GeometryError::new("file", format!("cannot read: {e}")))?;
    read_from(file)
}

/// Reads a geometry file from `reader` (a file, stdin; at most [`MAX_FILE_BYTES`]) and
/// validates it.
///
/// # Errors
/// Unreadable input, more than [`MAX_FILE_BYTES`], text that is not UTF-8, or any error of
/// [`from_json`].
pub fn read_from(reader: impl Read) -> Result<PoolGeometry, GeometryError> {
    let mut bytes = Vec::new();
    reader
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| GeometryError::new("file", format!("cannot read: {e}")))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(GeometryError::new(
            "file",
            format!("larger than the {MAX_FILE_BYTES}-byte limit for a geometry file"),
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|e| GeometryError::new("file", format!("not UTF-8: {e}")))?;
    from_json(&text)
}

/// The error for a file without `schema`: a model config is named as one.
fn missing_schema(top: &TopLevelKeys) -> GeometryError {
    if top.config_keys.is_empty() {
        return GeometryError::new(
            "schema",
            format!(
                "missing: expected a kvlayout geometry file with \"schema\": \"{SCHEMA}\", \"{SCHEMA_V2}\" or \"{SCHEMA_V3}\""
            ),
        );
    }
    let model = top
        .model_type
        .as_ref()
        .map(|m| format!(" (model_type {m:?})"))
        .unwrap_or_default();
    GeometryError::new(
        "schema",
        format!(
            "missing: expected a kvlayout geometry file (\"schema\": \"{SCHEMA}\", \"{SCHEMA_V2}\" or \"{SCHEMA_V3}\"), \
             got what looks like a model config.json{model} (it has {}); \
             `kvlayout describe --json MODEL` writes a model's geometry file",
            top.config_keys.join(", ")
        ),
    )
}

/// Reads and validates a geometry file (a UTF-8 BOM at the start is skipped).
///
/// # Errors
/// A [`GeometryError`] naming the field and the bad value: an unknown schema, field, dtype,
/// arrangement, attention, split or memory layout; a field given twice in one object; a
/// missing field (a missing `schema` on a model `config.json` is named as one); a wrong type;
/// a later schema's field in an earlier schema's file; zero dimensions; a block that does not
/// divide; a scale naming a missing section; odd fp4 counts; a `compress_ratio` that does not
/// divide the page; a head split or `split_groups` that does not divide by `tp_size`;
/// overflow; any JSON syntax error (with its line and column).
pub fn from_json(text: &str) -> Result<PoolGeometry, GeometryError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // JSON syntax first, over the whole text (every value skipped, nothing built): a broken
    // file is reported as broken, at its line and column, before any field of it.
    serde_json::from_str::<IgnoredAny>(text)
        .map_err(|e| GeometryError::new("json", e.to_string()))?;
    let mut json = serde_json::Deserializer::from_str(text);
    let file = match serde_path_to_error::deserialize::<_, TopLevel>(&mut json) {
        Ok(TopLevel(file)) => file,
        Err(e) => {
            // An object without `schema` (a model config fails on its first unknown key):
            // say what is missing, and what the file looks like, first.
            if let Ok(top) = serde_json::from_str::<TopLevelKeys>(text)
                && !top.has_schema
            {
                return Err(missing_schema(&top));
            }
            // A syntax error is the text's, not a field's: serde_path_to_error would place
            // it at the field being read when the text broke off.
            let path = e.path().to_string();
            let field = match e.inner().classify() {
                Category::Syntax | Category::Eof | Category::Io => "json".to_string(),
                Category::Data if path == "." => "json".to_string(),
                Category::Data => match serde_json::from_str::<Names>(text) {
                    Ok(names) => names.decorate(&path),
                    Err(_) => path,
                },
            };
            return Err(GeometryError::new(field, e.inner().to_string()));
        }
    };
    json.end()
        .map_err(|e| GeometryError::new("json", e.to_string()))?;
    let Some(schema) = file.schema else {
        return Err(missing_schema(&TopLevelKeys::default()));
    };
    let pool = convert::pool_from_file(file, schema)?;
    pool.validate()?;
    Ok(pool)
}

/// Writes a geometry file (pretty JSON, trailing newline) in the earliest schema that holds
/// the pool's fields: `kvlayout.geometry/v1` unless a buffer needs v2 or v3.
pub fn to_json(pool: &PoolGeometry) -> String {
    let mut text = serde_json::to_string_pretty(&convert::file_from_pool(pool))
        .expect("geometry file serializes");
    text.push('\n');
    text
}
