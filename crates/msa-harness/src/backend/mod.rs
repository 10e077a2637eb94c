//! One call of the training contract on a backend: the CPU reference or the GPU.
//!
//! The call sequence (upload, prepare, forward, backward, indexer, selection LSE, KL, download)
//! is written once, in [`run`], over an [`Executor`]: [`CpuReference`] (`cpu.rs`) and
//! `msa::cuda::CudaMsa` (`cuda.rs`, feature `msa`) implement its stages.

mod cpu;
#[cfg(feature = "msa")]
mod cuda;
mod executor;

pub use cpu::CpuReference;
#[cfg(feature = "msa")]
pub use cuda::gpu_reference;
pub(crate) use executor::{call, CallHost};
pub use executor::{run, Attention, Executor, Index, RunOptions, RunResult, StageTime};

use crate::error::Result;
use crate::io::CallInputs;

/// An opened backend.
pub enum Backend {
    Cpu,
    #[cfg(feature = "msa")]
    Cuda(msa::cuda::CudaMsa),
}

impl Backend {
    /// The GPU on device 0. With `poison_outputs` every output buffer is filled with NaN or a
    /// sentinel first, so an element a kernel forgot to write fails its check.
    #[cfg(feature = "msa")]
    pub fn cuda(poison_outputs: bool) -> Result<Self> {
        Ok(Self::Cuda(
            msa::cuda::CudaMsa::new(0)?.with_poisoned_outputs(poison_outputs),
        ))
    }

    /// The GPU on device 0; this build has no CUDA backend.
    #[cfg(not(feature = "msa"))]
    pub fn cuda(_poison_outputs: bool) -> Result<Self> {
        Err(msa::MsaError::from(msa_probe::ProbeError::NotBuilt).into())
    }

    /// The GPU when this build has `msa` and the probe accepts device 0, else the CPU with a
    /// note that says why.
    pub fn auto(poison_outputs: bool) -> (Self, Option<String>) {
        match Self::cuda(poison_outputs) {
            Ok(b) => (b, None),
            Err(e) => (Self::Cpu, Some(format!("using the CPU reference: {e}"))),
        }
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
    pub fn run(&self, p: &CallInputs, opts: &RunOptions) -> Result<RunResult> {
        match self {
            Self::Cpu => run(&CpuReference, p, opts),
            #[cfg(feature = "msa")]
            Self::Cuda(m) => run(m, p, opts),
        }
    }
}
