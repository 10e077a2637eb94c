//! Benchmarks of the GPU stages (what `msa bench` reports): device-timed repeats after warm-up,
//! summarized by median, minimum and 90th percentile, with useful TFLOP/s under the MSA FLOP
//! model. The CPU reference is a correctness tool and is not benchmarked.

use std::fmt;
use std::str::FromStr;

use msa_plan::flops::FlopModel;

use crate::backend::Backend;
use crate::error::{MsaError, Result};
use crate::io::AttentionFile;

/// One timed entry point of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `prepare`: selection validation (one host synchronization) and the metadata build.
    Prepare,
    Forward,
    /// Atomic backward: delta, device task build, KV-parallel main kernel, postprocess.
    Backward,
    /// Bitwise-repeatable backward.
    BackwardDeterministic,
    Indexer,
    /// KL backward (dqi, dki); the index-branch LSE it takes is computed once, outside timing.
    Kl,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::Prepare,
        Stage::Forward,
        Stage::Backward,
        Stage::BackwardDeterministic,
        Stage::Indexer,
        Stage::Kl,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Prepare => "prepare",
            Stage::Forward => "forward",
            Stage::Backward => "backward",
            Stage::BackwardDeterministic => "backward_det",
            Stage::Indexer => "indexer",
            Stage::Kl => "kl",
        }
    }

    /// Useful FLOPs of one call (MSA FLOP model); `None` for bookkeeping stages.
    pub fn flops(self, model: &FlopModel) -> Option<f64> {
        match self {
            Stage::Prepare => None,
            Stage::Forward => Some(model.fwd),
            Stage::Backward | Stage::BackwardDeterministic => Some(model.bwd),
            Stage::Indexer => Some(model.indexer),
            Stage::Kl => Some(model.kl),
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Stage {
    type Err = MsaError;
    fn from_str(s: &str) -> Result<Self> {
        Stage::ALL
            .into_iter()
            .find(|st| st.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Stage::ALL.iter().map(|s| s.name()).collect();
                MsaError::Invalid(format!("unknown stage `{s}` ({})", names.join(", ")))
            })
    }
}

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
        if self.iters == 0 {
            return Err(MsaError::Invalid("--iters must be at least 1".into()));
        }
        if self.stages.is_empty() {
            return Err(MsaError::Invalid("no stage to benchmark".into()));
        }
        Ok(())
    }
}

/// The device times of one stage's timed calls, in call order.
#[derive(Debug, Clone)]
pub struct StageTimes {
    pub stage: Stage,
    pub ms: Vec<f64>,
}

impl StageTimes {
    /// The `q`-quantile by nearest rank (`q` = 0.5: the median; the upper one of an even count).
    pub fn quantile(&self, q: f64) -> f64 {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        v[rank - 1]
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
pub fn run(backend: &Backend, p: &AttentionFile, opts: &BenchOptions) -> Result<Vec<StageTimes>> {
    opts.check()?;
    match backend {
        Backend::Cpu => Err(MsaError::Invalid(
            "msa bench times the GPU kernels; the CPU reference is not benchmarked \
             (`msa run --backend cpu` prints its stage times)"
                .into(),
        )),
        #[cfg(feature = "msa")]
        Backend::Cuda(m) => crate::cuda::bench::run(m, p, opts),
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
    fn stage_names_round_trip_and_unknown_ones_are_named() {
        for s in Stage::ALL {
            assert_eq!(s.name().parse::<Stage>().unwrap(), s);
        }
        let e = "fwd".parse::<Stage>().unwrap_err().to_string();
        assert_eq!(
            e,
            "unknown stage `fwd` (prepare, forward, backward, backward_det, indexer, kl)"
        );
    }

    #[test]
    fn options_need_iterations_and_stages() {
        let mut o = BenchOptions {
            stages: vec![Stage::Forward],
            warmup: 0,
            iters: 0,
        };
        assert!(o.check().unwrap_err().to_string().contains("--iters"));
        o.iters = 3;
        o.stages.clear();
        assert!(o.check().is_err());
    }

    #[test]
    fn the_cpu_backend_is_refused() {
        let layout = msa_plan::VarlenLayout::documents(&[0, 10]).unwrap();
        let p = AttentionFile::generated(
            layout.clone(),
            msa_workloads::Inputs::generate(&layout, 1),
            msa_workloads::make_topk(&layout, msa_workloads::Pattern::Recent16, 1),
        );
        let o = BenchOptions {
            stages: vec![Stage::Forward],
            warmup: 1,
            iters: 1,
        };
        let e = run(&Backend::Cpu, &p, &o).unwrap_err().to_string();
        assert!(e.starts_with("msa bench times the GPU kernels"), "{e}");
    }
}
