//! Where a config comes from: a built-in name, a file or model directory, or JSON text.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::{Model, ModelError, builtin};

/// Largest `config.json` read (16 MiB; real ones are a few KiB).
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A model config to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A built-in name (case-insensitive), else a path (the CLI's `--model`).
    Name(String),
    /// A `config.json`, or a Hugging Face model directory holding one.
    Path(PathBuf),
    /// `config.json` text, with the name to report.
    Json {
        /// Name used in messages and in `--totals`' `model`.
        name: String,
        /// The JSON.
        text: String,
    },
}

impl ModelSource {
    /// Reads and parses the config.
    ///
    /// # Errors
    ///
    /// ModelError::NotFound when a name is neither built in nor a readable file (a directory
    /// without `config.json` names the path looked for), else the errors of
    /// [`crate::config::parse`].
    pub fn load(&self) -> Result<Model, ModelError> {
        match self {
            ModelSource::Name(name) => match builtin::find(name) {
                Some((n, file, text)) => {
                    Model::parse(n, &format!("configs/{file} (embedded)"), text)
                }
                None => load_path(name, Path::new(name)),
            },
            ModelSource::Path(path) => load_path(&path.display().to_string(), path),
            ModelSource::Json { name, text } => Model::parse(name, "JSON text", text),
        }
    }
}

fn load_path(name: &str, path: &Path) -> Result<Model, ModelError> {
    let not_found = |reason: String| ModelError::NotFound {
        name: name.to_string(),
        known: builtin::names(),
        reason,
    };
    // A Hugging Face model directory holds its config.json.
    let mut file_path = path.to_path_buf();
    if path.is_dir() {
        file_path.push("config.json");
        if !file_path.exists() {
            return Err(not_found(format!(
                "{} is a directory without a config.json (looked for {})",
                path.display(),
                file_path.display()
            )));
        }
    }
    let file = std::fs::File::open(&file_path).map_err(|e| not_found(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| not_found(format!("{}: {e}", file_path.display())))?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(not_found(format!(
            "{} is larger than the {MAX_CONFIG_BYTES}-byte limit for a config.json",
            file_path.display()
        )));
    }
    let text = String::from_utf8(bytes)
        .map_err(|e| not_found(format!("{}: not UTF-8: {e}", file_path.display())))?;
    Model::parse(name, &file_path.display().to_string(), &text)
}
