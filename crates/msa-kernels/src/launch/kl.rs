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

/// The KL's inputs, device addresses (T = `varlen.total_q`, Tk = `varlen.total_k`).
#[derive(Debug, Clone, Copy)]
pub struct KlInputs {
    /// bf16 `[T, 64, 128]`, the attention's q.
    pub q: DevicePtr,
    /// bf16 `[Tk, 4, 128]`, the attention's k.
    pub k: DevicePtr,
    /// f32 `[T, 64]`, the attention forward's natural-log LSE.
    pub teacher_lse: DevicePtr,
    /// bf16 `[T, 4, 128]`.
    pub qi: DevicePtr,
    /// bf16 `[Tk, 1, 128]`.
    pub ki: DevicePtr,
    /// f32 `[4, T]`, the logsumexp of the index scores over the same token sets.
    pub indexer_lse: DevicePtr,
    /// i32 `[4, T, 16]`, the validated selection the CSR was built from.
    pub topk: DevicePtr,
}

/// `dqi` (bf16 `[T, 4, 128]`) and `dki` (bf16 `[Tk, 1, 128]`), every element written.
///
/// # Safety
/// Every address must be a 16-byte-aligned device allocation of the documented size in the
/// current context, `csr` must be `prepare`'s physical CSR of `inputs.topk` for this layout,
/// `varlen` must describe live device arrays of that layout, `workspace` must hold
/// `workspace_bytes` (at least [`workspace_bytes`]) and be 256-byte aligned, and `stream` must
/// belong to that context (or be null).
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward(
    inputs: &KlInputs,
    csr: &super::attention::PhysicalCsr,
    varlen: sys::MsaVarlen,
    loss_coeff: f32,
    dqi: DevicePtr,
    dki: DevicePtr,
    workspace: DevicePtr,
    workspace_bytes: usize,
    stream: Stream,
) -> Result<(), KernelError> {
    KernelError::check(
        "msa_kl_backward",
        sys::msa_kl_backward(
            inputs.q as *const u16,
            inputs.k as *const u16,
            inputs.teacher_lse as *const f32,
            inputs.qi as *const u16,
            inputs.ki as *const u16,
            inputs.indexer_lse as *const f32,
            inputs.topk as *const i32,
            csr.row_ptr as *const i32,
            csr.q_indices as *const i32,
            csr.valid as *const i32,
            varlen,
            loss_coeff,
            dqi as *mut u16,
            dki as *mut u16,
            workspace as *mut std::ffi::c_void,
            workspace_bytes,
            stream,
        ),
    )
}
