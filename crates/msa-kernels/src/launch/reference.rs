//! Reference family (`kernels/include/msa/reference.h`): naive fp32 GPU references of the
//! attention forward/backward and the KL backward. TEST ORACLES for the GPU suite, not kernels
//! to train with: CUDA cores only, one CTA per output row or key block, written for clarity.
//! They take any selection (invalid entries ignored, repeats counted once) and write fp32.

use super::{DevicePtr, Stream};
use crate::{sys, KernelError};

/// The attention's tensors, device addresses (T = `varlen.total_q`, Tk = `varlen.total_k`).
#[derive(Debug, Clone, Copy)]
pub struct AttentionTensors {
    /// bf16 `[T, 64, 128]`.
    pub q: DevicePtr,
    /// bf16 `[Tk, 4, 128]`.
    pub k: DevicePtr,
    /// bf16 `[Tk, 4, 128]`.
    pub v: DevicePtr,
    /// i32 `[4, T, 16]`, any entries.
    pub topk: DevicePtr,
}

/// `out` (f32 `[T, 64, 128]`) and `lse` (f32 `[T, 64]`), every element written.
///
/// # Safety
/// Every address must be a device allocation of the documented size in the current context,
/// `varlen` must describe live device arrays of that layout, and `stream` must belong to that
/// context (or be null).
pub unsafe fn attention_forward(
    t: &AttentionTensors,
    varlen: sys::MsaVarlen,
    out: DevicePtr,
    lse: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract, which is the launcher's.
    let code = unsafe {
        sys::msa_reference_attention_forward(
            t.q as *const u16,
            t.k as *const u16,
            t.v as *const u16,
            t.topk as *const i32,
            varlen,
            out as *mut f32,
            lse as *mut f32,
            stream,
        )
    };
    KernelError::check("msa_reference_attention_forward", code)
}

/// The backward's extra inputs: `dout` and the forward's `out` (bf16 `[T, 64, 128]`) and `lse`
/// (f32 `[T, 64]`).
#[derive(Debug, Clone, Copy)]
pub struct BackwardInputs {
    pub dout: DevicePtr,
    pub out: DevicePtr,
    pub lse: DevicePtr,
}

/// f32 outputs of [`attention_backward`]: `delta` `[T, 64]` (scratch, written), `dq`
/// `[T, 64, 128]`, `dk` and `dv` `[Tk, 4, 128]`.
#[derive(Debug, Clone, Copy)]
pub struct BackwardOutputs {
    pub delta: DevicePtr,
    pub dq: DevicePtr,
    pub dk: DevicePtr,
    pub dv: DevicePtr,
}

/// dq, dk, dv (f32), every element written (keys in no token set get zeros).
///
/// # Safety
/// As [`attention_forward`], for every address of `t`, `inputs` and `outputs`.
pub unsafe fn attention_backward(
    t: &AttentionTensors,
    inputs: &BackwardInputs,
    varlen: sys::MsaVarlen,
    outputs: &BackwardOutputs,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract, which is the launcher's.
    let code = unsafe {
        sys::msa_reference_attention_backward(
            t.q as *const u16,
            t.k as *const u16,
            t.v as *const u16,
            t.topk as *const i32,
            inputs.dout as *const u16,
            inputs.out as *const u16,
            inputs.lse as *const f32,
            varlen,
            outputs.delta as *mut f32,
            outputs.dq as *mut f32,
            outputs.dk as *mut f32,
            outputs.dv as *mut f32,
            stream,
        )
    };
    KernelError::check("msa_reference_attention_backward", code)
}

/// Inputs of [`kl_backward`], device addresses: q bf16 `[T, 64, 128]`, k bf16 `[Tk, 4, 128]`,
/// teacher_lse f32 `[T, 64]`, qi bf16 `[T, 4, 128]`, ki bf16 `[Tk, 1, 128]`, indexer_lse f32
/// `[4, T]`, topk i32 `[4, T, 16]` (any entries).
#[derive(Debug, Clone, Copy)]
pub struct KlInputs {
    pub q: DevicePtr,
    pub k: DevicePtr,
    pub teacher_lse: DevicePtr,
    pub qi: DevicePtr,
    pub ki: DevicePtr,
    pub indexer_lse: DevicePtr,
    pub topk: DevicePtr,
}

/// dqi (f32 `[T, 4, 128]`) and dki (f32 `[Tk, 1, 128]`) of the KL backward, every element
/// written. `inputs.topk` may hold any entries (invalid ones are ignored).
///
/// # Safety
/// As [`attention_forward`], for every address of `inputs`, `dqi` and `dki`.
pub unsafe fn kl_backward(
    inputs: &KlInputs,
    varlen: sys::MsaVarlen,
    loss_coeff: f32,
    dqi: DevicePtr,
    dki: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract, which is the launcher's.
    let code = unsafe {
        sys::msa_reference_kl_backward(
            inputs.q as *const u16,
            inputs.k as *const u16,
            inputs.teacher_lse as *const f32,
            inputs.qi as *const u16,
            inputs.ki as *const u16,
            inputs.indexer_lse as *const f32,
            inputs.topk as *const i32,
            varlen,
            loss_coeff,
            dqi as *mut f32,
            dki as *mut f32,
            stream,
        )
    };
    KernelError::check("msa_reference_kl_backward", code)
}
