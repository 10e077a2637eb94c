//! The backward's memory-bound stages around the main kernel (docs/design.md "Backward" steps 1
//! and 4): the delta preprocess and the bf16 casts of the fp32 accumulators, on caller buffers.
//! `raw::backward` runs them inside the backward; the GPU suite checks them on their own here.

use cudarc::driver::CudaSlice;
use half::bf16;

use super::{CudaMsa, DeviceLayout, Views};
use crate::error::Result;
use crate::raw;

impl CudaMsa {
    /// `delta[t, h] = Σ_d out[t, h, d]·dout[t, h, d]` in fp32 (`out`, `dout` bf16 `[T, 64, 128]`,
    /// `delta` f32 `[T, 64]`), and with `dout_norm` also `dout_norm[t, h] = |dout[t, h, :]|₂`
    /// (f32 `[T, 64]`, the same pass).
    pub fn backward_delta_into(
        &self,
        layout: &DeviceLayout,
        out: &CudaSlice<bf16>,
        dout: &CudaSlice<bf16>,
        delta: &mut CudaSlice<f32>,
        dout_norm: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let shape = layout.shape();
        let s = shape.sizes();
        let mut g = Views::new(self)?;
        let out = g.read("out", out, s.queries)?;
        let dout = g.read("dout", dout, s.queries)?;
        let mut delta = g.write("delta", delta, s.query_heads)?;
        let mut norm = dout_norm
            .map(|n| g.write("dout_norm", n, s.query_heads))
            .transpose()?;
        // SAFETY: live allocations of this context, guards held by `g` until the launch is
        // enqueued; the stream is the context's.
        unsafe { raw::backward_preprocess(shape, out, dout, &mut delta, norm.as_mut(), g.stream()) }
    }

    /// `dq = bf16(dq_accum)` (round to nearest even), both `[T, 64, 128]`.
    pub fn backward_postprocess_dq_into(
        &self,
        layout: &DeviceLayout,
        dq_accum: &CudaSlice<f32>,
        dq: &mut CudaSlice<bf16>,
    ) -> Result<()> {
        let shape = layout.shape();
        let s = shape.sizes();
        let mut g = Views::new(self)?;
        let dq_accum = g.read("dq_accum", dq_accum, s.queries)?;
        let mut dq = g.write("dq", dq, s.queries)?;
        // SAFETY: as in `backward_delta_into`.
        unsafe { raw::backward_postprocess_dq(shape, dq_accum, &mut dq, g.stream()) }
    }

    /// `dk, dv = bf16(pool)` (round to nearest even) gathered from the workspace pools
    /// (`[W, 4, 128]` f32, W = padded_kv_blocks·128) to the packed key rows (`[Tk, 4, 128]`).
    pub fn backward_postprocess_dkv_into(
        &self,
        layout: &DeviceLayout,
        dk_pool: &CudaSlice<f32>,
        dv_pool: &CudaSlice<f32>,
        dk: &mut CudaSlice<bf16>,
        dv: &mut CudaSlice<bf16>,
    ) -> Result<()> {
        let shape = layout.shape();
        let s = shape.sizes();
        let mut g = Views::new(self)?;
        let lay = layout.views(&mut g)?;
        let dk_pool = g.read("dk_pool", dk_pool, s.pool)?;
        let dv_pool = g.read("dv_pool", dv_pool, s.pool)?;
        let mut dk = g.write("dk", dk, s.keys)?;
        let mut dv = g.write("dv", dv, s.keys)?;
        // SAFETY: as in `backward_delta_into`; the layout's block tables are this shape's.
        unsafe {
            raw::backward_postprocess_dkv(
                shape,
                &lay,
                dk_pool,
                dv_pool,
                &mut dk,
                &mut dv,
                g.stream(),
            )
        }
    }
}
