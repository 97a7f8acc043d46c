//! Between the file's typed model ([`super::model`]) and the core's [`PoolGeometry`]: which
//! schema allows which field, names resolved to indices (`scales`, planes), limits, and the
//! field paths with names (`buffers[1] (index_k).sections[0] (values).dtype`) for every rule
//! checked after the JSON is read.

use std::borrow::Cow;
use std::collections::HashMap;

use super::model::{
    ArrangementFile, AttentionFile, BufferFile, FileDoc, Schema, SectionFile, ShardFile, SplitFile,
};
use super::{MAX_BUFFERS, MAX_RANK, MAX_SECTIONS, SCHEMA, SCHEMA_V2, SCHEMA_V3};
use crate::Dtype;
use crate::buffer::{Attention, BufferGeometry, Shard, ShardSplit};
use crate::geometry::{GeometryError, MemoryLayout, PoolGeometry};
use crate::layout::{Arrangement, TokenLayout};
use crate::section::{ScaleOf, Section, cow_slice};

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

/// Refuses a field of a later schema than the file's, naming it and the schema it needs.
fn needs(
    schema: Schema,
    at_least: Schema,
    present: bool,
    field: impl FnOnce() -> String,
) -> Result<(), GeometryError> {
    if present && schema < at_least {
        let (needed, says) = (schema_name(at_least), schema_name(schema));
        return Err(GeometryError::new(
            field(),
            format!("needs \"schema\": \"{needed}\" (this file says \"{says}\")"),
        ));
    }
    Ok(())
}

pub(crate) const fn schema_name(schema: Schema) -> &'static str {
    match schema {
        Schema::V1 => SCHEMA,
        Schema::V2 => SCHEMA_V2,
        Schema::V3 => SCHEMA_V3,
    }
}

/// The pool a read file describes (validated by the caller).
pub(crate) fn pool_from_file(file: FileDoc, schema: Schema) -> Result<PoolGeometry, GeometryError> {
    if file.buffers.len() > MAX_BUFFERS {
        return Err(GeometryError::new(
            "buffers",
            format!(
                "{} buffers, more than the limit of {MAX_BUFFERS}",
                file.buffers.len()
            ),
        ));
    }
    // A v1 or v2 file cannot express page_unified's parameter.
    needs(
        schema,
        Schema::V3,
        matches!(file.memory_layout, MemoryLayout::PageUnified { .. }),
        || "memory_layout page_unified".to_string(),
    )?;
    let buffers = file
        .buffers
        .into_iter()
        .enumerate()
        .map(|(i, b)| buffer_from_file(i, b, schema))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PoolGeometry {
        name: file.name,
        page_size_tokens: file.page_size_tokens,
        pages: file.pages,
        memory_layout: file.memory_layout,
        buffers,
    })
}

fn shard_from_file(path: &str, s: &ShardFile) -> Result<Shard, GeometryError> {
    let field = format!("{path}.shard");
    let split = match (s.split, s.heads_total) {
        (SplitFile::Heads, Some(heads_total)) => ShardSplit::Heads { heads_total },
        (SplitFile::Heads, None) => {
            return Err(GeometryError::new(
                format!("{field}.heads_total"),
                "missing: split \"heads\" needs heads_total",
            ));
        }
        (SplitFile::Replicated, None) => ShardSplit::Replicated,
        (SplitFile::Replicated, Some(h)) => {
            return Err(GeometryError::new(
                format!("{field}.heads_total"),
                format!(
                    "heads_total {h} given with split \"replicated\" (only a heads split has it)"
                ),
            ));
        }
    };
    Ok(Shard {
        tp_size: s.tp_size,
        rank: s.rank,
        split,
    })
}

/// Section names, checked (non-empty, printable, unique, shape rank bounded), to indices.
fn section_index<'a>(
    path: &str,
    sections: &'a [SectionFile],
) -> Result<HashMap<&'a str, usize>, GeometryError> {
    if sections.len() > MAX_SECTIONS {
        return Err(GeometryError::new(
            format!("{path}.sections"),
            format!(
                "{} sections, more than the limit of {MAX_SECTIONS}",
                sections.len()
            ),
        ));
    }
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(sections.len());
    for (k, s) in sections.iter().enumerate() {
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
    Ok(by_name)
}

fn arrangement_from_file(
    path: &str,
    arrangement: &ArrangementFile,
    sections: &[SectionFile],
    by_name: &HashMap<&str, usize>,
) -> Result<Arrangement, GeometryError> {
    let groups = match arrangement {
        ArrangementFile::TokenMajor => return Ok(Arrangement::TokenMajor),
        ArrangementFile::SectionMajor => return Ok(Arrangement::SectionMajor),
        ArrangementFile::HeadMajor => return Ok(Arrangement::HeadMajor),
        ArrangementFile::Planes(groups) => groups,
    };
    let field = || format!("{path}.arrangement.planes");
    // Names first, so an unknown one is named rather than counted.
    let mut planes: Vec<Cow<'static, [usize]>> = Vec::with_capacity(groups.len());
    for g in groups {
        let mut plane = Vec::with_capacity(g.len());
        for name in g {
            let k = by_name.get(name.as_str()).copied().ok_or_else(|| {
                let known: Vec<&str> = sections.iter().map(|s| s.name.as_str()).collect();
                GeometryError::new(
                    field(),
                    format!("no section named {name:?} (sections: {})", known.join(", ")),
                )
            })?;
            plane.push(k);
        }
        planes.push(Cow::Owned(plane));
    }
    let entries: usize = planes.iter().map(|p| p.len()).sum();
    if planes.len() > sections.len() || entries > sections.len() {
        return Err(GeometryError::new(
            field(),
            format!(
                "{} planes with {entries} entries for {} sections: each section belongs to exactly one plane",
                planes.len(),
                sections.len()
            ),
        ));
    }
    Ok(Arrangement::Planes(Cow::Owned(planes)))
}

fn section_from_file(
    path: &str,
    k: usize,
    s: &SectionFile,
    schema: Schema,
    by_name: &HashMap<&str, usize>,
) -> Result<Section, GeometryError> {
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
    needs(schema, Schema::V2, dtype.is_v2(), || {
        format!("{sp}.dtype {}", dtype.name())
    })?;
    needs(schema, Schema::V2, s.order.is_some(), || {
        format!("{sp}.order")
    })?;
    needs(schema, Schema::V3, s.split_groups.is_some(), || {
        format!("{sp}.split_groups")
    })?;
    if let Some(order) = &s.order {
        check_name(format!("{sp}.order"), order)?;
    }
    let scale = match (&s.scales, s.block_elems) {
        (None, None) => None,
        (Some(target), Some(block_elems)) => {
            let target = by_name.get(target.as_str()).copied().ok_or_else(|| {
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
    Ok(Section {
        name: Cow::Owned(s.name.clone()),
        dtype,
        shape: Cow::Owned(s.shape.clone()),
        scale,
        // "linear" is kept as written: `Section::order` reads it as absent everywhere.
        order: s.order.clone().map(Cow::Owned),
        split_groups: s.split_groups.clone().map(Cow::Owned),
    })
}

fn buffer_from_file(
    i: usize,
    b: BufferFile,
    schema: Schema,
) -> Result<BufferGeometry, GeometryError> {
    check_name(format!("buffers[{i}].name"), &b.name)?;
    let path = format!("buffers[{i}] ({})", b.name);
    let v2 =
        |present: bool, name: &str| needs(schema, Schema::V2, present, || format!("{path}.{name}"));
    v2(b.page_size_tokens.is_some(), "page_size_tokens")?;
    v2(b.attention.is_some(), "attention")?;
    v2(b.layer_ids.is_some(), "layer_ids")?;
    v2(b.shard.is_some(), "shard")?;
    needs(schema, Schema::V3, b.compress_ratio.is_some(), || {
        format!("{path}.compress_ratio")
    })?;
    let by_name = section_index(&path, &b.sections)?;
    let arrangement = arrangement_from_file(&path, &b.arrangement, &b.sections, &by_name)?;
    let sections = b
        .sections
        .iter()
        .enumerate()
        .map(|(k, s)| section_from_file(&path, k, s, schema, &by_name))
        .collect::<Result<Vec<_>, _>>()?;
    let attention = match b.attention {
        None | Some(AttentionFile::Full) => Attention::Full,
        Some(AttentionFile::State) => Attention::State,
        Some(AttentionFile::SlidingWindowTokens(window_tokens)) => {
            Attention::SlidingWindow { window_tokens }
        }
        Some(AttentionFile::ChunkTokens(chunk_tokens)) => Attention::Chunked { chunk_tokens },
    };
    let shard = match &b.shard {
        Some(s) => Some(shard_from_file(&path, s)?),
        None => None,
    };
    if let Some(s) = shard {
        needs(schema, Schema::V3, s.replicated_heads(), || {
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

/// The file model of `pool`: the earliest schema that holds every field it uses.
pub(crate) fn file_from_pool(pool: &PoolGeometry) -> FileDoc {
    let unified = matches!(pool.memory_layout, MemoryLayout::PageUnified { .. });
    let schema = if unified || pool.buffers.iter().any(BufferGeometry::needs_v3_file) {
        Schema::V3
    } else if pool.buffers.iter().any(BufferGeometry::needs_v2_file) {
        Schema::V2
    } else {
        Schema::V1
    };
    FileDoc {
        schema: Some(schema),
        name: pool.name.clone(),
        page_size_tokens: pool.page_size_tokens,
        pages: pool.pages,
        memory_layout: pool.memory_layout,
        buffers: pool.buffers.iter().map(buffer_to_file).collect(),
    }
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
        Arrangement::TokenMajor => ArrangementFile::TokenMajor,
        Arrangement::SectionMajor => ArrangementFile::SectionMajor,
        Arrangement::HeadMajor => ArrangementFile::HeadMajor,
        Arrangement::Planes(planes) => ArrangementFile::Planes(
            planes
                .iter()
                .map(|p| cow_slice(p).iter().map(|&i| name_of(i)).collect())
                .collect(),
        ),
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
                Some(AttentionFile::SlidingWindowTokens(window_tokens))
            }
            Attention::Chunked { chunk_tokens } => Some(AttentionFile::ChunkTokens(chunk_tokens)),
            Attention::State => Some(AttentionFile::State),
        },
        layer_ids: b.layer_ids.clone(),
        shard: b.shard.map(|s| ShardFile {
            tp_size: s.tp_size,
            rank: s.rank,
            split: match s.split {
                ShardSplit::Heads { .. } => SplitFile::Heads,
                ShardSplit::Replicated => SplitFile::Replicated,
            },
            heads_total: s.heads_total(),
        }),
        compress_ratio: (b.compress_ratio != 1).then_some(b.compress_ratio),
    }
}
