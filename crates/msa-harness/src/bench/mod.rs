//! Benchmarks of the GPU stages (what `msa bench` reports): device-timed repeats after warm-up,
//! summarized by median, minimum and 90th percentile, with useful TFLOP/s under the MSA FLOP
//! model. The CPU reference is a correctness tool and is not benchmarked.
//!
//! The JSON output (`msa bench --json`) uses MSA's field names: [`record`] (one line per timed
//! case), [`summary`] (per pattern and stage over a suite), [`environment`] (what ran and was
//! built); [`suite`] reads benchmark selection files.

use msa_plan::flops::FlopModel;

use crate::backend::Backend;
use crate::error::{HarnessError, Result};
use crate::io::CallInputs;
use crate::Stage;

#[cfg(feature = "msa")]
mod cuda;
pub mod environment;
pub mod record;
pub mod suite;
pub mod summary;

pub use environment::Environment;
pub use record::{TimedCase, Weighting};
pub use suite::{Suite, SuiteError, SuiteRow, DEV_SUITE};
pub use summary::{summarize, Summary};

/// How many calls to make of each stage.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub stages: Vec<Stage>,
    /// Untimed calls first (allocator pool, instruction cache, clocks).
    pub warmup: usize,
    /// Timed calls; each one is bracketed by its own pair of events.
    pub iters: usize,
}

impl BenchOptions {
    pub fn check(&self) -> Result<()> {
        if self.iters == 0 || self.stages.is_empty() {
            return Err(HarnessError::EmptyBench);
        }
        match self.stages.iter().find(|s| !Stage::BENCH.contains(s)) {
            Some(&stage) => Err(HarnessError::NotBenchmarked(stage)),
            None => Ok(()),
        }
    }
}

/// The device times of one stage's timed calls, in call order.
#[derive(Debug, Clone)]
pub struct StageTimes {
    pub stage: Stage,
    pub ms: Vec<f64>,
}

/// The `q`-quantile of non-empty `values` by nearest rank (`q` = 0.5: the median; the lower
/// one of an even count).
pub fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

impl StageTimes {
    /// [`quantile`] of the calls' times.
    pub fn quantile(&self, q: f64) -> f64 {
        quantile(&self.ms, q)
    }

    pub fn median(&self) -> f64 {
        self.quantile(0.5)
    }

    pub fn min(&self) -> f64 {
        self.ms.iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// Useful TFLOP/s at the median time.
    pub fn tflops(&self, model: &FlopModel) -> Option<f64> {
        self.stage.flops(model).map(|f| f / self.median() / 1e9)
    }
}

/// Time `opts.stages` on `p` (uploaded once; outputs of earlier stages feed later ones).
#[cfg_attr(not(feature = "msa"), allow(unused_variables))]
pub fn run(backend: &Backend, p: &CallInputs, opts: &BenchOptions) -> Result<Vec<StageTimes>> {
    opts.check()?;
    match backend {
        Backend::Cpu => Err(HarnessError::CpuBench),
        #[cfg(feature = "msa")]
        Backend::Cuda(m) => cuda::run(m, p, opts),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(ms: &[f64]) -> StageTimes {
        StageTimes {
            stage: Stage::Forward,
            ms: ms.to_vec(),
        }
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let t = times(&[5.0, 1.0, 4.0, 2.0, 3.0]);
        assert_eq!(t.median(), 3.0);
        assert_eq!(t.min(), 1.0);
        assert_eq!(t.quantile(0.9), 5.0);
        assert_eq!(t.quantile(0.0), 1.0);
        let even = times(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!(even.median(), 2.0);
        assert_eq!(even.quantile(0.75), 3.0);
    }

    #[test]
    fn tflops_use_the_stage_model() {
        let model = FlopModel {
            fwd: 2e12,
            bwd: 5e12,
            indexer: 1e12,
            kl: 3e12,
        };
        let t = times(&[4.0, 5.0, 6.0]);
        assert_eq!(t.tflops(&model), Some(2e12 / 5.0 / 1e9));
        let bwd = StageTimes {
            stage: Stage::BackwardDeterministic,
            ms: vec![10.0],
        };
        assert_eq!(bwd.tflops(&model), Some(500.0));
        let prep = StageTimes {
            stage: Stage::Prepare,
            ms: vec![1.0],
        };
        assert_eq!(prep.tflops(&model), None);
    }

    #[test]
    fn options_need_iterations_and_stages() {
        let mut o = BenchOptions {
            stages: vec![Stage::Forward],
            warmup: 0,
            iters: 0,
        };
        assert!(matches!(o.check(), Err(HarnessError::EmptyBench)));
        o.iters = 3;
        assert!(o.check().is_ok());
        o.stages.clear();
        assert!(matches!(o.check(), Err(HarnessError::EmptyBench)));
        o.stages = vec![Stage::Forward, Stage::Upload];
        assert!(matches!(
            o.check(),
            Err(HarnessError::NotBenchmarked(Stage::Upload))
        ));
    }

    #[test]
    fn the_cpu_backend_is_refused() {
        let layout = msa_plan::VarlenLayout::documents(&[0, 10]).unwrap();
        let p = CallInputs::generated(
            layout.clone(),
            msa_workloads::Inputs::generate(&layout, 1),
            msa_workloads::make_topk(&layout, msa_workloads::Pattern::Recent16, 1),
        );
        let o = BenchOptions {
            stages: vec![Stage::Forward],
            warmup: 1,
            iters: 1,
        };
        assert!(matches!(
            run(&Backend::Cpu, &p, &o),
            Err(HarnessError::CpuBench)
        ));
    }
}
