//! Running one call of the training contract on a backend: the CPU reference or the GPU.

use std::time::Instant;

use msa_ref::attention::{self, AttentionInputs};
use msa_ref::compare::to_bf16;
use msa_ref::{indexer, kl};

use crate::error::{MsaError, Result};
use crate::io::{AttentionFile, Outputs};

/// What to compute beyond the forward.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Backward when `dout` is present.
    pub backward: bool,
    /// Indexer forward when `qi`/`ki` are present.
    pub indexer: bool,
    /// KL backward when `qi`/`ki` are present (needs the forward LSE).
    pub kl: bool,
    /// Bitwise-repeatable backward.
    pub deterministic: bool,
    pub loss_coeff: f32,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            backward: true,
            indexer: false,
            kl: false,
            deterministic: false,
            loss_coeff: 1.0,
        }
    }
}

/// Wall time of one stage; GPU stages are synchronized, so this is device time plus launch
/// overhead.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StageTime {
    pub stage: &'static str,
    pub ms: f64,
}

/// Outputs of one call plus per-stage times and the index LSE the KL backward was given.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub outputs: Outputs,
    pub times: Vec<StageTime>,
    pub kl_indexer_lse: Option<Vec<f32>>,
}

pub(crate) fn timed<T>(
    times: &mut Vec<StageTime>,
    stage: &'static str,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let t0 = Instant::now();
    let r = f()?;
    times.push(StageTime {
        stage,
        ms: t0.elapsed().as_secs_f64() * 1e3,
    });
    Ok(r)
}

fn refd(e: msa_ref::RefError) -> MsaError {
    MsaError::Invalid(format!("reference: {e}"))
}

/// The index LSE of the KL backward: logsumexp of qi·ki/√128 over the attention's own token
/// sets (contract §3.2 consistency requirement), from the CPU reference.
pub fn kl_indexer_lse(p: &AttentionFile) -> Result<Vec<f32>> {
    let index = p
        .index
        .as_ref()
        .ok_or_else(|| MsaError::Invalid("the KL backward needs qi and ki".into()))?;
    let ii = indexer::IndexerInputs {
        layout: &p.layout,
        qi: &index.qi,
        ki: &index.ki,
    };
    let all: Vec<usize> = (0..p.layout.total_q()).collect();
    indexer::selection_lse(&ii, &p.topk_indices, &all).map_err(refd)
}

/// The whole call on the CPU reference (`msa-ref`).
pub fn run_cpu(p: &AttentionFile, opts: &RunOptions) -> Result<RunResult> {
    msa_plan::topk::validate_topk(&p.layout, &p.topk_indices)?;
    let inputs = AttentionInputs {
        layout: &p.layout,
        q: &p.q,
        k: &p.k,
        v: &p.v,
        topk: &p.topk_indices,
    };
    let mut times = Vec::new();
    let mut o = Outputs::default();
    let fwd = timed(&mut times, "forward", || {
        attention::forward(&inputs).map_err(refd)
    })?;
    let out = fwd.out_bf16();
    if let (true, Some(dout)) = (opts.backward, &p.dout) {
        let g = timed(&mut times, "backward", || {
            attention::backward(&inputs, dout, &out, &fwd.lse).map_err(refd)
        })?;
        o.dq = Some(to_bf16(&g.dq));
        o.dk = Some(to_bf16(&g.dk));
        o.dv = Some(to_bf16(&g.dv));
    }
    let mut kl_lse = None;
    if let Some(index) = &p.index {
        if opts.indexer {
            let ii = indexer::IndexerInputs {
                layout: &p.layout,
                qi: &index.qi,
                ki: &index.ki,
            };
            let r = timed(&mut times, "indexer", || {
                indexer::forward(&ii).map_err(refd)
            })?;
            o.indexer_topk = Some(r.topk);
            o.indexer_lse = Some(r.lse);
        }
        if opts.kl {
            let ilse = timed(&mut times, "kl_index_lse", || kl_indexer_lse(p))?;
            let g = timed(&mut times, "kl_backward", || {
                kl::kl_backward(
                    &inputs,
                    &fwd.lse,
                    &index.qi,
                    &index.ki,
                    &ilse,
                    opts.loss_coeff,
                )
                .map_err(refd)
            })?;
            o.dqi = Some(to_bf16(&g.dqi));
            o.dki = Some(to_bf16(&g.dki));
            kl_lse = Some(ilse);
        }
    }
    o.out = Some(out);
    o.lse = Some(fwd.lse);
    Ok(RunResult {
        outputs: o,
        times,
        kl_indexer_lse: kl_lse,
    })
}

/// Which backend a command asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    /// The GPU when this build has `msa` and the probe accepts device 0, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

impl std::str::FromStr for BackendChoice {
    type Err = MsaError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            _ => Err(MsaError::Invalid(format!(
                "unknown backend `{s}` (expected auto, cpu or cuda)"
            ))),
        }
    }
}

/// An opened backend.
pub enum Backend {
    Cpu,
    #[cfg(feature = "msa")]
    Cuda(crate::cuda::CudaMsa),
}

impl Backend {
    /// Open the chosen backend; for `Auto`, the second value says why the GPU was not used.
    pub fn open(choice: BackendChoice, poison_outputs: bool) -> Result<(Self, Option<String>)> {
        match choice {
            BackendChoice::Cpu => Ok((Self::Cpu, None)),
            BackendChoice::Cuda => Ok((Self::cuda(poison_outputs)?, None)),
            BackendChoice::Auto => match Self::cuda(poison_outputs) {
                Ok(b) => Ok((b, None)),
                Err(e) => Ok((Self::Cpu, Some(format!("using the CPU reference: {e}")))),
            },
        }
    }

    #[cfg(feature = "msa")]
    fn cuda(poison_outputs: bool) -> Result<Self> {
        Ok(Self::Cuda(
            crate::cuda::CudaMsa::new(0)?.with_poisoned_outputs(poison_outputs),
        ))
    }

    #[cfg(not(feature = "msa"))]
    fn cuda(_poison_outputs: bool) -> Result<Self> {
        Err(msa_probe::ProbeError::NotBuilt.into())
    }

    pub fn name(&self) -> String {
        match self {
            Self::Cpu => "cpu".into(),
            #[cfg(feature = "msa")]
            Self::Cuda(m) => format!("cuda:{} ({})", m.device().ordinal, m.device().name),
        }
    }

    pub fn is_cpu(&self) -> bool {
        matches!(self, Self::Cpu)
    }

    /// One call of the contract on this backend.
    pub fn run(&self, p: &AttentionFile, opts: &RunOptions) -> Result<RunResult> {
        match self {
            Self::Cpu => run_cpu(p, opts),
            #[cfg(feature = "msa")]
            Self::Cuda(m) => crate::cuda::pipeline::run(m, p, opts),
        }
    }
}
