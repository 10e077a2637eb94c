//! The suite summary in MSA's field names, per (pattern, stage) over the timed rows:
//! `summary_useful_tflops` {`rank_mean`, `weighted_aggregate` = Σw·flops / Σw·ms / 1e9} and
//! `summary_runtime_ms` {mean, weighted_mean, p50, p90, p99, max}. A row's runtime is its
//! per-call median (see [`super::StageTimes`]), not MSA's mean of back-to-back calls.

use msa_workloads::Pattern;
use serde::Serialize;

use super::quantile;
use crate::Stage;

/// One stage of one (case, rank) under one pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub pattern: Pattern,
    pub stage: Stage,
    pub weight: f64,
    pub runtime_ms: f64,
    /// `None` for stages the FLOP model does not count (prepare, selection LSE).
    pub useful_flops: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuntimeSummary {
    pub mean: f64,
    pub weighted_mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TflopsSummary {
    /// Mean of the rows' useful TFLOP/s.
    pub rank_mean: f64,
    /// Σw·flops / Σw·ms / 1e9: the weighted suite's useful TFLOP/s.
    pub weighted_aggregate: f64,
}

/// The summary of one (pattern, stage).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub pattern: Pattern,
    pub stage: Stage,
    pub rows: usize,
    pub total_weight: f64,
    pub runtime_ms: RuntimeSummary,
    pub useful_tflops: Option<TflopsSummary>,
}

impl Summary {
    /// The JSON line, in MSA's field names.
    pub fn record(&self) -> serde_json::Value {
        serde_json::json!({
            "record": "summary",
            "pattern": self.pattern.to_string(),
            "stage": self.stage,
            "rows": self.rows,
            "total_weight": self.total_weight,
            "summary_runtime_ms": self.runtime_ms,
            "summary_useful_tflops": self.useful_tflops,
        })
    }
}

/// Summaries per (pattern, stage), in the order each first appears in `rows`.
pub fn summarize(rows: &[Row]) -> Vec<Summary> {
    let mut keys: Vec<(Pattern, Stage)> = Vec::new();
    for r in rows {
        if !keys.contains(&(r.pattern, r.stage)) {
            keys.push((r.pattern, r.stage));
        }
    }
    keys.into_iter()
        .map(|(pattern, stage)| {
            let group: Vec<&Row> = rows
                .iter()
                .filter(|r| (r.pattern, r.stage) == (pattern, stage))
                .collect();
            summary(pattern, stage, &group)
        })
        .collect()
}

fn summary(pattern: Pattern, stage: Stage, rows: &[&Row]) -> Summary {
    let n = rows.len() as f64;
    let total_weight: f64 = rows.iter().map(|r| r.weight).sum();
    let ms: Vec<f64> = rows.iter().map(|r| r.runtime_ms).collect();
    let weighted_ms: f64 = rows.iter().map(|r| r.weight * r.runtime_ms).sum();
    let runtime_ms = RuntimeSummary {
        mean: ms.iter().sum::<f64>() / n,
        weighted_mean: weighted_ms / total_weight,
        p50: quantile(&ms, 0.5),
        p90: quantile(&ms, 0.9),
        p99: quantile(&ms, 0.99),
        max: ms.iter().copied().fold(f64::NEG_INFINITY, f64::max),
    };
    let flops: Option<Vec<f64>> = rows.iter().map(|r| r.useful_flops).collect();
    let useful_tflops = flops.map(|flops| {
        let weighted_flops: f64 = rows.iter().zip(&flops).map(|(r, f)| r.weight * f).sum();
        TflopsSummary {
            rank_mean: rows
                .iter()
                .zip(&flops)
                .map(|(r, f)| f / r.runtime_ms / 1e9)
                .sum::<f64>()
                / n,
            weighted_aggregate: weighted_flops / weighted_ms / 1e9,
        }
    });
    Summary {
        pattern,
        stage,
        rows: rows.len(),
        total_weight,
        runtime_ms,
        useful_tflops,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pattern: Pattern, stage: Stage, weight: f64, ms: f64, flops: Option<f64>) -> Row {
        Row {
            pattern,
            stage,
            weight,
            runtime_ms: ms,
            useful_flops: flops,
        }
    }

    #[test]
    fn the_weighted_aggregate_is_weighted_flops_over_weighted_time() {
        let rows = [
            row(Pattern::Recent16, Stage::Forward, 1.0, 2.0, Some(4e12)),
            row(Pattern::Recent16, Stage::Forward, 3.0, 1.0, Some(1e12)),
            row(Pattern::Random, Stage::Forward, 1.0, 5.0, Some(5e12)),
            row(Pattern::Recent16, Stage::Prepare, 1.0, 0.5, None),
        ];
        let s = summarize(&rows);
        assert_eq!(
            s.iter().map(|s| (s.pattern, s.stage)).collect::<Vec<_>>(),
            [
                (Pattern::Recent16, Stage::Forward),
                (Pattern::Random, Stage::Forward),
                (Pattern::Recent16, Stage::Prepare)
            ]
        );
        let fwd = &s[0];
        assert_eq!((fwd.rows, fwd.total_weight), (2, 4.0));
        let t = fwd.useful_tflops.as_ref().unwrap();
        // (1·4e12 + 3·1e12) / (1·2 + 3·1) / 1e9 = 1400; the rows alone run at 2000 and 1000.
        assert!((t.weighted_aggregate - 1400.0).abs() < 1e-9, "{t:?}");
        assert!((t.rank_mean - 1500.0).abs() < 1e-9, "{t:?}");
        let r = &fwd.runtime_ms;
        assert_eq!((r.mean, r.weighted_mean, r.max), (1.5, 1.25, 2.0));
        assert_eq!((r.p50, r.p90, r.p99), (1.0, 2.0, 2.0));
        assert_eq!(
            s[1].useful_tflops.as_ref().unwrap().weighted_aggregate,
            1000.0
        );
        assert_eq!(s[2].useful_tflops, None);

        let record = fwd.record();
        assert_eq!(record["record"], "summary");
        assert_eq!(record["pattern"], "recent16");
        assert_eq!(record["stage"], "forward");
        assert_eq!(
            record["summary_useful_tflops"]["weighted_aggregate"],
            t.weighted_aggregate
        );
        assert_eq!(record["summary_runtime_ms"]["weighted_mean"], 1.25);
        assert_eq!(
            s[2].record()["summary_useful_tflops"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn equal_weights_give_total_flops_over_total_time() {
        let rows: Vec<Row> = (1..=32)
            .map(|i| {
                let ms = i as f64;
                row(
                    Pattern::Recent16,
                    Stage::Backward,
                    1.0,
                    ms,
                    Some(1e12 * ms.sqrt()),
                )
            })
            .collect();
        let s = &summarize(&rows)[0];
        let flops: f64 = rows.iter().map(|r| r.useful_flops.unwrap()).sum();
        let ms: f64 = rows.iter().map(|r| r.runtime_ms).sum();
        let agg = s.useful_tflops.as_ref().unwrap().weighted_aggregate;
        assert!((agg - flops / ms / 1e9).abs() < 1e-9 * agg);
        assert_eq!(s.runtime_ms.weighted_mean, s.runtime_ms.mean);
    }
}
