//! msa-torch: msa-rs from PyTorch.
//!
//! The crate is the Rust half of the Python package `msa_torch` (crates/msa-torch/python): the
//! extension module `msa_torch._C`, a PyO3 (abi3, Python >= 3.10) cdylib over [`msa::raw`] with
//! the kernels linked statically. It links neither libtorch nor cudarc: Python allocates every
//! output and workspace with `torch.empty` (torch's caching allocator) and hands the extension
//! plain integers, each tensor as `(data_ptr, numel)` and the stream as
//! `torch.cuda.current_stream(device).cuda_stream`; the extension builds `DevSlice` views of them,
//! checks every length against [`msa::raw::Sizes`] and enqueues the launches with the GIL
//! released. Nothing here allocates device memory or synchronizes, except the explicit
//! validation of a selection.
//!
//! Features (docs/design.md, "PyTorch"):
//! - none: the error classification below (what Python exception an [`MsaError`] becomes),
//!   so `cargo test --workspace` needs neither Python nor nvcc;
//! - `kernels`: links the kernels (`msa/kernels`) and adds [`calls`], the integer-level calls;
//! - `python`: the `_C` module (PyO3); `extension-module`: what maturin builds (no libpython
//!   link), turned on by `pyproject.toml`.

use msa::MsaError;

#[cfg(feature = "kernels")]
pub mod calls;

#[cfg(feature = "python")]
mod python;

/// The Python exception an [`MsaError`] becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// `ValueError`: a shape, length, alignment or integer argument the call rejects before any
    /// launch (`MsaError::Plan`, `MsaError::Tensor`).
    Argument,
    /// `msa_torch.TopKError` (a `ValueError`): the validation of a selection found an invalid
    /// entry; carries `(code, head, query, slot)`.
    TopK,
    /// `RuntimeError`: a CUDA error of a launch or copy, kernels unavailable, or a device
    /// validation word no input explains.
    Cuda,
}

/// The exception kind of `e`.
pub fn error_kind(e: &MsaError) -> ErrorKind {
    match e {
        MsaError::Plan(msa_plan::PlanError::TopK { .. }) | MsaError::TopK(_) => ErrorKind::TopK,
        MsaError::Plan(_) | MsaError::Tensor { .. } => ErrorKind::Argument,
        MsaError::Unavailable(_) | MsaError::Kernel(_) | MsaError::DeviceValidation { .. } => {
            ErrorKind::Cuda
        }
        // The cudarc facade's variants (feature `msa` of `msa`, when another crate of the build
        // turns it on); msa-torch never reaches them.
        #[allow(unreachable_patterns)]
        _ => ErrorKind::Cuda,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use msa::{TopkFault, TopkFaultCode};

    #[test]
    fn errors_map_to_their_python_kinds() {
        let tensor = MsaError::Tensor {
            name: "q",
            expected: "1 bf16 elements".into(),
            got: "2 elements".into(),
        };
        assert_eq!(error_kind(&tensor), ErrorKind::Argument);
        let plan = MsaError::Plan(msa_plan::PlanError::Shape {
            name: "total_rows",
            expected: "3".into(),
            got: "4".into(),
        });
        assert_eq!(error_kind(&plan), ErrorKind::Argument);
        let fault = MsaError::TopK(TopkFault {
            code: TopkFaultCode::Duplicate,
            head: 1,
            query: 2,
            slot: 3,
        });
        assert_eq!(error_kind(&fault), ErrorKind::TopK);
        let validation = MsaError::DeviceValidation {
            word: [9, 0, 0, 0],
            detail: "x".into(),
        };
        assert_eq!(error_kind(&validation), ErrorKind::Cuda);
        let unavailable = MsaError::Unavailable(msa_probe::ProbeError::NoDevice);
        assert_eq!(error_kind(&unavailable), ErrorKind::Cuda);
    }
}
