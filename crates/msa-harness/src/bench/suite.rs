//! Benchmark selection files: weighted (case, rank) rows of a manifest, as MSA's benchmark
//! suites. `data/cases/dev_bench.json` ([`DEV_SUITE`]) is the development benchmark: 32 rows of
//! the development manifest, stratified by causal elements.
//!
//! Format: `{"description": "...", "manifest": "NAME.jsonl", "cases": [{"bench_id": 0,
//! "case_id": 434, "rank": 0, "weight": 1, "stratum": "dev_shape_00", ...}, ...]}`; the manifest
//! is found beside the selection file, other keys of a row are informative.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use msa_workloads::CpConfig;
use serde::Deserialize;
use thiserror::Error;

/// The development benchmark shipped in `data/cases/`.
pub const DEV_SUITE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/cases/dev_bench.json"
);

/// A selection file that cannot be read or is not a valid selection.
#[derive(Debug, Error)]
pub enum SuiteError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{} is not a benchmark selection: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("{}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
}

/// One weighted (case, rank) of a suite.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct SuiteRow {
    pub bench_id: u64,
    pub case_id: u64,
    pub rank: usize,
    /// MSA's `representative_weight`: the row's share in the weighted aggregate.
    pub weight: f64,
    #[serde(default)]
    pub stratum: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Suite {
    #[serde(default)]
    pub description: Option<String>,
    /// File name of the manifest, beside the selection file.
    pub manifest: String,
    pub cases: Vec<SuiteRow>,
}

impl Suite {
    /// Read and check a selection file.
    pub fn load(path: &Path) -> Result<Self, SuiteError> {
        let text = std::fs::read_to_string(path).map_err(|source| SuiteError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parse and check selection text (`path` names it in errors): at least one row, a plain
    /// manifest file name, unique bench ids and (case, rank) pairs, ranks below the CP size,
    /// finite positive weights.
    pub fn parse(text: &str, path: &Path) -> Result<Self, SuiteError> {
        let suite: Suite = serde_json::from_str(text).map_err(|source| SuiteError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |reason: String| SuiteError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        if Path::new(&suite.manifest).file_name() != Some(suite.manifest.as_ref()) {
            return Err(invalid(format!(
                "manifest `{}` must be a file name (the manifest lies beside the selection)",
                suite.manifest
            )));
        }
        if suite.cases.is_empty() {
            return Err(invalid("no cases".into()));
        }
        let cp_size = CpConfig::default().cp_size;
        let (mut ids, mut pairs) = (HashSet::new(), HashSet::new());
        for row in &suite.cases {
            let at = format!("bench_id {}", row.bench_id);
            if !ids.insert(row.bench_id) {
                return Err(invalid(format!("{at} repeats")));
            }
            if !pairs.insert((row.case_id, row.rank)) {
                return Err(invalid(format!(
                    "{at}: case {} rank {} repeats",
                    row.case_id, row.rank
                )));
            }
            if row.rank >= cp_size {
                return Err(invalid(format!(
                    "{at}: rank {} is out of range (CP size {cp_size})",
                    row.rank
                )));
            }
            if !(row.weight.is_finite() && row.weight > 0.0) {
                return Err(invalid(format!(
                    "{at}: weight {} must be positive",
                    row.weight
                )));
            }
        }
        Ok(suite)
    }

    /// The manifest of a suite read from `suite_path`.
    pub fn manifest_path(&self, suite_path: &Path) -> PathBuf {
        suite_path
            .parent()
            .unwrap_or(Path::new("."))
            .join(&self.manifest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msa_workloads::{load_manifest, DEV_MANIFEST};

    #[test]
    fn the_dev_suite_is_32_rows_of_the_dev_manifest() {
        let path = Path::new(DEV_SUITE);
        let suite = Suite::load(path).unwrap();
        assert_eq!(suite.cases.len(), 32);
        let manifest = suite.manifest_path(path);
        assert_eq!(
            std::fs::canonicalize(&manifest).unwrap(),
            std::fs::canonicalize(DEV_MANIFEST).unwrap()
        );
        // The informative columns agree with the manifest: the rows are the cases they say.
        let raw: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let listed = load_manifest(&manifest).unwrap();
        for (row, raw) in suite.cases.iter().zip(raw["cases"].as_array().unwrap()) {
            let case = listed.iter().find(|c| c.case_id == row.case_id).unwrap();
            assert_eq!(raw["causal_elements"], case.metrics.causal_elements);
            assert_eq!(raw["num_sequences"], case.metrics.num_sequences);
            assert_eq!(row.rank as u64, row.bench_id % 16);
            assert_eq!(row.weight, 1.0);
        }
    }

    fn parse_err(text: &str) -> String {
        Suite::parse(text, Path::new("s.json"))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn bad_selections_are_named() {
        let row = |id: u64, case: u64, rank: usize, weight: f64| {
            format!(r#"{{"bench_id":{id},"case_id":{case},"rank":{rank},"weight":{weight}}}"#)
        };
        let suite =
            |rows: &[String]| format!(r#"{{"manifest":"m.jsonl","cases":[{}]}}"#, rows.join(","));
        assert!(Suite::parse(&suite(&[row(0, 1, 2, 0.5)]), Path::new("s.json")).is_ok());
        assert_eq!(parse_err(&suite(&[])), "s.json: no cases");
        assert_eq!(
            parse_err(&suite(&[row(0, 1, 2, 1.0), row(0, 3, 2, 1.0)])),
            "s.json: bench_id 0 repeats"
        );
        assert_eq!(
            parse_err(&suite(&[row(0, 1, 2, 1.0), row(1, 1, 2, 1.0)])),
            "s.json: bench_id 1: case 1 rank 2 repeats"
        );
        assert_eq!(
            parse_err(&suite(&[row(4, 1, 16, 1.0)])),
            "s.json: bench_id 4: rank 16 is out of range (CP size 16)"
        );
        assert_eq!(
            parse_err(&suite(&[row(4, 1, 0, 0.0)])),
            "s.json: bench_id 4: weight 0 must be positive"
        );
        assert!(parse_err(r#"{"manifest":"../m.jsonl","cases":[]}"#)
            .contains("manifest `../m.jsonl` must be a file name"));
        assert!(parse_err(r#"{"cases":[]}"#)
            .starts_with("s.json is not a benchmark selection: missing field `manifest`"));
    }
}
