//! `--json` files: one JSON line per case.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use msa_harness::{HarnessError, Result};

/// An open `--json` file (or none), whose I/O errors name it.
pub struct JsonLines(Option<(PathBuf, File)>);

impl JsonLines {
    pub fn create(path: Option<&Path>) -> Result<Self> {
        let Some(path) = path else {
            return Ok(Self(None));
        };
        let file = File::create(path).map_err(|source| HarnessError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self(Some((path.to_path_buf(), file))))
    }

    /// Append `line` when a file is open.
    pub fn write(&mut self, line: impl FnOnce() -> serde_json::Value) -> Result<()> {
        let Some((path, file)) = &mut self.0 else {
            return Ok(());
        };
        writeln!(file, "{}", line()).map_err(|source| HarnessError::Io {
            path: path.clone(),
            source,
        })
    }
}
