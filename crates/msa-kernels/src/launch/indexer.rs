//! Indexer family (`kernels/include/msa/indexer.h`): the lightning indexer forward (block
//! scores, top-k selection and the LSE of the selected tokens) and the LSE of an attention
//! selection's token sets (the KL backward's `indexer_lse`), both deterministic.

use super::{DevicePtr, Stream};
use crate::{sys, KernelError};

/// Workspace bytes [`forward`] needs for `varlen`'s sizes (its pointers are not read; host
/// arithmetic only, no CUDA call).
pub fn workspace_bytes(varlen: sys::MsaVarlen) -> Result<usize, KernelError> {
    let mut bytes = 0usize;
    // SAFETY: the launcher reads only the size fields of `varlen` and writes `bytes`.
    let code = unsafe { sys::msa_indexer_workspace_bytes(varlen, &mut bytes) };
    KernelError::check("msa_indexer_workspace_bytes", code)?;
    Ok(bytes)
}

/// `params.topk` (i32 `[4, T, 16]`) and `params.lse` (f32 `[4, T]`) of `params.qi` (bf16
/// `[T, 4, 128]`) against `params.ki` (bf16 `[Tk, 1, 128]`), every element written.
///
/// # Safety
/// Every pointer of `params` must be a 16-byte-aligned device allocation of the documented size
/// in the current context, `params.varlen` must describe live device arrays of one layout,
/// `workspace` must hold `workspace_bytes` (at least [`workspace_bytes`]) and be 256-byte
/// aligned, and `stream` must belong to that context (or be null).
pub unsafe fn forward(
    params: &sys::MsaIndexerParams,
    workspace: DevicePtr,
    workspace_bytes: usize,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract; `params` outlives the call.
    KernelError::check("msa_indexer_forward", unsafe {
        sys::msa_indexer_forward(
            params,
            workspace as *mut std::ffi::c_void,
            workspace_bytes,
            stream,
        )
    })
}

/// `lse` (f32 `[4, T]`, written in full) of `qi` (bf16 `[T, 4, 128]`) against `ki` (bf16
/// `[Tk, 1, 128]`) over the token sets of the attention selection `topk` (i32 `[4, T, 16]`): the
/// `indexer_lse` input of the KL backward.
///
/// # Safety
/// Every address must be a 16-byte-aligned device allocation of the documented size in the
/// current context, `varlen` must describe live device arrays of one layout, and `stream` must
/// belong to that context (or be null).
pub unsafe fn selection_lse(
    qi: DevicePtr,
    ki: DevicePtr,
    topk: DevicePtr,
    varlen: sys::MsaVarlen,
    lse: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds the contract above, which is the launcher's.
    let code = unsafe {
        sys::msa_indexer_selection_lse(
            qi as *const u16,
            ki as *const u16,
            topk as *const i32,
            varlen,
            lse as *mut f32,
            stream,
        )
    };
    KernelError::check("msa_indexer_selection_lse", code)
}
