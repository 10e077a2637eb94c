//! Prepare family (`kernels/include/msa/prepare.h`): the layout arrays of one packed layout
//! ([`layout`]) and the device-built metadata of one top-k selection ([`metadata`]: validation
//! word, k2q CSR, work list, physical CSR).

use super::{DevicePtr, Stream};
use crate::{sys, KernelError};

/// Derives `out` (fragment_first `[batch]`, query_fragment `[total_q]`, block_key_start and
/// block_key_count `[padded_kv_blocks]`) from the cu_seqlens and the optional fragment_indices on
/// `stream`, without synchronizing (msa_plan::VarlenLayout's rule, word for word).
///
/// # Safety
/// `cu_seqlens_q`, `cu_seqlens_k` must hold `batch + 1` i32 and `fragment_indices` (0 for none)
/// `batch` i32, forming a valid layout whose last entries are `total_q` and `total_k`; every
/// pointer of `out` must be a device allocation of the size `prepare.h` gives it, all usable from
/// the current context, and `stream` a stream of it.
// One argument per parameter of the C launcher it mirrors.
#[allow(clippy::too_many_arguments)]
pub unsafe fn layout(
    cu_seqlens_q: DevicePtr,
    cu_seqlens_k: DevicePtr,
    fragment_indices: DevicePtr,
    batch: i32,
    total_q: i32,
    total_k: i32,
    padded_kv_blocks: i32,
    out: sys::MsaLayoutOutputs,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract.
    KernelError::check("msa_prepare_layout", unsafe {
        sys::msa_prepare_layout(
            cu_seqlens_q as *const i32,
            cu_seqlens_k as *const i32,
            fragment_indices as *const i32,
            batch,
            total_q,
            total_k,
            padded_kv_blocks,
            out,
            stream,
        )
    })
}

/// Scratch bytes [`metadata`] needs for `varlen`'s sizes (its pointers are not read): host
/// arithmetic, no CUDA call.
pub fn workspace_bytes(varlen: sys::MsaVarlen) -> Result<usize, KernelError> {
    let mut bytes = 0usize;
    // SAFETY: the launcher reads only the size fields of `varlen` and writes `bytes`.
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

/// Scratch bytes [`validate`] needs (`MSA_PREPARE_VALIDATE_WORKSPACE_BYTES`).
pub const VALIDATE_WORKSPACE_BYTES: usize = sys::MSA_PREPARE_VALIDATE_WORKSPACE_BYTES as usize;

/// The validation of [`metadata`] alone: `error_word` `[4]` and `split_counts` `[T, 4]` as
/// [`metadata`] writes them, on `stream`, without synchronizing.
///
/// # Safety
/// `topk` must hold `4·T·16` i32, `error_word` 4 and `split_counts` `4·T` (both may be 0 when
/// T = 0, `topk` too), `workspace` `workspace_bytes` >= [`VALIDATE_WORKSPACE_BYTES`], all device
/// memory usable from the current context, `varlen`'s sizes those of the selection, and `stream`
/// a stream of it.
pub unsafe fn validate(
    topk: DevicePtr,
    varlen: sys::MsaVarlen,
    error_word: *mut i32,
    split_counts: *mut i32,
    workspace: DevicePtr,
    workspace_bytes: usize,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract.
    KernelError::check("msa_prepare_validate", unsafe {
        sys::msa_prepare_validate(
            topk as *const i32,
            varlen,
            error_word,
            split_counts,
            workspace as *mut std::ffi::c_void,
            workspace_bytes,
            stream,
        )
    })
}
