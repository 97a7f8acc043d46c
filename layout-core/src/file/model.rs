//! The geometry file as typed serde models: one struct per JSON object, one enum per choice
//! of names, each with `deny_unknown_fields` where it is an object. Reading never builds a
//! `serde_json::Value`: serde's derive refuses an unknown field (naming it and the fields it
//! expected), a field given twice (`duplicate field `layers``: the second value would
//! otherwise silently win), a wrong type or a missing field, and `serde_path_to_error` gives
//! the path (`buffers[0].sections[1].shape[0]`).
//!
//! One model reads all three schemas (v1, v2, v3 add only optional fields); which fields a
//! schema allows is checked when the model is turned into a [`crate::PoolGeometry`]
//! ([`super::convert`]), so the error names the field and the schema it needs.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::{MapAccessDeserializer, StrDeserializer};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use crate::geometry::MemoryLayout;

/// `schema`: which version of the contract the file follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum Schema {
    /// `kvlayout.geometry/v1`.
    #[serde(rename = "kvlayout.geometry/v1")]
    V1,
    /// `kvlayout.geometry/v2`: hybrid, windowed, stateful, sharded pools.
    #[serde(rename = "kvlayout.geometry/v2")]
    V2,
    /// `kvlayout.geometry/v3`: compressed rows, replicated heads, grouped shards.
    #[serde(rename = "kvlayout.geometry/v3")]
    V3,
}

/// The whole file.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileDoc {
    /// Absent only in what is not a geometry file (a model config, say): refused by name.
    #[serde(default, deserialize_with = "some_named")]
    pub schema: Option<Schema>,
    #[serde(default)]
    pub name: String,
    pub page_size_tokens: u64,
    pub pages: u64,
    #[serde(deserialize_with = "named")]
    pub memory_layout: MemoryLayout,
    pub buffers: Vec<BufferFile>,
}

/// One buffer.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BufferFile {
    pub name: String,
    pub layers: u64,
    #[serde(deserialize_with = "named")]
    pub arrangement: ArrangementFile,
    pub sections: Vec<SectionFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_align_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_stride_bytes: Option<u64>,
    /// v2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size_tokens: Option<u64>,
    /// v2.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "some_named"
    )]
    pub attention: Option<AttentionFile>,
    /// v2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_ids: Option<Vec<u32>>,
    /// v2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<ShardFile>,
    /// v3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress_ratio: Option<u64>,
}

/// `arrangement`: a name, or `{"planes": [["nope", "rope"], ["scale", "pad"]]}` (section
/// names, group after group).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ArrangementFile {
    TokenMajor,
    SectionMajor,
    HeadMajor,
    Planes(Vec<Vec<String>>),
}

/// `attention` (v2): `"full"`, `"state"`, `{"sliding_window_tokens": W}` or
/// `{"chunk_tokens": C}`.
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AttentionFile {
    Full,
    State,
    SlidingWindowTokens(u64),
    ChunkTokens(u64),
}

/// `shard.split` (v2).
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SplitFile {
    Heads,
    Replicated,
}

/// `shard` (v2; v3 allows `heads_total < tp_size`).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ShardFile {
    pub tp_size: u64,
    pub rank: u64,
    #[serde(deserialize_with = "named")]
    pub split: SplitFile,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads_total: Option<u64>,
}

/// One section. `dtype` stays text here: it accepts the torch names in any case
/// ([`crate::Dtype::from_name`]), and its error names the buffer and section.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SectionFile {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scales: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_elems: Option<u64>,
    /// v2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
    /// v3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_groups: Option<Vec<u64>>,
}

/// What a choice of names reads, for the error on any other JSON type.
pub(crate) trait Expecting {
    /// `token_major, section_major, head_major or {"planes": [...]}`, say.
    const EXPECTING: &'static str;

    /// The error for a name given bare that needs a parameter (`"page_unified"`), else `None`.
    fn bare(_name: &str) -> Option<String> {
        None
    }
}

impl Expecting for Schema {
    const EXPECTING: &'static str =
        "\"kvlayout.geometry/v1\", \"kvlayout.geometry/v2\" or \"kvlayout.geometry/v3\"";
}

impl Expecting for MemoryLayout {
    const EXPECTING: &'static str = "layer_first, page_first, page_first_direct, page_head, \
         page_head_token, layer_head or {\"page_unified\": {\"heads_per_group\": N}}";

    fn bare(name: &str) -> Option<String> {
        (name == "page_unified").then(|| {
            "page_unified needs its heads_per_group: write \"memory_layout\": {\"page_unified\": \
             {\"heads_per_group\": N}} (schema kvlayout.geometry/v3)"
                .to_string()
        })
    }
}

impl Expecting for ArrangementFile {
    const EXPECTING: &'static str =
        "token_major, section_major, head_major or {\"planes\": [[section names], ...]}";
}

impl Expecting for AttentionFile {
    const EXPECTING: &'static str =
        "\"full\", \"state\", {\"sliding_window_tokens\": W} or {\"chunk_tokens\": C}";
}

impl Expecting for SplitFile {
    const EXPECTING: &'static str = "\"heads\" or \"replicated\"";
}

/// Reads an externally tagged enum (a name, or an object of one key: the variant, and its
/// value) through its serde derive, but by the JSON's own type, so that a number says what
/// was expected ([`Expecting`]) and an object of two keys (one given twice, say) names the
/// second key; serde_json's enum path answers both with "expected value".
fn named<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Expecting,
{
    deserializer.deserialize_any(NamedVisitor(PhantomData))
}

/// [`named`] for an optional field: `null` is absent.
fn some_named<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Expecting,
{
    struct Opt<T>(PhantomData<T>);
    impl<'de, T: Deserialize<'de> + Expecting> Visitor<'de> for Opt<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(T::EXPECTING)
        }
        fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_some<D2: Deserializer<'de>>(self, d: D2) -> Result<Option<T>, D2::Error> {
            named(d).map(Some)
        }
    }
    deserializer.deserialize_option(Opt(PhantomData))
}

struct NamedVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de> + Expecting> Visitor<'de> for NamedVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<T, E> {
        if let Some(message) = T::bare(name) {
            return Err(de::Error::custom(message));
        }
        T::deserialize(StrDeserializer::<E>::new(name))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let Some(variant) = map.next_key::<String>()? else {
            return Err(de::Error::custom(format!(
                "expected {}, got an empty object {{}}",
                T::EXPECTING
            )));
        };
        let value = T::deserialize(OneKey {
            variant,
            map: &mut map,
        })?;
        if let Some(second) = map.next_key::<String>()? {
            return Err(de::Error::custom(format!(
                "expected {}: an object of one key, got a second key {second:?}",
                T::EXPECTING
            )));
        }
        Ok(value)
    }
}

/// An object of one key read as an externally tagged enum: the key names the variant, its
/// value is the variant's content. Drives the enum's derived `Deserialize` (which asks for an
/// enum), after [`NamedVisitor`] has taken the key.
struct OneKey<'a, A> {
    variant: String,
    map: &'a mut A,
}

impl<'de, A: MapAccess<'de>> Deserializer<'de> for OneKey<'_, A> {
    type Error = A::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, A::Error> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

impl<'de, A: MapAccess<'de>> de::EnumAccess<'de> for OneKey<'_, A> {
    type Error = A::Error;
    type Variant = Self;

    fn variant_seed<V: de::DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, Self), A::Error> {
        let v = seed.deserialize(StrDeserializer::<A::Error>::new(&self.variant))?;
        Ok((v, self))
    }
}

impl<'de, A: MapAccess<'de>> de::VariantAccess<'de> for OneKey<'_, A> {
    type Error = A::Error;

    fn unit_variant(self) -> Result<(), A::Error> {
        // `{"full": null}`, as serde_json reads a unit variant written as an object.
        self.map.next_value::<()>()
    }

    fn newtype_variant_seed<T: de::DeserializeSeed<'de>>(
        self,
        seed: T,
    ) -> Result<T::Value, A::Error> {
        self.map.next_value_seed(seed)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _v: V) -> Result<V::Value, A::Error> {
        Err(de::Error::custom("no tuple variants in a geometry file"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, A::Error> {
        // `{"page_unified": {"heads_per_group": 2}}`: the value is the variant's fields.
        self.map.next_value_seed(StructSeed(fields, v))
    }
}

/// Reads a struct variant's value (an object of its fields) with the derive's visitor.
struct StructSeed<V>(&'static [&'static str], V);

impl<'de, V: Visitor<'de>> de::DeserializeSeed<'de> for StructSeed<V> {
    type Value = V::Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        d.deserialize_struct("", self.0, self.1)
    }
}

/// Keys a Hugging Face `config.json` has and a geometry file never has.
pub(crate) const MODEL_CONFIG_KEYS: [&str; 6] = [
    "model_type",
    "architectures",
    "num_hidden_layers",
    "text_config",
    "hidden_size",
    "num_attention_heads",
];

/// What a file that is not a geometry file looks like from the top: whether it names a
/// `schema`, which model-config keys it has, and its `model_type` when that is text. Read
/// only after the geometry model refused the file; every value is skipped unread
/// ([`IgnoredAny`]).
#[derive(Default)]
pub(crate) struct TopLevelKeys {
    pub has_schema: bool,
    pub config_keys: Vec<&'static str>,
    pub model_type: Option<String>,
}

impl<'de> Deserialize<'de> for TopLevelKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(TopLevelVisitor)
    }
}

struct TopLevelVisitor;

impl<'de> Visitor<'de> for TopLevelVisitor {
    type Value = TopLevelKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TopLevelKeys, A::Error> {
        let mut out = TopLevelKeys::default();
        while let Some(key) = map.next_key::<String>()? {
            if key == "schema" {
                out.has_schema = true;
            }
            if key == "model_type" {
                out.model_type = map.next_value::<TextOrOther>()?.0;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
            if let Some(k) = MODEL_CONFIG_KEYS.iter().find(|k| **k == key)
                && !out.config_keys.contains(k)
            {
                out.config_keys.push(k);
            }
        }
        Ok(out)
    }
}

/// Any JSON value, kept when it is a string.
struct TextOrOther(Option<String>);

impl<'de> Deserialize<'de> for TextOrOther {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TextOrOther;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<TextOrOther, E> {
                Ok(TextOrOther(Some(s.to_string())))
            }
            fn visit_bool<E>(self, _: bool) -> Result<TextOrOther, E> {
                Ok(TextOrOther(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<TextOrOther, E> {
                Ok(TextOrOther(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<TextOrOther, E> {
                Ok(TextOrOther(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<TextOrOther, E> {
                Ok(TextOrOther(None))
            }
            fn visit_unit<E>(self) -> Result<TextOrOther, E> {
                Ok(TextOrOther(None))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<TextOrOther, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(TextOrOther(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TextOrOther, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(TextOrOther(None))
            }
        }
        deserializer.deserialize_any(V)
    }
}

/// The whole file, read only from a JSON object (serde's derive would also take an array of
/// the fields in order).
pub(crate) struct TopLevel(pub FileDoc);

impl<'de> Deserialize<'de> for TopLevel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TopLevel;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a geometry file: an object {\"schema\": ..., \"buffers\": [...]}")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<TopLevel, A::Error> {
                FileDoc::deserialize(MapAccessDeserializer::new(map)).map(TopLevel)
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// The buffer and section names of a file the geometry model refused, read leniently (any
/// JSON type anywhere; what is not a name is skipped), so the error's serde path can carry
/// them as every other error of this module does: `buffers[0] (kv).sections[1] (v).shape`.
#[derive(Default)]
pub(crate) struct Names {
    /// Per buffer: its name (when text) and its sections' names.
    pub buffers: Vec<(Option<String>, Vec<Option<String>>)>,
}

impl<'de> Deserialize<'de> for Names {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Top;
        impl<'de> Visitor<'de> for Top {
            type Value = Names;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Names, A::Error> {
                let mut out = Names::default();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "buffers" {
                        let list: Lenient<Vec<Lenient<BufferNames>>> = map.next_value()?;
                        out.buffers = list
                            .0
                            .unwrap_or_default()
                            .into_iter()
                            .map(|b| {
                                let b = b.0.unwrap_or_default();
                                (b.name, b.sections)
                            })
                            .collect();
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(out)
            }
        }
        deserializer.deserialize_map(Top)
    }
}

#[derive(Default)]
struct BufferNames {
    name: Option<String>,
    sections: Vec<Option<String>>,
}

impl<'de> Deserialize<'de> for BufferNames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = BufferNames;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a buffer object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<BufferNames, A::Error> {
                let mut out = BufferNames::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "name" => out.name = map.next_value::<TextOrOther>()?.0,
                        "sections" => {
                            let list: Lenient<Vec<Lenient<SectionName>>> = map.next_value()?;
                            out.sections = list
                                .0
                                .unwrap_or_default()
                                .into_iter()
                                .map(|s| s.0.and_then(|s| s.0))
                                .collect();
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(out)
            }
        }
        deserializer.deserialize_map(V)
    }
}

struct SectionName(Option<String>);

impl<'de> Deserialize<'de> for SectionName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SectionName;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a section object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<SectionName, A::Error> {
                let mut name = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "name" {
                        name = map.next_value::<TextOrOther>()?.0;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(SectionName(name))
            }
        }
        deserializer.deserialize_map(V)
    }
}

/// `T` when the JSON value has `T`'s shape, `None` (the value skipped) otherwise. Only for
/// values whose shape `T` decides from the first token (an object, an array).
struct Lenient<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Lenient<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Lenient<T>, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map)).map(|t| Lenient(Some(t)))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Lenient<T>, A::Error> {
                T::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(|t| Lenient(Some(t)))
            }
            fn visit_str<E>(self, _: &str) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
            fn visit_unit<E>(self) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
        }
        deserializer.deserialize_any(V(PhantomData))
    }
}

impl Names {
    /// `path` (serde_path_to_error's: `buffers[0].sections[1].shape`) with the names after
    /// the indices they belong to: `buffers[0] (kv).sections[1] (v).shape`.
    pub fn decorate(&self, path: &str) -> String {
        let Some(rest) = path.strip_prefix("buffers[") else {
            return path.to_string();
        };
        let Some((index, rest)) = rest.split_once(']') else {
            return path.to_string();
        };
        let Some((name, sections)) = index
            .parse::<usize>()
            .ok()
            .and_then(|i| self.buffers.get(i))
        else {
            return path.to_string();
        };
        let mut out = format!("buffers[{index}]");
        if let Some(n) = name {
            out.push_str(&format!(" ({n})"));
        }
        if let Some(srest) = rest.strip_prefix(".sections[")
            && let Some((k, tail)) = srest.split_once(']')
            && let Some(Some(sname)) = k.parse::<usize>().ok().and_then(|k| sections.get(k))
        {
            out.push_str(&format!(".sections[{k}] ({sname}){tail}"));
            return out;
        }
        out.push_str(rest);
        out
    }
}
