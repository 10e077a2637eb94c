//! Attention family (`kernels/include/msa/attention.h`): the forward, the atomic backward main
//! kernel, the two kernels of the deterministic backward (dQ query-outer, dK/dV
//! physical-block-outer), and the backward's preprocess (delta) and postprocess (bf16 casts of
//! the fp32 accumulators).
//!
//! The forward and backward kernels take their C parameter struct ([`sys::MsaAttnFwdParams`],
//! [`sys::MsaAttnBwdParams`]: one struct for the three backward kernels, each reading the inputs
//! and its own section). Shapes follow the header (T = `varlen.total_q`, Tk = `varlen.total_k`,
//! P = `varlen.padded_kv_blocks`, W = 128·P). Every pointer must be 16-byte aligned (whole cudarc
//! allocations are 256-byte aligned). The caller checks lengths and validates top-k before
//! launching: the kernels trust both.

use super::{DevicePtr, Stream};
use crate::{sys, KernelError};

/// Scratch bytes [`forward`] needs for this layout (host arithmetic on `varlen.total_q`): the
/// sm_90a path's tile unions.
pub fn forward_workspace_bytes(varlen: sys::MsaVarlen) -> Result<usize, KernelError> {
    let mut bytes = 0usize;
    // SAFETY: the launcher reads only the size fields of `varlen` and writes `bytes`.
    let code = unsafe { sys::msa_attn_forward_workspace_bytes(varlen, &mut bytes) };
    KernelError::check("msa_attn_forward_workspace_bytes", code)?;
    Ok(bytes)
}

/// `out` (bf16 `[T, 64, 128]`) and `lse` (f32 `[T, 64]`) of the sparse attention of q, k, v
/// (bf16) over `topk` (i32 `[4, T, 16]`, validated). Deterministic. On compute capability 9.0
/// the sm_90a kernel runs, using `params.workspace` ([`forward_workspace_bytes`] bytes).
///
/// # Safety
/// Every pointer of `params` must be a device allocation of the documented size in the current
/// context, `params.varlen` must describe live device arrays of one layout, and `stream` must
/// belong to that context (or be null).
pub unsafe fn forward(params: &sys::MsaAttnFwdParams, stream: Stream) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract; `params` outlives the call.
    KernelError::check("msa_attn_forward", unsafe {
        sys::msa_attn_forward(params, stream)
    })
}

/// Scratch bytes [`backward_sm90`] needs for this layout (host arithmetic on `varlen`'s sizes).
pub fn backward_sm90_workspace_bytes(varlen: sys::MsaVarlen) -> Result<usize, KernelError> {
    let mut bytes = 0usize;
    // SAFETY: the launcher reads only the size fields of `varlen` and writes `bytes`.
    let code = unsafe { sys::msa_attn_backward_sm90_workspace_bytes(varlen, &mut bytes) };
    KernelError::check("msa_attn_backward_sm90_workspace_bytes", code)?;
    Ok(bytes)
}

/// dQ, dK, dV (bf16, written in full) by the sm_90a KV-outer backward over prepare's physical
/// CSR; reads the inputs, the dK/dV section's CSR and outputs, `params.dq` and the workspace
/// ([`backward_sm90_workspace_bytes`]). Compute capability 9.0 only (an error elsewhere). Not
/// bitwise repeatable (dQ is reduced in arrival order).
///
/// # Safety
/// As [`forward`] for the fields it reads; the physical CSR must be prepare's of this layout
/// and a validated selection.
pub unsafe fn backward_sm90(
    params: &sys::MsaAttnBwdParams,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract; `params` outlives the call.
    KernelError::check("msa_attn_backward_sm90", unsafe {
        sys::msa_attn_backward_sm90(params, stream)
    })
}

/// Scratch bytes [`backward_sm90_det`] needs for this layout (host arithmetic on `varlen`'s
/// sizes): [`backward_sm90_workspace_bytes`]' and the accumulation order's tables.
pub fn backward_sm90_det_workspace_bytes(varlen: sys::MsaVarlen) -> Result<usize, KernelError> {
    let mut bytes = 0usize;
    // SAFETY: the launcher reads only the size fields of `varlen` and writes `bytes`.
    let code = unsafe { sys::msa_attn_backward_sm90_det_workspace_bytes(varlen, &mut bytes) };
    KernelError::check("msa_attn_backward_sm90_det_workspace_bytes", code)?;
    Ok(bytes)
}

/// [`backward_sm90`] in deterministic mode: every dQ contribution is rounded to its row's
/// power-of-two grid so that the fp32 reduce-adds are exact in any order, and every item of a
/// split dK/dV row stores its part, summed in id order by the epilogue, so dQ, dK, dV are
/// bitwise repeatable on one device; `params.topk` must be set (the grid bounds each row over its selection); workspace
/// [`backward_sm90_det_workspace_bytes`]. Compute capability 9.0 only (an error elsewhere).
///
/// # Safety
/// As [`backward_sm90`].
pub unsafe fn backward_sm90_det(
    params: &sys::MsaAttnBwdParams,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract; `params` outlives the call.
    KernelError::check("msa_attn_backward_sm90_det", unsafe {
        sys::msa_attn_backward_sm90_det(params, stream)
    })
}

/// Accumulates dQ (f32 `dq_accum [T, 64, 128]`, final: the scale is inside dS) and the dK/dV
/// workspace pools (f32 `[W, 4, 128]`) with unordered atomics over the task tables; reads the
/// inputs and the main-kernel section of `params`.
///
/// # Safety
/// As [`forward`] for the fields it reads; the three accumulators must be zeroed (or hold partial
/// sums) and the task tables must come from the task build of this layout and selection.
pub unsafe fn backward_main(
    params: &sys::MsaAttnBwdParams,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract; `params` outlives the call.
    KernelError::check("msa_attn_backward_main", unsafe {
        sys::msa_attn_backward_main(params, stream)
    })
}

/// Deterministic dQ (bf16 `dq [T, 64, 128]`, written in full), query-outer over `topk`; reads
/// the inputs and the dQ section of `params`.
///
/// # Safety
/// As [`forward`] for the fields it reads.
pub unsafe fn backward_dq(
    params: &sys::MsaAttnBwdParams,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract; `params` outlives the call.
    KernelError::check("msa_attn_backward_dq", unsafe {
        sys::msa_attn_backward_dq(params, stream)
    })
}

/// Deterministic dK and dV (bf16 `[Tk, 4, 128]`, every stored key row written), one CTA per
/// (physical block, group) over the physical CSR; reads the inputs and the dK/dV section of
/// `params`.
///
/// # Safety
/// As [`forward`] for the fields it reads; the CSR must come from `prepare` of this layout and
/// selection.
pub unsafe fn backward_dkv(
    params: &sys::MsaAttnBwdParams,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract; `params` outlives the call.
    KernelError::check("msa_attn_backward_dkv", unsafe {
        sys::msa_attn_backward_dkv(params, stream)
    })
}

/// Backward preprocess: `delta[t, h] = Σ_d out·dout` (fp32) for `total_q` tokens.
///
/// # Safety
/// `out`, `dout` (bf16 `[T, 64, 128]`) and `delta` (f32 `[T, 64]`) must be 16-byte-aligned
/// device allocations of those sizes, usable from the current context; `stream` a stream of it.
pub unsafe fn backward_preprocess(
    out: DevicePtr,
    dout: DevicePtr,
    total_q: i32,
    delta: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract.
    KernelError::check("msa_attn_backward_preprocess", unsafe {
        sys::msa_attn_backward_preprocess(
            out as *const u16,
            dout as *const u16,
            total_q,
            delta as *mut f32,
            stream,
        )
    })
}

/// [`backward_preprocess`] that also writes `dout_norm[t, h] = |dout[t, h, :]|₂` (f32 `[T, 64]`).
///
/// # Safety
/// As [`backward_preprocess`]; `dout_norm` like `delta`.
pub unsafe fn backward_preprocess_norm(
    out: DevicePtr,
    dout: DevicePtr,
    total_q: i32,
    delta: DevicePtr,
    dout_norm: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract.
    KernelError::check("msa_attn_backward_preprocess_norm", unsafe {
        sys::msa_attn_backward_preprocess_norm(
            out as *const u16,
            dout as *const u16,
            total_q,
            delta as *mut f32,
            dout_norm as *mut f32,
            stream,
        )
    })
}

/// Backward postprocess of dQ: `dq = bf16(dq_accum)`, round to nearest even.
///
/// # Safety
/// `dq_accum` (f32) and `dq` (bf16), both `[T, 64, 128]`, must be 16-byte-aligned device
/// allocations usable from the current context; `stream` a stream of it.
pub unsafe fn backward_postprocess_dq(
    dq_accum: DevicePtr,
    total_q: i32,
    dq: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract.
    KernelError::check("msa_attn_backward_postprocess_dq", unsafe {
        sys::msa_attn_backward_postprocess_dq(
            dq_accum as *const f32,
            total_q,
            dq as *mut u16,
            stream,
        )
    })
}

/// Backward postprocess of dK/dV: `dk, dv = bf16(pool)` gathered from workspace rows to packed
/// key rows.
///
/// # Safety
/// `dk_pool`, `dv_pool` (f32 `[W, 4, 128]`, W = `padded_kv_blocks`·128) and `dk`, `dv` (bf16
/// `[Tk, 4, 128]`) must be 16-byte-aligned device allocations, `varlen`'s block tables device
/// arrays of `padded_kv_blocks` entries, all usable from the current context; `stream` a stream
/// of it.
pub unsafe fn backward_postprocess_dkv(
    dk_pool: DevicePtr,
    dv_pool: DevicePtr,
    varlen: sys::MsaVarlen,
    dk: DevicePtr,
    dv: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract.
    KernelError::check("msa_attn_backward_postprocess_dkv", unsafe {
        sys::msa_attn_backward_postprocess_dkv(
            dk_pool as *const f32,
            dv_pool as *const f32,
            varlen,
            dk as *mut u16,
            dv as *mut u16,
            stream,
        )
    })
}
