//! The library's error: every failure a caller can hit, typed, with its source kept.

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
    #[cfg(feature = "msa")]
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] cudarc::driver::DriverError),

    /// A tensor had the wrong length, dtype or shape.
    #[error("{name}: expected {expected}, got {got}")]
    Tensor {
        name: &'static str,
        expected: String,
        got: String,
    },

    /// `prepare`'s device validation returned a word `(code, head, query, slot)` that the host
    /// rule does not confirm: a kernel or ABI fault, never an input error.
    #[error("device top-k validation returned {word:?}, {detail}")]
    DeviceValidation { word: [i32; 4], detail: String },
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
