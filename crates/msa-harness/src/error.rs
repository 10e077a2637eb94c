//! The harness's error: what a run, a check or a file can fail on, with the source kept.

use thiserror::Error;

use crate::Stage;

#[derive(Debug, Error)]
pub enum HarnessError {
    /// The library refused the call or the device failed.
    #[error(transparent)]
    Msa(#[from] msa::MsaError),

    /// A planner rule rejected the input (top-k, layout, schedule limits).
    #[error(transparent)]
    Plan(#[from] msa_plan::PlanError),

    /// The CPU reference rejected its inputs.
    #[error("CPU reference: {0}")]
    Reference(#[from] msa_ref::RefError),

    /// A safetensors file was missing, malformed or inconsistent.
    #[error(transparent)]
    TensorFile(#[from] crate::io::TensorFileError),

    /// A workload (manifest, case, pattern) could not be built.
    #[error(transparent)]
    Workload(#[from] msa_workloads::WorkloadError),

    /// A benchmark selection file that cannot be read or is not valid.
    #[error(transparent)]
    Suite(#[from] crate::bench::SuiteError),

    /// A case id or rank that the manifest or the CP split does not have.
    #[error("case {id}: {reason}")]
    Case { id: u64, reason: String },

    /// An output path that may not be written, or a write that failed.
    #[error(transparent)]
    Output(#[from] crate::output_path::OutputError),

    /// Work refused before it starts: it would need more memory than the limit.
    #[error(transparent)]
    Memory(#[from] crate::memory::MemoryError),

    /// A benchmarked stage whose inputs the call does not have.
    #[error("stage `{stage}` needs {tensors} in the inputs")]
    MissingInputs { stage: Stage, tensors: &'static str },

    /// Outputs under check lack what every call produces.
    #[error("the outputs under check have no `{0}`")]
    MissingOutput(&'static str),

    /// Two outputs of different calls (another T or Tk): no element-wise comparison exists.
    #[error(
        "`{tensor}` has {actual} elements under test but {expected} expected: the outputs are of different calls"
    )]
    OutputSizes {
        tensor: &'static str,
        actual: usize,
        expected: usize,
    },

    /// A check coverage the backend cannot have (see `check::plan_for`).
    #[error("check coverage: {0}")]
    CheckCoverage(&'static str),

    #[error("the two outputs share no tensor")]
    NothingToCompare,

    #[error(
        "msa bench times the GPU kernels; the CPU reference is not benchmarked \
         (`msa run --backend cpu` prints its stage times)"
    )]
    CpuBench,

    #[error("a benchmark needs at least one stage and one timed call")]
    EmptyBench,

    #[error("stage `{0}` is not an entry point of the API and is not benchmarked")]
    NotBenchmarked(Stage),

    /// A context-parallel run that cannot be set up (inputs of another pack, the transport).
    #[error("context parallelism: {0}")]
    Cp(String),
}

pub type Result<T, E = HarnessError> = std::result::Result<T, E>;

/// Driver calls the harness makes itself (the benchmark's events) fail as the library's do.
#[cfg(feature = "msa")]
impl From<cudarc::driver::DriverError> for HarnessError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Self::Msa(msa::MsaError::Driver(e))
    }
}
