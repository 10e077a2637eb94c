//! Prepare family (`kernels/include/msa/prepare.h`): the device-built metadata of one top-k
//! selection (validation word, k2q CSR, work list, physical CSR).

use super::{DevicePtr, Stream};
use crate::{sys, KernelError};

/// Scratch bytes [`metadata`] needs for `varlen`'s sizes (its pointers are not read).
///
/// # Safety
/// A CUDA context must be current on the calling thread (CUB reads the device's properties).
pub unsafe fn workspace_bytes(varlen: sys::MsaVarlen) -> Result<usize, KernelError> {
    let mut bytes = 0usize;
    // SAFETY: the launcher reads only the size fields of `varlen` and writes `bytes`; the caller
    // made a context current.
    let code = unsafe { sys::msa_prepare_workspace_bytes(varlen, &mut bytes) };
    KernelError::check("msa_prepare_workspace_bytes", code)?;
    Ok(bytes)
}

/// Validates `topk` and builds every tensor of `out` on `stream`, without synchronizing.
///
/// # Safety
/// `topk` must hold `4·T·16` i32, every pointer of `varlen` and `out` must be a device
/// allocation of the size `prepare.h` gives it (T, R, P, B from `varlen`, `work_capacity` rows
/// of `scheduler_metadata`), `workspace` must hold `workspace_bytes`, at least
/// [`workspace_bytes`], all usable from the current context, and `stream` a stream of it.
// One argument per parameter of the C launcher it mirrors.
#[allow(clippy::too_many_arguments)]
pub unsafe fn metadata(
    topk: DevicePtr,
    varlen: sys::MsaVarlen,
    target_q_per_cta: i32,
    work_capacity: i32,
    out: sys::MsaPrepareOutputs,
    workspace: DevicePtr,
    workspace_bytes: usize,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract.
    KernelError::check("msa_prepare_metadata", unsafe {
        sys::msa_prepare_metadata(
            topk as *const i32,
            varlen,
            target_q_per_cta,
            work_capacity,
            out,
            workspace as *mut std::ffi::c_void,
            workspace_bytes,
            stream,
        )
    })
}
