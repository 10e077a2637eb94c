//! Loader of MSA's real-case manifest (`cp16_192k_cases_v1.jsonl`, docs/contract.md §6.2): one JSON
//! object per line with exactly the keys `case_id`, `cu_seqlens` and `metrics`. Like MSA's
//! `_parse_real_case`, every metric is recomputed from `cu_seqlens` and must match.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Result, WorkloadError};

/// The development subset of the real manifest shipped in `data/cases/` (48 of 1,253 lines).
pub const DEV_MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../data/cases/cp16_192k_dev.jsonl"
);

const CASE_KEYS: [&str; 3] = ["case_id", "cu_seqlens", "metrics"];
const METRIC_KEYS: [&str; 6] = [
    "total_tokens",
    "num_sequences",
    "min_seqlen",
    "median_seqlen",
    "max_seqlen",
    "causal_elements",
];

/// Summary statistics of one pack's document lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metrics {
    pub total_tokens: u64,
    pub num_sequences: u64,
    pub min_seqlen: u64,
    /// For an even count, the floor of the mean of the two middle lengths.
    pub median_seqlen: u64,
    pub max_seqlen: u64,
    /// Σ len·(len+1)/2: the dense causal (query, key) pairs.
    pub causal_elements: u64,
}

impl Metrics {
    /// Recompute the metrics of `cu_seqlens` (at least one document, non-decreasing).
    pub fn from_cu_seqlens(cu_seqlens: &[i32]) -> Self {
        let mut lens: Vec<u64> = cu_seqlens
            .windows(2)
            .map(|w| (w[1] - w[0]) as u64)
            .collect();
        lens.sort_unstable();
        let n = lens.len();
        assert!(n > 0, "cu_seqlens must describe at least one document");
        let median = if n % 2 == 1 {
            lens[n / 2]
        } else {
            (lens[n / 2 - 1] + lens[n / 2]) / 2
        };
        Self {
            total_tokens: lens.iter().sum(),
            num_sequences: n as u64,
            min_seqlen: lens[0],
            median_seqlen: median,
            max_seqlen: lens[n - 1],
            causal_elements: lens.iter().map(|&l| l * (l + 1) / 2).sum(),
        }
    }

    fn fields(&self) -> [u64; 6] {
        [
            self.total_tokens,
            self.num_sequences,
            self.min_seqlen,
            self.median_seqlen,
            self.max_seqlen,
            self.causal_elements,
        ]
    }
}

/// One global pack of the real workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealCase {
    pub case_id: u64,
    /// Document boundaries of the global pack: strictly increasing from 0.
    pub cu_seqlens: Vec<i32>,
    pub metrics: Metrics,
}

/// Read and verify a manifest file.
pub fn load_manifest(path: impl AsRef<Path>) -> Result<Vec<RealCase>> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| WorkloadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_manifest(&text)
}

/// Parse and verify manifest text; blank lines are skipped, case ids must be unique.
pub fn parse_manifest(text: &str) -> Result<Vec<RealCase>> {
    let mut cases = Vec::new();
    let mut seen = HashMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let case = parse_line(i + 1, line)?;
        if let Some(first) = seen.insert(case.case_id, i + 1) {
            return Err(err(
                i + 1,
                "case_id",
                format!("{} repeats line {first}", case.case_id),
            ));
        }
        cases.push(case);
    }
    Ok(cases)
}

fn err(line: usize, field: &str, reason: impl Into<String>) -> WorkloadError {
    WorkloadError::Manifest {
        line,
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// The object's keys must be exactly `keys`; `prefix` names the enclosing field in errors.
fn exact_keys(line: usize, prefix: &str, obj: &Map<String, Value>, keys: &[&str]) -> Result<()> {
    let name = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    if let Some(k) = keys.iter().find(|k| !obj.contains_key(**k)) {
        return Err(err(line, &name(k), "missing"));
    }
    if let Some(k) = obj.keys().find(|k| !keys.contains(&k.as_str())) {
        return Err(err(
            line,
            &name(k),
            format!("unexpected key (expected exactly {})", keys.join(", ")),
        ));
    }
    Ok(())
}

fn as_u64(line: usize, field: &str, v: &Value) -> Result<u64> {
    v.as_u64().ok_or_else(|| {
        err(
            line,
            field,
            format!("must be a non-negative integer, got {v}"),
        )
    })
}

fn parse_line(line: usize, text: &str) -> Result<RealCase> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| err(line, "(line)", format!("not JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| err(line, "(line)", "must be a JSON object"))?;
    exact_keys(line, "", obj, &CASE_KEYS)?;
    let case_id = as_u64(line, "case_id", &obj["case_id"])?;

    let raw = obj["cu_seqlens"]
        .as_array()
        .ok_or_else(|| err(line, "cu_seqlens", "must be an array"))?;
    let mut cu_seqlens = Vec::with_capacity(raw.len());
    for (i, v) in raw.iter().enumerate() {
        let field = format!("cu_seqlens[{i}]");
        let x = v.as_i64().filter(|x| i32::try_from(*x).is_ok());
        cu_seqlens
            .push(x.ok_or_else(|| err(line, &field, format!("must be an int32, got {v}")))? as i32);
    }
    check_cu_seqlens(&cu_seqlens).map_err(|reason| err(line, "cu_seqlens", reason))?;

    let m = obj["metrics"]
        .as_object()
        .ok_or_else(|| err(line, "metrics", "must be an object"))?;
    exact_keys(line, "metrics", m, &METRIC_KEYS)?;
    let mut recorded = [0u64; 6];
    for (slot, key) in recorded.iter_mut().zip(METRIC_KEYS) {
        *slot = as_u64(line, &format!("metrics.{key}"), &m[key])?;
    }
    let metrics = Metrics::from_cu_seqlens(&cu_seqlens);
    for ((key, got), want) in METRIC_KEYS.iter().zip(recorded).zip(metrics.fields()) {
        if got != want {
            return Err(err(
                line,
                &format!("metrics.{key}"),
                format!("recorded {got}, recomputed {want} from cu_seqlens"),
            ));
        }
    }
    Ok(RealCase {
        case_id,
        cu_seqlens,
        metrics,
    })
}

/// Global document boundaries: at least one document, from 0, strictly increasing.
pub(crate) fn check_cu_seqlens(cu: &[i32]) -> std::result::Result<(), String> {
    if cu.len() < 2 {
        return Err(format!(
            "needs at least 2 entries (one document), got {}",
            cu.len()
        ));
    }
    if cu[0] != 0 {
        return Err(format!("must start at 0, got {}", cu[0]));
    }
    match cu.windows(2).position(|w| w[1] <= w[0]) {
        Some(i) => Err(format!(
            "must be strictly increasing; entry {} (= {}) <= entry {i} (= {})",
            i + 1,
            cu[i + 1],
            cu[i]
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(cu: &str, metrics: &str) -> String {
        format!(r#"{{"case_id": 7, "cu_seqlens": {cu}, "metrics": {metrics}}}"#)
    }

    const GOOD_METRICS: &str = r#"{"total_tokens": 10, "num_sequences": 4, "min_seqlen": 1, "median_seqlen": 2, "max_seqlen": 4, "causal_elements": 20}"#;

    fn msg(text: &str) -> String {
        parse_manifest(text).unwrap_err().to_string()
    }

    #[test]
    fn metrics_are_recomputed_with_the_floor_median() {
        // Lengths 1, 2, 3, 4: median floor((2 + 3) / 2) = 2; causal 1 + 3 + 6 + 10 = 20.
        let cases = parse_manifest(&line("[0, 1, 3, 6, 10]", GOOD_METRICS)).unwrap();
        assert_eq!(cases.len(), 1);
        assert_eq!(cases[0].case_id, 7);
        assert_eq!(cases[0].metrics.median_seqlen, 2);
        let odd = Metrics::from_cu_seqlens(&[0, 5, 6, 9]);
        assert_eq!(
            (odd.min_seqlen, odd.median_seqlen, odd.max_seqlen),
            (1, 3, 5)
        );
    }

    #[test]
    fn every_dev_case_verifies() {
        let cases = load_manifest(DEV_MANIFEST).unwrap();
        assert_eq!(cases.len(), 48);
        for c in &cases {
            assert_eq!(c.metrics.total_tokens, 196_608);
            assert_eq!(*c.cu_seqlens.last().unwrap(), 196_608);
        }
    }

    #[test]
    fn wrong_metrics_name_line_and_field() {
        let bad = GOOD_METRICS.replace(r#""median_seqlen": 2"#, r#""median_seqlen": 3"#);
        let text = format!(
            "{}\n\n{}\n",
            line("[0, 1, 3, 6, 10]", GOOD_METRICS).replace("7", "8"),
            line("[0, 1, 3, 6, 10]", &bad)
        );
        assert_eq!(
            msg(&text),
            "manifest line 3, field `metrics.median_seqlen`: recorded 3, recomputed 2 from cu_seqlens"
        );
        let bad = GOOD_METRICS.replace("20}", "21}");
        assert!(msg(&line("[0, 1, 3, 6, 10]", &bad))
            .contains("`metrics.causal_elements`: recorded 21, recomputed 20"));
    }

    #[test]
    fn malformed_lines_are_rejected_with_the_field() {
        assert!(msg(&line("[0, 1, 1, 6, 10]", GOOD_METRICS))
            .contains("line 1, field `cu_seqlens`: must be strictly increasing; entry 2 (= 1) <= entry 1 (= 1)"));
        assert!(msg(&line("[1, 3, 6, 10]", GOOD_METRICS)).contains("must start at 0, got 1"));
        assert!(msg(&line("[0, 1, 3, 6, 4000000000]", GOOD_METRICS))
            .contains("field `cu_seqlens[4]`: must be an int32"));
        assert!(msg(r#"{"case_id": 1, "cu_seqlens": [0, 1]}"#).contains("field `metrics`: missing"));
        let extra = line("[0, 1, 3, 6, 10]", GOOD_METRICS).replace("}}", r#"}, "weight": 1}"#);
        assert!(msg(&extra).contains(
            "field `weight`: unexpected key (expected exactly case_id, cu_seqlens, metrics)"
        ));
        let no_max = GOOD_METRICS.replace(r#", "max_seqlen": 4"#, "");
        assert!(
            msg(&line("[0, 1, 3, 6, 10]", &no_max)).contains("field `metrics.max_seqlen`: missing")
        );
        assert!(
            msg(&line("[0, 1, 3, 6, 10]", GOOD_METRICS).replace("7", "-7"))
                .contains("field `case_id`: must be a non-negative integer")
        );
        assert!(msg("[1, 2]").contains("line 1, field `(line)`: must be a JSON object"));
        assert!(msg("{").contains("not JSON"));
        let twice = format!("{0}\n{0}", line("[0, 1, 3, 6, 10]", GOOD_METRICS));
        assert!(msg(&twice).contains("line 2, field `case_id`: 7 repeats line 1"));
    }

    #[test]
    fn a_missing_file_names_the_path() {
        let e = load_manifest("/nonexistent/cases.jsonl")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cannot read /nonexistent/cases.jsonl"), "{e}");
    }
}
