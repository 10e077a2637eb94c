//! The facade's error: every failure a user can hit, typed, never a panic.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum MsaError {
    /// A planner rule rejected the input (shapes, cu_seqlens, top-k, schedule limits).
    #[error(transparent)]
    Plan(#[from] msa_plan::PlanError),

    /// Kernels cannot run here: built without `msa`, no driver, no device, unsupported GPU.
    #[error(transparent)]
    Unavailable(#[from] msa_probe::ProbeError),

    /// A kernel launch failed; names the kernel.
    #[error(transparent)]
    Kernel(#[from] msa_kernels::error::KernelError),

    /// A CUDA driver call (allocation, copy, synchronization) failed.
    #[error("CUDA driver call failed: {0}")]
    Driver(String),

    /// A tensor had the wrong length, dtype or shape.
    #[error("{name}: expected {expected}, got {got}")]
    Tensor {
        name: &'static str,
        expected: String,
        got: String,
    },

    /// The device rejected an input after `prepare` validated it there.
    #[error("{0}")]
    Invalid(String),

    #[error(transparent)]
    Io(#[from] std::io::Error),

    /// A safetensors file was missing, malformed or inconsistent.
    #[error(transparent)]
    TensorFile(#[from] crate::io::TensorFileError),

    /// A workload (manifest, case, pattern) could not be built.
    #[error(transparent)]
    Workload(#[from] msa_workloads::WorkloadError),
}

#[cfg(feature = "msa")]
impl From<cudarc::driver::DriverError> for MsaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        MsaError::Driver(e.to_string())
    }
}

pub type Result<T, E = MsaError> = std::result::Result<T, E>;

/// Check that a host or device tensor has `expected` elements.
#[cfg(feature = "msa")]
pub(crate) fn check_len(
    name: &'static str,
    got: usize,
    expected: usize,
    shape: &str,
) -> Result<()> {
    if got != expected {
        return Err(MsaError::Tensor {
            name,
            expected: format!("{expected} elements ({shape})"),
            got: format!("{got} elements"),
        });
    }
    Ok(())
}
