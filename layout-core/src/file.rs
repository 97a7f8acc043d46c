//! The geometry file, schemas `kvlayout.geometry/v1` and `kvlayout.geometry/v2`: read,
//! validated, written.
//!
//! v2 adds only optional fields (per buffer `page_size_tokens`, `attention`, `layer_ids`,
//! `shard`; per section `order`; dtypes `i32`, `i64`): every v1 file reads as it did, and a v1
//! file that uses a v2 field is refused naming the field and the schema it needs. The writer
//! emits v1 unless a v2 field is set ([`BufferGeometry::needs_v2_file`]).
//!
//! Reading never trusts a number to size an allocation: every `Vec` built here is bounded by
//! the input's length, files are read up to [`MAX_FILE_BYTES`], buffer and section counts are
//! capped ([`MAX_BUFFERS`], [`MAX_SECTIONS`], [`MAX_RANK`]) so every check stays cheap, and the
//! pool's byte total is computed with checked arithmetic.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Dtype;
use crate::buffer::{Attention, BufferGeometry, Shard, ShardSplit};
use crate::geometry::{GeometryError, MemoryLayout, PoolGeometry};
use crate::layout::{Arrangement, TokenLayout};
use crate::section::{ScaleOf, Section, cow_slice};

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

/// Reads a geometry file from `path` (at most [`MAX_FILE_BYTES`]) and validates it; the error
/// names the path's problem or the field.
pub fn read_path(path: &Path) -> Result<PoolGeometry, GeometryError> {
    let file = std::fs::File::open(path)
        .map_err(|e| GeometryError::new("file", format!("cannot read: {e}")))?;
    read_from(file)
}

/// Reads a geometry file from `reader` (a file, stdin; at most [`MAX_FILE_BYTES`]) and
/// validates it.
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

/// Keys a Hugging Face `config.json` has and a geometry file never has.
const MODEL_CONFIG_KEYS: [&str; 6] = [
    "model_type",
    "architectures",
    "num_hidden_layers",
    "text_config",
    "hidden_size",
    "num_attention_heads",
];

/// The error for an object without `schema`: a model config is named as one.
fn missing_schema(map: &serde_json::Map<String, Value>) -> GeometryError {
    let seen: Vec<&str> = MODEL_CONFIG_KEYS
        .into_iter()
        .filter(|k| map.contains_key(*k))
        .collect();
    if seen.is_empty() {
        return GeometryError::new(
            "schema",
            format!(
                "missing: expected a kvlayout geometry file with \"schema\": \"{SCHEMA}\" or \"{SCHEMA_V2}\""
            ),
        );
    }
    let model = map
        .get("model_type")
        .and_then(Value::as_str)
        .map(|m| format!(" (model_type {m:?})"))
        .unwrap_or_default();
    GeometryError::new(
        "schema",
        format!(
            "missing: expected a kvlayout geometry file (\"schema\": \"{SCHEMA}\" or \"{SCHEMA_V2}\"), \
             got what looks like a model config.json{model} (it has {}); \
             `kvlayout describe --json MODEL` writes a model's geometry file",
            seen.join(", ")
        ),
    )
}

/// A name that prints on one line as written: not empty, no control characters.
fn check_name(field: String, name: &str) -> Result<(), GeometryError> {
    if name.is_empty() {
        return Err(GeometryError::new(field, "must not be empty"));
    }
    if name.chars().any(char::is_control) {
        return Err(GeometryError::new(
            field,
            format!("{name:?} holds control characters"),
        ));
    }
    Ok(())
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileDoc {
    schema: String,
    #[serde(default)]
    name: String,
    page_size_tokens: u64,
    pages: u64,
    memory_layout: String,
    buffers: Vec<BufferFile>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BufferFile {
    name: String,
    layers: u64,
    arrangement: Value,
    sections: Vec<SectionFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    page_align_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    page_stride_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    page_size_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    attention: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    layer_ids: Option<Vec<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shard: Option<ShardFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    compress_ratio: Option<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShardFile {
    tp_size: u64,
    rank: u64,
    split: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    heads_total: Option<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SectionFile {
    name: String,
    dtype: String,
    shape: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scales: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    block_elems: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    order: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    split_groups: Option<Vec<u64>>,
}

/// Reads and validates a geometry file.
///
/// Errors name the field and the bad value: unknown schema, dtype, arrangement or memory
/// layout; zero dimensions; a block that does not divide; a scale naming a missing section;
/// odd fp4 counts; overflow; a key given twice in one object; and any JSON error (with its
/// line and column).
pub fn from_json(text: &str) -> Result<PoolGeometry, GeometryError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    crate::duplicate_keys::check_unique_keys(text)?;
    let value: Value =
        serde_json::from_str(text).map_err(|e| GeometryError::new("json", e.to_string()))?;
    let Some(map) = value.as_object() else {
        return Err(GeometryError::new(
            "json",
            "the top level must be an object {\"schema\": ..., \"buffers\": [...]}",
        ));
    };
    if !map.contains_key("schema") {
        return Err(missing_schema(map));
    }
    let file: FileDoc = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            "json".to_string()
        } else {
            path
        };
        GeometryError::new(field, e.inner().to_string())
    })?;
    if file.buffers.len() > MAX_BUFFERS {
        return Err(GeometryError::new(
            "buffers",
            format!(
                "{} buffers, more than the limit of {MAX_BUFFERS}",
                file.buffers.len()
            ),
        ));
    }
    let (v2, v3) = match file.schema.as_str() {
        SCHEMA => (false, false),
        SCHEMA_V2 => (true, false),
        SCHEMA_V3 => (true, true),
        other => {
            return Err(GeometryError::new(
                "schema",
                format!(
                    "unknown schema {other:?} (expected \"{SCHEMA}\", \"{SCHEMA_V2}\" or \"{SCHEMA_V3}\")"
                ),
            ));
        }
    };
    let memory_layout = MemoryLayout::from_name(&file.memory_layout).ok_or_else(|| {
        GeometryError::new(
            "memory_layout",
            format!(
                "unknown memory layout {:?} (expected layer_first, page_first, page_first_direct or page_head)",
                file.memory_layout
            ),
        )
    })?;
    let buffers = file
        .buffers
        .into_iter()
        .enumerate()
        .map(|(i, b)| buffer_from_file(i, b, v2, v3))
        .collect::<Result<Vec<_>, _>>()?;
    let pool = PoolGeometry {
        name: file.name,
        page_size_tokens: file.page_size_tokens,
        pages: file.pages,
        memory_layout,
        buffers,
    };
    pool.validate()?;
    Ok(pool)
}

/// Refuses v2 field `field` of a v1 file, naming the schema it needs.
fn needs_v2(v2: bool, present: bool, field: impl FnOnce() -> String) -> Result<(), GeometryError> {
    if present && !v2 {
        return Err(GeometryError::new(
            field(),
            format!("needs \"schema\": \"{SCHEMA_V2}\" (this file says \"{SCHEMA}\")"),
        ));
    }
    Ok(())
}

fn attention_from_file(path: &str, value: &Value) -> Result<Attention, GeometryError> {
    let field = format!("{path}.attention");
    let expected =
        "expected \"full\", \"state\", {\"sliding_window_tokens\": W} or {\"chunk_tokens\": C}";
    match value {
        Value::String(name) => match name.as_str() {
            "full" => Ok(Attention::Full),
            "state" => Ok(Attention::State),
            other => Err(GeometryError::new(
                field,
                format!("unknown attention {other:?} ({expected})"),
            )),
        },
        Value::Object(map) if map.len() == 1 => {
            let (key, v) = map.iter().next().expect("one entry");
            let n = v.as_u64().ok_or_else(|| {
                GeometryError::new(
                    format!("{field}.{key}"),
                    format!("expected a token count, got {v}"),
                )
            })?;
            match key.as_str() {
                "sliding_window_tokens" => Ok(Attention::SlidingWindow { window_tokens: n }),
                "chunk_tokens" => Ok(Attention::Chunked { chunk_tokens: n }),
                other => Err(GeometryError::new(
                    field,
                    format!("unknown attention field {other:?} ({expected})"),
                )),
            }
        }
        other => Err(GeometryError::new(
            field,
            format!("{expected}, got {other}"),
        )),
    }
}

fn shard_from_file(path: &str, s: &ShardFile) -> Result<Shard, GeometryError> {
    let field = format!("{path}.shard");
    let split = match (s.split.as_str(), s.heads_total) {
        ("heads", Some(heads_total)) => ShardSplit::Heads { heads_total },
        ("heads", None) => {
            return Err(GeometryError::new(
                format!("{field}.heads_total"),
                "missing: split \"heads\" needs heads_total",
            ));
        }
        ("replicated", None) => ShardSplit::Replicated,
        ("replicated", Some(h)) => {
            return Err(GeometryError::new(
                format!("{field}.heads_total"),
                format!(
                    "heads_total {h} given with split \"replicated\" (only a heads split has it)"
                ),
            ));
        }
        (other, _) => {
            return Err(GeometryError::new(
                format!("{field}.split"),
                format!("unknown split {other:?} (expected \"heads\" or \"replicated\")"),
            ));
        }
    };
    Ok(Shard {
        tp_size: s.tp_size,
        rank: s.rank,
        split,
    })
}

/// Refuses v3 field `field` of a v1 or v2 file, naming the schema it needs.
fn needs_v3(v3: bool, present: bool, field: impl FnOnce() -> String) -> Result<(), GeometryError> {
    if present && !v3 {
        return Err(GeometryError::new(
            field(),
            format!("needs \"schema\": \"{SCHEMA_V3}\" (this file says v1 or v2)"),
        ));
    }
    Ok(())
}

fn buffer_from_file(
    i: usize,
    b: BufferFile,
    v2: bool,
    v3: bool,
) -> Result<BufferGeometry, GeometryError> {
    check_name(format!("buffers[{i}].name"), &b.name)?;
    let path = format!("buffers[{i}] ({})", b.name);
    needs_v3(v3, b.compress_ratio.is_some(), || {
        format!("{path}.compress_ratio")
    })?;
    needs_v2(v2, b.page_size_tokens.is_some(), || {
        format!("{path}.page_size_tokens")
    })?;
    needs_v2(v2, b.attention.is_some(), || format!("{path}.attention"))?;
    needs_v2(v2, b.layer_ids.is_some(), || format!("{path}.layer_ids"))?;
    needs_v2(v2, b.shard.is_some(), || format!("{path}.shard"))?;
    if b.sections.len() > MAX_SECTIONS {
        return Err(GeometryError::new(
            format!("{path}.sections"),
            format!(
                "{} sections, more than the limit of {MAX_SECTIONS}",
                b.sections.len()
            ),
        ));
    }
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(b.sections.len());
    for (k, s) in b.sections.iter().enumerate() {
        check_name(format!("{path}.sections[{k}].name"), &s.name)?;
        if s.shape.len() > MAX_RANK {
            return Err(GeometryError::new(
                format!("{path}.sections[{k}] ({}).shape", s.name),
                format!(
                    "{} dimensions, more than the limit of {MAX_RANK}",
                    s.shape.len()
                ),
            ));
        }
        if let Some(j) = by_name.insert(&s.name, k) {
            return Err(GeometryError::new(
                format!("{path}.sections[{k}].name"),
                format!("duplicate section name \"{}\" (also sections[{j}])", s.name),
            ));
        }
    }
    let index_of = |name: &str| by_name.get(name).copied();
    let arrangement = match &b.arrangement {
        Value::String(name) => match name.as_str() {
            "token_major" => Arrangement::TokenMajor,
            "section_major" => Arrangement::SectionMajor,
            "head_major" => Arrangement::HeadMajor,
            other => {
                return Err(GeometryError::new(
                    format!("{path}.arrangement"),
                    format!(
                        "unknown arrangement {other:?} (expected token_major, section_major, head_major or {{\"planes\": [[...]]}})"
                    ),
                ));
            }
        },
        Value::Object(map) if map.len() == 1 && map.contains_key("planes") => {
            let bad = || {
                GeometryError::new(
                    format!("{path}.arrangement.planes"),
                    format!(
                        "expected an array of arrays of section names, got {}",
                        map["planes"]
                    ),
                )
            };
            let groups = map["planes"].as_array().ok_or_else(bad)?;
            // Names first, so an unknown one is named rather than counted.
            let mut planes: Vec<Cow<'static, [usize]>> = Vec::with_capacity(groups.len());
            for g in groups {
                let mut plane = Vec::new();
                for name in g.as_array().ok_or_else(bad)? {
                    let name = name.as_str().ok_or_else(bad)?;
                    let k = index_of(name).ok_or_else(|| {
                        let known: Vec<&str> = b.sections.iter().map(|s| s.name.as_str()).collect();
                        GeometryError::new(
                            format!("{path}.arrangement.planes"),
                            format!("no section named {name:?} (sections: {})", known.join(", ")),
                        )
                    })?;
                    plane.push(k);
                }
                planes.push(Cow::Owned(plane));
            }
            let entries: usize = planes.iter().map(|p| p.len()).sum();
            if planes.len() > b.sections.len() || entries > b.sections.len() {
                return Err(GeometryError::new(
                    format!("{path}.arrangement.planes"),
                    format!(
                        "{} planes with {entries} entries for {} sections: each section belongs to exactly one plane",
                        planes.len(),
                        b.sections.len()
                    ),
                ));
            }
            Arrangement::Planes(Cow::Owned(planes))
        }
        other => {
            return Err(GeometryError::new(
                format!("{path}.arrangement"),
                format!("expected a name or {{\"planes\": [[...]]}}, got {other}"),
            ));
        }
    };
    let mut sections = Vec::with_capacity(b.sections.len());
    for (k, s) in b.sections.iter().enumerate() {
        let sp = format!("{path}.sections[{k}] ({})", s.name);
        let dtype = Dtype::from_name(&s.dtype).ok_or_else(|| {
            GeometryError::new(
                format!("{sp}.dtype"),
                format!(
                    "unknown dtype {:?} (expected one of {})",
                    s.dtype,
                    Dtype::accepted_names()
                ),
            )
        })?;
        needs_v2(v2, dtype.is_v2(), || format!("{sp}.dtype {}", dtype.name()))?;
        needs_v2(v2, s.order.is_some(), || format!("{sp}.order"))?;
        needs_v3(v3, s.split_groups.is_some(), || {
            format!("{sp}.split_groups")
        })?;
        if let Some(order) = &s.order {
            check_name(format!("{sp}.order"), order)?;
        }
        let scale = match (&s.scales, s.block_elems) {
            (None, None) => None,
            (Some(target), Some(block_elems)) => {
                let target = index_of(target).ok_or_else(|| {
                    GeometryError::new(
                        format!("{sp}.scales"),
                        format!("no section named {target:?} in {path}"),
                    )
                })?;
                Some(ScaleOf {
                    target,
                    block_elems,
                })
            }
            (Some(_), None) => {
                return Err(GeometryError::new(
                    format!("{sp}.block_elems"),
                    "missing: a scale section needs both `scales` and `block_elems`",
                ));
            }
            (None, Some(block)) => {
                return Err(GeometryError::new(
                    format!("{sp}.scales"),
                    format!("missing: block_elems {block} given without `scales`"),
                ));
            }
        };
        sections.push(Section {
            name: Cow::Owned(s.name.clone()),
            dtype,
            shape: Cow::Owned(s.shape.clone()),
            scale,
            // "linear" is kept as written: `Section::order` reads it as absent everywhere.
            order: s.order.clone().map(Cow::Owned),
            split_groups: s.split_groups.clone().map(Cow::Owned),
        });
    }
    let attention = match &b.attention {
        Some(v) => attention_from_file(&path, v)?,
        None => Attention::Full,
    };
    let shard = match &b.shard {
        Some(s) => Some(shard_from_file(&path, s)?),
        None => None,
    };
    if let Some(s) = shard {
        needs_v3(v3, s.replicated_heads(), || {
            format!(
                "{path}.shard.heads_total {} below tp_size {} (replicated heads)",
                s.heads_total().unwrap_or(0),
                s.tp_size
            )
        })?;
    }
    Ok(BufferGeometry {
        name: Cow::Owned(b.name),
        layers: b.layers,
        layout: TokenLayout {
            arrangement,
            sections: Cow::Owned(sections),
            page_align_bytes: b.page_align_bytes,
            page_stride_bytes: b.page_stride_bytes,
        },
        page_size_tokens: b.page_size_tokens,
        attention,
        layer_ids: b.layer_ids,
        shard,
        compress_ratio: b.compress_ratio.unwrap_or(1),
    })
}

/// Writes a geometry file (pretty JSON, trailing newline): `kvlayout.geometry/v1` unless a
/// buffer needs v2 ([`BufferGeometry::needs_v2_file`]).
pub fn to_json(pool: &PoolGeometry) -> String {
    let v2 = pool.buffers.iter().any(BufferGeometry::needs_v2_file);
    let v3 = pool.buffers.iter().any(BufferGeometry::needs_v3_file);
    let schema = match (v2, v3) {
        (_, true) => SCHEMA_V3,
        (true, false) => SCHEMA_V2,
        (false, false) => SCHEMA,
    };
    let file = FileDoc {
        schema: schema.to_string(),
        name: pool.name.clone(),
        page_size_tokens: pool.page_size_tokens,
        pages: pool.pages,
        memory_layout: pool.memory_layout.name().to_string(),
        buffers: pool.buffers.iter().map(buffer_to_file).collect(),
    };
    let mut text = serde_json::to_string_pretty(&file).expect("geometry file serializes");
    text.push('\n');
    text
}

fn buffer_to_file(b: &BufferGeometry) -> BufferFile {
    let layout = &b.layout;
    let sections = layout.sections();
    let name_of = |i: usize| {
        sections
            .get(i)
            .map(|s| s.name().to_string())
            .unwrap_or_default()
    };
    let arrangement = match &layout.arrangement {
        Arrangement::Planes(planes) => {
            let groups: Vec<Value> = planes
                .iter()
                .map(|p| Value::from(cow_slice(p).iter().map(|&i| name_of(i)).collect::<Vec<_>>()))
                .collect();
            serde_json::json!({ "planes": groups })
        }
        other => Value::from(other.name()),
    };
    BufferFile {
        name: b.name().to_string(),
        layers: b.layers,
        arrangement,
        sections: sections
            .iter()
            .map(|s| SectionFile {
                name: s.name().to_string(),
                dtype: s.dtype.name().to_string(),
                shape: s.shape().to_vec(),
                scales: s.scale.map(|r| name_of(r.target)),
                block_elems: s.scale.map(|r| r.block_elems),
                order: s.order().map(str::to_string),
                split_groups: s.split_groups().map(<[u64]>::to_vec),
            })
            .collect(),
        page_align_bytes: layout.page_align_bytes,
        page_stride_bytes: layout.page_stride_bytes,
        page_size_tokens: b.page_size_tokens,
        attention: match b.attention {
            Attention::Full => None,
            Attention::SlidingWindow { window_tokens } => {
                Some(serde_json::json!({ "sliding_window_tokens": window_tokens }))
            }
            Attention::Chunked { chunk_tokens } => {
                Some(serde_json::json!({ "chunk_tokens": chunk_tokens }))
            }
            Attention::State => Some(Value::from("state")),
        },
        layer_ids: b.layer_ids.clone(),
        shard: b.shard.map(|s| ShardFile {
            tp_size: s.tp_size,
            rank: s.rank,
            split: match s.split {
                ShardSplit::Heads { .. } => "heads",
                ShardSplit::Replicated => "replicated",
            }
            .to_string(),
            heads_total: s.heads_total(),
        }),
        compress_ratio: (b.compress_ratio != 1).then_some(b.compress_ratio),
    }
}
