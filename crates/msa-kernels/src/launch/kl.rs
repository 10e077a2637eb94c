//! KL family (`kernels/include/msa/kl.h`): the KL backward of the index branch (dQI, dKI),
//! KV-outer over the physical CSR of `prepare`, deterministic.

use super::{DevicePtr, Stream};
use crate::{sys, KernelError};

/// Workspace bytes [`backward`] needs for `varlen`'s sizes (its pointers are not read; host
/// arithmetic only, no CUDA call).
pub fn workspace_bytes(varlen: sys::MsaVarlen) -> Result<usize, KernelError> {
    let mut bytes = 0usize;
    // SAFETY: the launcher reads only the size fields of `varlen` and writes `bytes`.
    let code = unsafe { sys::msa_kl_workspace_bytes(varlen, &mut bytes) };
    KernelError::check("msa_kl_workspace_bytes", code)?;
    Ok(bytes)
}

/// `params.dqi` (bf16 `[T, 4, 128]`) and `params.dki` (bf16 `[Tk, 1, 128]`), every element
/// written (T = `varlen.total_q`, Tk = `varlen.total_k`).
///
/// # Safety
/// Every pointer of `params` must be a 16-byte-aligned device allocation of the size `kl.h`
/// gives it in the current context, its physical CSR must be `prepare`'s of `params.topk` for
/// this layout, `params.varlen` must describe live device arrays of that layout, `workspace`
/// must hold `workspace_bytes` (at least [`workspace_bytes`]) and be 256-byte aligned, and
/// `stream` must belong to that context (or be null).
pub unsafe fn backward(
    params: &sys::MsaKlParams,
    workspace: DevicePtr,
    workspace_bytes: usize,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract; `params` outlives the call.
    KernelError::check("msa_kl_backward", unsafe {
        sys::msa_kl_backward(
            params,
            workspace as *mut std::ffi::c_void,
            workspace_bytes,
            stream,
        )
    })
}
