//! `--json` files: one JSON line per record, written as the work goes, under the rules of
//! `msa_harness::output_path` (an existing file only with `--force`, a regular file only, never
//! an input of the command).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use msa_harness::output_path::{self, OutputError};
use msa_harness::Result;

/// Before any work: `path` may be written, and is none of the command's `inputs`.
pub fn check(path: Option<&Path>, force: bool, inputs: &[&Path]) -> Result<()> {
    let Some(path) = path else {
        return Ok(());
    };
    for input in inputs {
        output_path::refuse_input(path, input)?;
    }
    Ok(output_path::check(path, force)?)
}

/// An open `--json` file (or none), whose I/O errors name it.
pub struct JsonLines(Option<(PathBuf, File)>);

impl JsonLines {
    /// Create (or, with `force`, truncate) the file; [`check`] it before the work first.
    pub fn create(path: Option<&Path>, force: bool) -> Result<Self> {
        let Some(path) = path else {
            return Ok(Self(None));
        };
        let file = output_path::create(path, force)?;
        Ok(Self(Some((path.to_path_buf(), file))))
    }

    /// Append `line` when a file is open.
    pub fn write(&mut self, line: impl FnOnce() -> serde_json::Value) -> Result<()> {
        let Some((path, file)) = &mut self.0 else {
            return Ok(());
        };
        writeln!(file, "{}", line()).map_err(|source| {
            OutputError::Write {
                path: path.clone(),
                source,
            }
            .into()
        })
    }
}
