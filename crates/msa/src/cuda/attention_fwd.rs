//! Sparse attention forward on device buffers: shape checks, then `msa_attn_forward` (the sm_90a
//! kernel on Hopper unless [`CudaMsa::with_sm80_kernels`], with its tile-union workspace).

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;
use msa_kernels::sys;

use super::layout::Shape;
use super::{CudaMsa, DeviceLayout};
use crate::error::Result;

/// The forward's inputs: q `[T, 64, 128]`, k and v `[Tk, 4, 128]` (bf16), and the validated
/// top-k `[4, T, 16]` (i32; `prepare` rejects invalid selections before any launch, and the
/// kernel trusts it).
pub(crate) struct ForwardInputs<'a> {
    pub q: &'a CudaSlice<bf16>,
    pub k: &'a CudaSlice<bf16>,
    pub v: &'a CudaSlice<bf16>,
    pub topk: &'a CudaSlice<i32>,
}

/// Enqueues the forward: `out` `[T, 64, 128]` bf16 and `lse` `[T, 64]` f32 (natural log; an
/// empty selection gives out = 0, lse = -inf). Every element of both is written.
pub(crate) fn launch_forward(
    msa: &CudaMsa,
    layout: &DeviceLayout,
    inputs: &ForwardInputs<'_>,
    out: &mut CudaSlice<bf16>,
    lse: &mut CudaSlice<f32>,
) -> Result<()> {
    layout.check("q", inputs.q, Shape::Queries)?;
    layout.check("k", inputs.k, Shape::Keys)?;
    layout.check("v", inputs.v, Shape::Keys)?;
    layout.check("topk_indices", inputs.topk, Shape::Selection)?;
    layout.check("out", out, Shape::Queries)?;
    layout.check("lse", lse, Shape::QueryHeads)?;

    let varlen = layout.varlen(msa);
    let bytes = msa_kernels::launch::attention::forward_workspace_bytes(varlen)?;
    // SAFETY: scratch; the kernels write every word they read.
    let mut workspace = unsafe { msa.stream().alloc::<u8>(bytes.max(1))? };
    let s = msa.stream();
    let (ws, _gw) = workspace.device_ptr_mut(s);
    let (q, _gq) = inputs.q.device_ptr(s);
    let (k, _gk) = inputs.k.device_ptr(s);
    let (v, _gv) = inputs.v.device_ptr(s);
    let (topk, _gt) = inputs.topk.device_ptr(s);
    let (out, _go) = out.device_ptr_mut(s);
    let (lse, _gl) = lse.device_ptr_mut(s);
    let params = sys::MsaAttnFwdParams {
        q: q as *const u16,
        k: k as *const u16,
        v: v as *const u16,
        topk: topk as *const i32,
        varlen,
        out: out as *mut u16,
        lse: lse as *mut f32,
        workspace: ws as *mut std::ffi::c_void,
        workspace_bytes: bytes,
        force_sm80: i32::from(!msa.uses_sm90_kernels()),
    };
    // SAFETY: every buffer is a live allocation of this context with the length checked above
    // (the workspace holds `bytes`; dropping it after the launch is safe: cudarc frees in stream
    // order), `varlen` points into `layout`'s live arrays, and the stream is the context's.
    unsafe { msa_kernels::launch::attention::forward(&params, msa.raw_stream())? };
    Ok(())
}
