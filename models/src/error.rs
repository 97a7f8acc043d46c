//! The one error type of the crate: every variant names the model, and every field problem
//! names the `config.json` field and its value.

use kvlayout_core::GeometryError;

/// An error reading a config or mapping it to a pool.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Neither a built-in name nor a readable file (a directory without `config.json` says the
    /// path it looked for).
    #[error("model \"{name}\": not a built-in model ({known}) and not a readable file: {reason}")]
    NotFound {
        /// What was asked for.
        name: String,
        /// The built-in names.
        known: String,
        /// The I/O error, or what was looked for.
        reason: String,
    },
    /// The JSON does not parse, lacks a field, or is not a model config (a geometry file).
    #[error("model \"{name}\": {reason}")]
    Parse {
        /// Model name or path.
        name: String,
        /// serde_json's message (field, line, column) or what kind of file was expected.
        reason: String,
    },
    /// A field has a value the mapping cannot use.
    #[error("model \"{name}\": {field}: {problem}")]
    Field {
        /// `config.json` field (`layer_types[3]`, `num_key_value_heads`, ...).
        field: String,
        /// Model name or path.
        name: String,
        /// What is wrong, with the value.
        problem: String,
    },
    /// A field that changes the KV cache but that this crate does not model: refused rather than
    /// dropped.
    #[error(
        "model \"{name}\": {field} = {value}: changes the KV cache ({why}) and is not modelled; refused rather than ignored"
    )]
    Unmodelled {
        /// Model name or path.
        name: String,
        /// The field.
        field: String,
        /// Its value, as JSON.
        value: String,
        /// What it changes.
        why: String,
    },
    /// The resulting geometry is invalid (or overflows).
    #[error("model \"{name}\": {source}")]
    Geometry {
        /// Model name.
        name: String,
        /// The geometry error.
        #[source]
        source: GeometryError,
    },
}

impl ModelError {
    /// A [`ModelError::Field`].
    pub fn field(name: &str, field: impl Into<String>, problem: impl Into<String>) -> ModelError {
        ModelError::Field {
            name: name.to_string(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The `config.json` field the error is about, when there is one.
    pub fn field_name(&self) -> Option<&str> {
        match self {
            ModelError::Field { field, .. } | ModelError::Unmodelled { field, .. } => Some(field),
            _ => None,
        }
    }
}
