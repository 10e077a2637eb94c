//! Backward pre/postprocess family (`kernels/include/msa/pre_post.h`): delta and the bf16 casts
//! of the gradient accumulators.

use super::{DevicePtr, Stream};
use crate::{sys, KernelError};

/// `delta[t, h] = Σ_d out·dout` (fp32) for `total_q` tokens.
///
/// # Safety
/// `out`, `dout` (bf16 `[T, 64, 128]`) and `delta` (f32 `[T, 64]`) must be 16-byte-aligned
/// device allocations of those sizes, usable from the current context; `stream` a stream of it.
pub unsafe fn delta(
    out: DevicePtr,
    dout: DevicePtr,
    total_q: i32,
    delta: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    KernelError::check(
        "msa_pre_post_delta",
        sys::msa_pre_post_delta(
            out as *const u16,
            dout as *const u16,
            total_q,
            delta as *mut f32,
            stream,
        ),
    )
}

/// `dq = bf16(dq_accum)`, round to nearest even.
///
/// # Safety
/// `dq_accum` (f32) and `dq` (bf16), both `[T, 64, 128]`, must be 16-byte-aligned device
/// allocations usable from the current context; `stream` a stream of it.
pub unsafe fn dq(
    dq_accum: DevicePtr,
    total_q: i32,
    dq: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    KernelError::check(
        "msa_pre_post_dq",
        sys::msa_pre_post_dq(dq_accum as *const f32, total_q, dq as *mut u16, stream),
    )
}

/// `dk, dv = bf16(pool)` gathered from workspace rows to packed key rows.
///
/// # Safety
/// `dk_pool`, `dv_pool` (f32 `[W, 4, 128]`, W = `padded_kv_blocks`·128) and `dk`, `dv` (bf16
/// `[Tk, 4, 128]`) must be 16-byte-aligned device allocations, `varlen`'s block tables device
/// arrays of `padded_kv_blocks` entries, all usable from the current context; `stream` a stream
/// of it.
pub unsafe fn dkv(
    dk_pool: DevicePtr,
    dv_pool: DevicePtr,
    varlen: sys::MsaVarlen,
    dk: DevicePtr,
    dv: DevicePtr,
    stream: Stream,
) -> Result<(), KernelError> {
    KernelError::check(
        "msa_pre_post_dkv",
        sys::msa_pre_post_dkv(
            dk_pool as *const f32,
            dv_pool as *const f32,
            varlen,
            dk as *mut u16,
            dv as *mut u16,
            stream,
        ),
    )
}
