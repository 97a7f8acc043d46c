//! A JSON object that names a key twice is refused, for JSON read as a whole tree
//! (`serde_json::Value`: a model's `config.json`, a trace line), where `serde_json` would keep
//! the last value of a repeated key (`{"num_key_value_heads": 8, "num_key_value_heads": 1}`
//! would silently read as 1). Geometry files do not need this pass: they are read into typed
//! models whose derive refuses a field given twice ([`crate::file`]).
//!
//! The walk records the repeated key itself (never parsed back out of an error message), so a
//! key holding quotes or the words of the message is named exactly.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::GeometryError;

/// The first key named twice in one object of a JSON text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{path}: key {key:?} given twice in one object (the second value would silently win) at line {line} column {column}"
)]
pub struct DuplicateKey {
    /// Path of the object holding it: `buffers[0]`, `text_config`; `.` at the top level.
    pub path: String,
    /// The key, exactly as decoded.
    pub key: String,
    /// Line (from 1) of the second occurrence's end.
    pub line: usize,
    /// Column of the second occurrence's end.
    pub column: usize,
}

/// Walks any JSON value; the first object with a key twice stops the walk, with the key
/// stored in `found`.
struct UniqueKeys<'a> {
    found: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for UniqueKeys<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for UniqueKeys<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq
            .next_element_seed(UniqueKeys { found: self.found })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                *self.found.borrow_mut() = Some(key);
                return Err(de::Error::custom("duplicate key"));
            }
            map.next_value_seed(UniqueKeys { found: self.found })?;
            seen.insert(key);
        }
        Ok(())
    }
}

/// The first key `text` names twice in one object, with the object's path and the
/// position; `Ok` when none repeats. Invalid JSON is left to the reader proper (its message
/// has the line and column), so this returns `Ok` for it.
///
/// # Errors
/// [`DuplicateKey`] for the first repeated key, in text order.
pub fn find_duplicate_key(text: &str) -> Result<(), DuplicateKey> {
    let found = RefCell::new(None);
    let mut json = serde_json::Deserializer::from_str(text);
    let seed = UniqueKeys { found: &found };
    let mut track = serde_path_to_error::Track::new();
    let result = seed.deserialize(serde_path_to_error::Deserializer::new(
        &mut json, &mut track,
    ));
    match (result, found.into_inner()) {
        (Err(e), Some(key)) => Err(DuplicateKey {
            path: track.path().to_string(),
            key,
            line: e.line(),
            column: e.column(),
        }),
        _ => Ok(()),
    }
}

/// [`find_duplicate_key`] as a [`GeometryError`]: the field is the object's path (`json` for
/// the top-level object), the problem names the key and its position. Model configs and trace
/// lines go through it.
///
/// # Errors
/// The first repeated key, as above.
pub fn check_unique_keys(text: &str) -> Result<(), GeometryError> {
    find_duplicate_key(text).map_err(|d| {
        let field = if d.path == "." {
            "json".to_string()
        } else {
            d.path.clone()
        };
        GeometryError::new(
            field,
            format!(
                "key {:?} given twice in one object (the second value would silently win) at line {} column {}",
                d.key, d.line, d.column
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::{check_unique_keys, find_duplicate_key};

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
        assert!(e.starts_with("json: key \"pages\" given twice"), "{e}");
    }

    #[test]
    fn a_key_holding_quotes_or_the_message_words_is_named_exactly() {
        // The key `a"b` (JSON "a\"b") twice: named as decoded, not cut at the quote.
        let d = find_duplicate_key(r#"{"x": {"a\"b": 1, "a\"b": 2}}"#).unwrap_err();
        assert_eq!(d.key, "a\"b");
        assert_eq!(d.path, "x");
        // Column of the second key's end: `{"x": {"a\"b": 1, "a\"b"` is 24 characters.
        assert_eq!((d.line, d.column), (1, 24));
        let d = find_duplicate_key(r#"{"given twice": 1, "given twice": 2}"#).unwrap_err();
        assert_eq!(d.key, "given twice");
        assert_eq!(d.path, ".");
        // Not a repeat: a key equal to another's value, or to a key of another object.
        assert!(find_duplicate_key(r#"{"k": "k", "j": {"k": 1}}"#).is_ok());
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
