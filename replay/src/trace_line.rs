//! One trace line read by a typed serde model: no `serde_json::Value` is built.
//!
//! The model is a struct of four fields read by a `visit_map` that refuses what serde's derive
//! with `deny_unknown_fields` refuses, with serde's own errors: an unknown key
//! (`Error::unknown_field`), a key given twice (`Error::duplicate_field`: the second value would
//! otherwise silently win), a value of the wrong type. The field and the problem are recorded
//! as they are found (the key as read, so a key with a quote in it is named whole), never
//! parsed back out of an error's text; `serde_path_to_error` names the path of anything else.

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// The four fields of a trace line.
const FIELDS: &[&str] = &["timestamp", "input_length", "output_length", "hash_ids"];

/// A trace line's fields, as read (each checked for its type; the rules between them are the
/// caller's).
#[derive(Debug, Default)]
pub(crate) struct TraceLine {
    pub timestamp: Option<u64>,
    pub input_length: Option<u64>,
    pub output_length: Option<u64>,
    pub hash_ids: Option<Vec<u64>>,
}

/// Why a line could not be read: the field (a key, or `line`) and what is wrong with it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub field: String,
    pub problem: String,
}

/// Reads `text` (one JSON value) as a trace line.
pub(crate) fn read(text: &str) -> Result<TraceLine, Refusal> {
    let refuse = |field: &str, problem: String| Refusal {
        field: field.to_string(),
        problem,
    };
    // JSON syntax first, over the whole text (nothing built).
    serde_json::from_str::<IgnoredAny>(text)
        .map_err(|e| refuse("line", format!("not JSON: {e}")))?;
    if !text.trim_start().starts_with('{') {
        return Err(refuse("line", "not a JSON object".into()));
    }
    let found = RefCell::new(None);
    let mut json = serde_json::Deserializer::from_str(text);
    let seed = LineSeed { found: &found };
    let mut track = serde_path_to_error::Track::new();
    let line = seed
        .deserialize(serde_path_to_error::Deserializer::new(
            &mut json, &mut track,
        ))
        .map_err(|e| match found.take() {
            Some(Found::Field { field, problem }) => refuse(&field, problem),
            Some(Found::Twice { field }) => refuse(
                &field,
                format!(
                    "key {field:?} given twice in one object (the second value would silently \
                     win) at column {}",
                    e.column()
                ),
            ),
            None => match track.path().to_string().as_str() {
                "." => refuse("line", e.to_string()),
                path => refuse(path, e.to_string()),
            },
        })?;
    Ok(line)
}

/// What the visitors recorded before returning serde's error.
enum Found {
    /// A field's problem, in words.
    Field { field: String, problem: String },
    /// A key given twice (serde's duplicate-field error; its column places it).
    Twice { field: String },
}

struct LineSeed<'a> {
    found: &'a RefCell<Option<Found>>,
}

impl<'de> DeserializeSeed<'de> for LineSeed<'_> {
    type Value = TraceLine;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<TraceLine, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for LineSeed<'_> {
    type Value = TraceLine;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object (timestamp, input_length, output_length, hash_ids)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TraceLine, A::Error> {
        let mut line = TraceLine::default();
        while let Some(key) = map.next_key::<String>()? {
            let record = |found: Found| *self.found.borrow_mut() = Some(found);
            let field = match FIELDS.iter().find(|f| **f == key) {
                Some(f) => *f,
                None => {
                    record(Found::Field {
                        field: key.clone(),
                        problem: "unknown field (not modelled)".into(),
                    });
                    return Err(de::Error::unknown_field(&key, FIELDS));
                }
            };
            let seen = match field {
                "timestamp" => line.timestamp.is_some(),
                "input_length" => line.input_length.is_some(),
                "output_length" => line.output_length.is_some(),
                _ => line.hash_ids.is_some(),
            };
            if seen {
                record(Found::Twice {
                    field: field.to_string(),
                });
                return Err(de::Error::duplicate_field(field));
            }
            let problem = RefCell::new(None);
            let value = match field {
                "hash_ids" => map
                    .next_value_seed(Ids { problem: &problem })
                    .map(|ids| line.hash_ids = Some(ids)),
                _ => map
                    .next_value_seed(Count {
                        problem: &problem,
                        unit: " (tokens or milliseconds)",
                    })
                    .map(|v| {
                        let slot = match field {
                            "timestamp" => &mut line.timestamp,
                            "input_length" => &mut line.input_length,
                            _ => &mut line.output_length,
                        };
                        *slot = Some(v);
                    }),
            };
            if let Err(e) = value {
                if let Some(problem) = problem.take() {
                    record(Found::Field {
                        field: field.to_string(),
                        problem,
                    });
                }
                return Err(e);
            }
        }
        Ok(line)
    }
}

/// What a JSON value is, in words, for a message (the value itself where it is short).
struct Shown(String);

/// A non-negative integer; `unit` follows the words of a refusal (` (tokens or milliseconds)`).
struct Count<'a> {
    problem: &'a RefCell<Option<String>>,
    unit: &'static str,
}

impl Count<'_> {
    fn refuse<E: de::Error>(&self, shown: Shown) -> Result<u64, E> {
        *self.problem.borrow_mut() = Some(format!(
            "{} is not a non-negative integer{}",
            shown.0, self.unit
        ));
        Err(E::custom("not a non-negative integer"))
    }
}

impl<'de> DeserializeSeed<'de> for Count<'_> {
    type Value = u64;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Count<'_> {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a non-negative integer")
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        match u64::try_from(v) {
            Ok(v) => Ok(v),
            Err(_) => self.refuse(Shown(v.to_string())),
        }
    }
    fn visit_u128<E: de::Error>(self, v: u128) -> Result<u64, E> {
        self.refuse(Shown(v.to_string()))
    }
    fn visit_i128<E: de::Error>(self, v: i128) -> Result<u64, E> {
        self.refuse(Shown(v.to_string()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        // As written in JSON: `100.0` stays `100.0` (Display would print `100`, an integer,
        // in a message saying it is not one) and `1e300` stays short.
        self.refuse(Shown(format!("{v:?}")))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<u64, E> {
        self.refuse(Shown(v.to_string()))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
        self.refuse(Shown(format!("the string {v:?}")))
    }
    fn visit_unit<E: de::Error>(self) -> Result<u64, E> {
        self.refuse(Shown("null".into()))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<u64, A::Error> {
        self.refuse(Shown("an array".into()))
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<u64, A::Error> {
        self.refuse(Shown("an object".into()))
    }
}

/// `hash_ids`: an array of non-negative integers.
struct Ids<'a> {
    problem: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for Ids<'_> {
    type Value = Vec<u64>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Ids<'_> {
    type Value = Vec<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of non-negative integers")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
        let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
        let entry = RefCell::new(None);
        loop {
            match seq.next_element_seed(Count {
                problem: &entry,
                unit: "",
            }) {
                Ok(Some(id)) => ids.push(id),
                Ok(None) => return Ok(ids),
                Err(e) => {
                    if let Some(p) = entry.take() {
                        *self.problem.borrow_mut() = Some(format!("entry {}: {p}", ids.len()));
                    }
                    return Err(e);
                }
            }
        }
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Vec<u64>, E> {
        self.not_an_array(&v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Vec<u64>, E> {
        self.not_an_array(&v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Vec<u64>, E> {
        self.not_an_array(&format!("{v:?}"))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Vec<u64>, E> {
        self.not_an_array(&v.to_string())
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<u64>, E> {
        self.not_an_array(&format!("the string {v:?}"))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Vec<u64>, E> {
        self.not_an_array("null")
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Vec<u64>, A::Error> {
        self.not_an_array("an object")
    }
}

impl Ids<'_> {
    fn not_an_array<E: de::Error>(&self, shown: &str) -> Result<Vec<u64>, E> {
        *self.problem.borrow_mut() = Some(format!("{shown} is not an array"));
        Err(E::custom("not an array"))
    }
}
