//! Attention family (`kernels/include/msa/attention.h`): the forward, the atomic backward main
//! kernel, and the two kernels of the deterministic backward (dQ query-outer, dK/dV
//! physical-block-outer).
//!
//! Tensors are passed as device addresses grouped by role; shapes follow the header (T =
//! `varlen.total_q`, Tk = `varlen.total_k`, P = `varlen.padded_kv_blocks`, W = 128·P). Every
//! address must be 16-byte aligned (whole cudarc allocations are 256-byte aligned). The caller
//! checks lengths and validates top-k before launching: the kernels trust both.

use super::{DevicePtr, Stream};
use crate::{sys, KernelError};

/// Inputs shared by every backward kernel.
#[derive(Debug, Clone, Copy)]
pub struct BackwardInputs {
    /// bf16 `[T, 64, 128]`.
    pub q: DevicePtr,
    /// bf16 `[Tk, 4, 128]`.
    pub k: DevicePtr,
    /// bf16 `[Tk, 4, 128]`.
    pub v: DevicePtr,
    /// bf16 `[T, 64, 128]`.
    pub dout: DevicePtr,
    /// f32 `[T, 64]`, the forward's natural-log LSE.
    pub lse: DevicePtr,
    /// f32 `[T, 64]`, `rowsum(dout · out)`.
    pub delta: DevicePtr,
}

/// The device task tables of the backward task build.
#[derive(Debug, Clone, Copy)]
pub struct TaskTables {
    /// i32 `[cap, 4]` = (0, group, physical kblock, valid slots).
    pub meta: DevicePtr,
    /// i32 `[cap, 8]`: packed query row, -1 past `valid`.
    pub qrows: DevicePtr,
    /// i32 `[cap, 8]`: query position in workspace coordinates.
    pub qpos: DevicePtr,
    /// i32 `[8]` = (num_task_rows, rows_per_cta, num_full_ctas, tail_rows, grid_ctas, num_work,
    /// num_tasks, flags).
    pub desc: DevicePtr,
    /// CTAs to launch (the host-side bound; surplus CTAs exit at once). 0 launches nothing.
    pub grid_launch: i32,
}

/// The physical-block CSR of `prepare`, per group.
#[derive(Debug, Clone, Copy)]
pub struct PhysicalCsr {
    /// i32 `[4, P + 1]`.
    pub row_ptr: DevicePtr,
    /// i32 `[4, T·16]`: packed queries, ascending within a row.
    pub q_indices: DevicePtr,
    /// i32 `[4, T·16]`: `visible_keys | writer_rank << 8`.
    pub valid: DevicePtr,
}

/// `out` (bf16 `[T, 64, 128]`) and `lse` (f32 `[T, 64]`) of the sparse attention of q, k, v
/// (bf16) over `topk` (i32 `[4, T, 16]`, validated). Deterministic.
///
/// # Safety
/// Every address must be a device allocation of the documented size in the current context,
/// `varlen` must describe live device arrays of one layout, and `stream` must belong to that
/// context (or be null).
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward(
    q: DevicePtr,
    k: DevicePtr,
    v: DevicePtr,
    topk: DevicePtr,
    varlen: sys::MsaVarlen,
    out: DevicePtr,
    lse: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    KernelError::check(
        "msa_attn_forward",
        sys::msa_attn_forward(
            q as *const u16,
            k as *const u16,
            v as *const u16,
            topk as *const i32,
            varlen,
            out as *mut u16,
            lse as *mut f32,
            stream,
        ),
    )
}

/// Accumulates dQ (f32 `[T, 64, 128]`, final: the scale is inside dS) and the dK/dV workspace
/// pools (f32 `[W, 4, 128]`) with unordered atomics over the task tables.
///
/// # Safety
/// As [`forward`]; the three accumulators must be zeroed (or hold partial sums) and the task
/// tables must come from the task build of this layout and selection.
pub unsafe fn backward_main(
    inputs: &BackwardInputs,
    tasks: &TaskTables,
    varlen: sys::MsaVarlen,
    dq_accum: DevicePtr,
    dk_pool: DevicePtr,
    dv_pool: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    KernelError::check(
        "msa_attn_backward_main",
        sys::msa_attn_backward_main(
            inputs.q as *const u16,
            inputs.k as *const u16,
            inputs.v as *const u16,
            inputs.dout as *const u16,
            inputs.lse as *const f32,
            inputs.delta as *const f32,
            tasks.meta as *const i32,
            tasks.qrows as *const i32,
            tasks.qpos as *const i32,
            tasks.desc as *const i32,
            tasks.grid_launch,
            varlen,
            dq_accum as *mut f32,
            dk_pool as *mut f32,
            dv_pool as *mut f32,
            stream,
        ),
    )
}

/// Deterministic dQ (bf16 `[T, 64, 128]`, written in full), query-outer over `topk`.
///
/// # Safety
/// As [`forward`].
pub unsafe fn backward_dq(
    inputs: &BackwardInputs,
    topk: DevicePtr,
    varlen: sys::MsaVarlen,
    dq: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    KernelError::check(
        "msa_attn_backward_dq",
        sys::msa_attn_backward_dq(
            inputs.q as *const u16,
            inputs.k as *const u16,
            inputs.v as *const u16,
            inputs.dout as *const u16,
            inputs.lse as *const f32,
            inputs.delta as *const f32,
            topk as *const i32,
            varlen,
            dq as *mut u16,
            stream,
        ),
    )
}

/// Deterministic dK and dV (bf16 `[Tk, 4, 128]`, every stored key row written), one CTA per
/// (physical block, group) over the physical CSR.
///
/// # Safety
/// As [`forward`]; the CSR must come from `prepare` of this layout and selection.
pub unsafe fn backward_dkv(
    inputs: &BackwardInputs,
    csr: &PhysicalCsr,
    varlen: sys::MsaVarlen,
    dk: DevicePtr,
    dv: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    KernelError::check(
        "msa_attn_backward_dkv",
        sys::msa_attn_backward_dkv(
            inputs.q as *const u16,
            inputs.k as *const u16,
            inputs.v as *const u16,
            inputs.dout as *const u16,
            inputs.lse as *const f32,
            inputs.delta as *const f32,
            csr.row_ptr as *const i32,
            csr.q_indices as *const i32,
            csr.valid as *const i32,
            varlen,
            dk as *mut u16,
            dv as *mut u16,
            stream,
        ),
    )
}
