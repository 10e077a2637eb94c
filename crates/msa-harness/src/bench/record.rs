//! The JSON line of one timed case, with MSA's per-row field names (`runtime_ms`,
//! `useful_flops`, `useful_tflops`, `weight`, `stratum`, `causal_elements`,
//! `sparse_attention_elements`) beside msa-rs's own (`median_ms`, `min_ms`, `p90_ms`, every
//! call's `ms`), and the rows it adds to the suite summary.

use msa_plan::flops::{causal_elements, sparse_elements, FlopModel};
use msa_plan::VarlenLayout;

use super::summary::Row;
use super::{BenchOptions, StageTimes};
use crate::cases::CaseSpec;

/// How a timed case counts in a suite.
#[derive(Debug, Clone, PartialEq)]
pub struct Weighting {
    /// MSA's `representative_weight`.
    pub weight: f64,
    pub stratum: Option<String>,
    /// The row of the selection file.
    pub bench_id: Option<u64>,
}

impl Default for Weighting {
    /// A case picked by hand: weight 1, no stratum.
    fn default() -> Self {
        Self {
            weight: 1.0,
            stratum: None,
            bench_id: None,
        }
    }
}

/// A timed case: what ran, where, and its stage times.
pub struct TimedCase<'a> {
    pub spec: &'a CaseSpec,
    pub weighting: &'a Weighting,
    pub backend: &'a str,
    pub layout: &'a VarlenLayout,
    pub times: &'a [StageTimes],
}

impl TimedCase<'_> {
    /// The case's JSON line; `runtime_ms` is the median device time of one call.
    pub fn record(&self, opts: &BenchOptions) -> serde_json::Value {
        let model = FlopModel::for_layout(self.layout);
        let stages: Vec<_> = self
            .times
            .iter()
            .map(|t| {
                let flops = t.stage.flops(&model);
                serde_json::json!({
                    "stage": t.stage,
                    "runtime_ms": t.median(),
                    "useful_flops": flops,
                    "useful_tflops": t.tflops(&model),
                    "median_ms": t.median(), "min_ms": t.min(), "p90_ms": t.quantile(0.9),
                    "ms": t.ms,
                })
            })
            .collect();
        let (spec, w) = (self.spec, self.weighting);
        serde_json::json!({
            "record": "case",
            "case": spec.name(), "case_id": spec.case_id, "rank": spec.rank,
            "pattern": spec.pattern.to_string(), "seed": spec.seed,
            "weight": w.weight, "stratum": w.stratum, "bench_id": w.bench_id,
            "backend": self.backend,
            "warmup": opts.warmup, "iters": opts.iters,
            "T": self.layout.total_q(), "Tk": self.layout.total_k(),
            // The documents, so a dense varlen peer can time the same ones (scripts/bench_peers.py).
            "cu_seqlens_q": self.layout.cu_seqlens_q(), "cu_seqlens_k": self.layout.cu_seqlens_k(),
            "fragment_indices": self.layout.fragment_first(),
            "causal_elements": causal_elements(self.layout),
            "sparse_attention_elements": sparse_elements(self.layout),
            "flops": {"fwd": model.fwd, "bwd": model.bwd, "indexer": model.indexer, "kl": model.kl},
            "stages": stages,
        })
    }

    /// One summary row per stage.
    pub fn rows(&self) -> impl Iterator<Item = Row> + '_ {
        let model = FlopModel::for_layout(self.layout);
        self.times.iter().map(move |t| Row {
            pattern: self.spec.pattern,
            stage: t.stage,
            weight: self.weighting.weight,
            runtime_ms: t.median(),
            useful_flops: t.stage.flops(&model),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Stage;
    use msa_workloads::Pattern;

    #[test]
    fn a_case_record_has_msa_field_names_and_keeps_the_medians() {
        let layout = VarlenLayout::documents(&[0, 300, 1000]).unwrap();
        let spec = CaseSpec {
            manifest: "m.jsonl".into(),
            case_id: 7,
            rank: 3,
            pattern: Pattern::Recent16,
            seed: 0,
        };
        let weighting = Weighting {
            weight: 2.5,
            stratum: Some("dev_shape_07".into()),
            bench_id: Some(7),
        };
        let times = [
            StageTimes {
                stage: Stage::Forward,
                ms: vec![3.0, 1.0, 2.0],
            },
            StageTimes {
                stage: Stage::Prepare,
                ms: vec![0.5],
            },
        ];
        let case = TimedCase {
            spec: &spec,
            weighting: &weighting,
            backend: "cuda:0 (test)",
            layout: &layout,
            times: &times,
        };
        let opts = BenchOptions {
            stages: vec![Stage::Forward, Stage::Prepare],
            warmup: 1,
            iters: 3,
        };
        let r = case.record(&opts);
        let model = FlopModel::for_layout(&layout);
        assert_eq!(r["record"], "case");
        assert_eq!(r["case"], "case7/r3/recent16/s0");
        assert_eq!(
            (&r["weight"], &r["stratum"]),
            (&2.5.into(), &"dev_shape_07".into())
        );
        assert_eq!(r["causal_elements"], causal_elements(&layout));
        assert_eq!(r["sparse_attention_elements"], sparse_elements(&layout));
        let fwd = &r["stages"][0];
        assert_eq!(fwd["stage"], "forward");
        assert_eq!(fwd["runtime_ms"], 2.0);
        assert_eq!(fwd["median_ms"], 2.0);
        assert_eq!(fwd["useful_flops"], model.fwd);
        assert_eq!(fwd["useful_tflops"], model.fwd / 2.0 / 1e9);
        assert_eq!(fwd["ms"], serde_json::json!([3.0, 1.0, 2.0]));
        assert_eq!(r["stages"][1]["useful_flops"], serde_json::Value::Null);

        let rows: Vec<Row> = case.rows().collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (rows[0].weight, rows[0].runtime_ms, rows[0].useful_flops),
            (2.5, 2.0, Some(model.fwd))
        );
    }
}
