//! A JSON object that names a key twice is refused. `serde_json` keeps the last value of a
//! repeated key when it builds a `Value`, so `{"pages": 1024, "pages": 7}` would silently read
//! as 7 pages; geometry text often comes from a peer (a transfer handshake, another engine's
//! dump), where a second value is either a bug or an attack. This pass walks the text once,
//! before it is read, and names the first repeated key with its path.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::GeometryError;

/// Walks any JSON value; an object with a key twice is an error naming the key.
struct UniqueKeys;

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }
    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!(
                    "key {key:?} given twice in one object (the second value would silently win)"
                )));
            }
            map.next_value::<UniqueKeys>()?;
        }
        Ok(UniqueKeys)
    }
}

/// `Ok` when no object in `text` repeats a key; else the error names the object's path (the
/// field; `json` for the top-level object) and the key. Invalid JSON is left to the reader
/// proper (its message has the line and column), so this returns `Ok` for it. Geometry files,
/// model configs and trace lines go through it.
pub fn check_unique_keys(text: &str) -> Result<(), GeometryError> {
    let mut json = serde_json::Deserializer::from_str(text);
    match serde_path_to_error::deserialize::<_, UniqueKeys>(&mut json) {
        Ok(_) => Ok(()),
        Err(e) if e.inner().to_string().contains("given twice") => {
            let path = e.path().to_string();
            let field = if path == "." {
                "json".to_string()
            } else {
                path
            };
            let message = e.inner().to_string();
            // serde_json appends " at line L column C"; keep it: it locates the repeat.
            Err(GeometryError::new(field, message))
        }
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::check_unique_keys;

    #[test]
    fn a_repeated_key_is_refused_naming_the_path_and_key() {
        let e = check_unique_keys(r#"{"pages": 1024, "buffers": [{"layers": 61, "layers": 1}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("buffers[0]"), "{e}");
        assert!(e.contains("\"layers\" given twice"), "{e}");
        let e = check_unique_keys(r#"{"pages": 1024, "pages": 7}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"pages\" given twice"), "{e}");
    }

    #[test]
    fn equal_keys_in_different_objects_and_invalid_json_pass_this_pass() {
        assert!(
            check_unique_keys(r#"{"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 1}, {"k": 2}]}"#)
                .is_ok()
        );
        assert!(check_unique_keys("{not json").is_ok());
    }
}
