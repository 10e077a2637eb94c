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

    /// The raw layer's explicit validation (`msa::raw::validate_prepare`) found an invalid
    /// top-k entry. (The cudarc facade, which keeps the host layout, reports the planner's own
    /// `PlanError::TopK` with its reason instead.)
    #[error(transparent)]
    TopK(#[from] TopkFault),

    /// A buffer handed to `CudaMsa` belongs to another CUDA context than the `CudaMsa`'s (its
    /// stream-ordering events would be recorded on the wrong stream); rejected before any
    /// launch.
    #[cfg(feature = "msa")]
    #[error("{name}: the buffer belongs to another CUDA context than this CudaMsa's")]
    ForeignContext { name: &'static str },

    /// `op` needs the metadata's CSR tables, and the metadata came from `prepare_forward`,
    /// which validates only; build them with `CudaMsa::build_tables` first. Rejected before any
    /// launch.
    #[cfg(feature = "msa")]
    #[error("{op} needs the metadata's CSR tables: this metadata comes from prepare_forward (validation only); call CudaMsa::build_tables first")]
    NoTables { op: &'static str },
}

/// Why a top-k entry is invalid: the codes of prepare's error word (`MSA_TOPK_*` of
/// `kernels/include/msa/abi.h`, mirrored by `msa_plan::topk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopkFaultCode {
    /// A negative entry other than the `-1` padding (code 1).
    Negative,
    /// An id `>= num_blocks` of the query's fragment (code 2).
    OutOfRange,
    /// An existing block after the query's own block (code 3).
    NonCausal,
    /// An id repeated from an earlier slot of the row; the later slot is reported (code 4).
    Duplicate,
}

impl TopkFaultCode {
    /// The code of an error word, `None` for 0 (valid) or an unknown code.
    pub fn from_code(code: i32) -> Option<Self> {
        use msa_plan::topk;
        match code {
            topk::TOPK_NEGATIVE => Some(Self::Negative),
            topk::TOPK_OUT_OF_RANGE => Some(Self::OutOfRange),
            topk::TOPK_NON_CAUSAL => Some(Self::NonCausal),
            topk::TOPK_DUPLICATE => Some(Self::Duplicate),
            _ => None,
        }
    }

    /// The code in the error word.
    pub fn code(self) -> i32 {
        use msa_plan::topk;
        match self {
            Self::Negative => topk::TOPK_NEGATIVE,
            Self::OutOfRange => topk::TOPK_OUT_OF_RANGE,
            Self::NonCausal => topk::TOPK_NON_CAUSAL,
            Self::Duplicate => topk::TOPK_DUPLICATE,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Self::Negative => "negative block id (only -1 marks padding)",
            Self::OutOfRange => "out of range: not below the fragment's key blocks",
            Self::NonCausal => "non-causal: a block after the query's own block",
            Self::Duplicate => "duplicate: the id repeats an earlier slot",
        }
    }
}

/// The first invalid entry of a selection as the device reports it: `topk_indices[head, query,
/// slot]`, the smallest `(head·T + query)·16 + slot` that is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("topk_indices[{head}, {query}, {slot}] is invalid: {} (code {})", .code.reason(), .code.code())]
pub struct TopkFault {
    pub code: TopkFaultCode,
    pub head: usize,
    /// Packed query index.
    pub query: usize,
    pub slot: usize,
}

impl TopkFault {
    /// The device error word `(code, head, query, slot)`.
    pub fn word(&self) -> [i32; 4] {
        [
            self.code.code(),
            self.head as i32,
            self.query as i32,
            self.slot as i32,
        ]
    }
}

pub type Result<T, E = MsaError> = std::result::Result<T, E>;
