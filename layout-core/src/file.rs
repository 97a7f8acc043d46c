//! The geometry file, schema `kvlayout.geometry/v1` (DESIGN.md): read, validated, written.
//!
//! Reading never trusts a number to size an allocation: every `Vec` built here is bounded by
//! the input's length, and the pool's byte total is computed with checked arithmetic.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Dtype;
use crate::geometry::{BufferGeometry, GeometryError, MemoryLayout, PoolGeometry};
use crate::layout::{Arrangement, TokenLayout};
use crate::section::{ScaleOf, Section, cow_slice};

/// The schema string every geometry file carries.
pub const SCHEMA: &str = "kvlayout.geometry/v1";

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileV1 {
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
}

/// Reads and validates a geometry file.
///
/// Errors name the field and the bad value: unknown schema, dtype, arrangement or memory
/// layout; zero dimensions; a block that does not divide; a scale naming a missing section;
/// odd fp4 counts; overflow; and any JSON error (with its line and column).
pub fn from_json(text: &str) -> Result<PoolGeometry, GeometryError> {
    let file: FileV1 =
        serde_json::from_str(text).map_err(|e| GeometryError::new("json", e.to_string()))?;
    if file.schema != SCHEMA {
        return Err(GeometryError::new(
            "schema",
            format!("unknown schema \"{}\" (expected \"{SCHEMA}\")", file.schema),
        ));
    }
    let memory_layout = MemoryLayout::from_name(&file.memory_layout).ok_or_else(|| {
        GeometryError::new(
            "memory_layout",
            format!(
                "unknown memory layout \"{}\" (expected layer_first, page_first, page_first_direct or page_head)",
                file.memory_layout
            ),
        )
    })?;
    let buffers = file
        .buffers
        .into_iter()
        .enumerate()
        .map(|(i, b)| buffer_from_file(i, b))
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

fn buffer_from_file(i: usize, b: BufferFile) -> Result<BufferGeometry, GeometryError> {
    let path = format!("buffers[{i}] ({})", b.name);
    let index_of = |name: &str| b.sections.iter().position(|s| s.name == name);
    for (k, s) in b.sections.iter().enumerate() {
        if let Some(j) = b.sections[..k].iter().position(|o| o.name == s.name) {
            return Err(GeometryError::new(
                format!("{path}.sections[{k}].name"),
                format!("duplicate section name \"{}\" (also sections[{j}])", s.name),
            ));
        }
    }
    let arrangement = match &b.arrangement {
        Value::String(name) => match name.as_str() {
            "token_major" => Arrangement::TokenMajor,
            "section_major" => Arrangement::SectionMajor,
            "head_major" => Arrangement::HeadMajor,
            other => {
                return Err(GeometryError::new(
                    format!("{path}.arrangement"),
                    format!(
                        "unknown arrangement \"{other}\" (expected token_major, section_major, head_major or {{\"planes\": [[...]]}})"
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
            let mut planes = Vec::with_capacity(groups.len());
            for g in groups {
                let mut plane = Vec::new();
                for name in g.as_array().ok_or_else(bad)? {
                    let name = name.as_str().ok_or_else(bad)?;
                    let k = index_of(name).ok_or_else(|| {
                        GeometryError::new(
                            format!("{path}.arrangement.planes"),
                            format!("no section named \"{name}\""),
                        )
                    })?;
                    plane.push(k);
                }
                planes.push(Cow::Owned(plane));
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
                    "unknown dtype \"{}\" (expected one of {})",
                    s.dtype,
                    Dtype::accepted_names()
                ),
            )
        })?;
        let scale = match (&s.scales, s.block_elems) {
            (None, None) => None,
            (Some(target), Some(block_elems)) => {
                let target = index_of(target).ok_or_else(|| {
                    GeometryError::new(
                        format!("{sp}.scales"),
                        format!("no section named \"{target}\" in {path}"),
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
        });
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
    })
}

/// Writes a geometry file (pretty JSON, trailing newline).
pub fn to_json(pool: &PoolGeometry) -> String {
    let file = FileV1 {
        schema: SCHEMA.to_string(),
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
            })
            .collect(),
        page_align_bytes: layout.page_align_bytes,
        page_stride_bytes: layout.page_stride_bytes,
    }
}
