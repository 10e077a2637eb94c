//! The backward's memory-bound stages around the main kernel (docs/design.md "Backward" steps 1
//! and 4): the delta preprocess and the bf16 casts of the fp32 accumulators. Each checks its
//! buffer sizes against the layout and enqueues one kernel; the backward orchestration calls
//! them, and the GPU suite checks them on their own.

use cudarc::driver::CudaSlice;
use half::bf16;
use msa_kernels::launch;

use super::layout::Shape;
use super::{dptr, CudaMsa, DeviceLayout};
use crate::error::Result;

impl CudaMsa {
    /// `delta[t, h] = Σ_d out[t, h, d]·dout[t, h, d]` in fp32 (`out`, `dout` bf16 `[T, 64, 128]`,
    /// `delta` f32 `[T, 64]`).
    pub fn backward_delta_into(
        &self,
        layout: &DeviceLayout,
        out: &CudaSlice<bf16>,
        dout: &CudaSlice<bf16>,
        delta: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let t = layout.host().total_q();
        layout.check("out", out, Shape::Queries)?;
        layout.check("dout", dout, Shape::Queries)?;
        layout.check("delta", delta, Shape::QueryHeads)?;
        let s = self.stream();
        // SAFETY: sizes checked above (the launcher rejects misaligned pointers).
        unsafe {
            launch::attention::backward_preprocess(
                dptr(out, s),
                dptr(dout, s),
                t as i32,
                dptr(delta, s),
                self.raw_stream(),
            )?
        };
        Ok(())
    }

    /// `dq = bf16(dq_accum)` (round to nearest even), both `[T, 64, 128]`.
    pub fn backward_postprocess_dq_into(
        &self,
        layout: &DeviceLayout,
        dq_accum: &CudaSlice<f32>,
        dq: &mut CudaSlice<bf16>,
    ) -> Result<()> {
        layout.check("dq_accum", dq_accum, Shape::Queries)?;
        layout.check("dq", dq, Shape::Queries)?;
        let s = self.stream();
        // SAFETY: sizes checked above (the launcher rejects misaligned pointers).
        unsafe {
            launch::attention::backward_postprocess_dq(
                dptr(dq_accum, s),
                layout.host().total_q() as i32,
                dptr(dq, s),
                self.raw_stream(),
            )?
        };
        Ok(())
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
        layout.check("dk_pool", dk_pool, Shape::Pool)?;
        layout.check("dv_pool", dv_pool, Shape::Pool)?;
        layout.check("dk", dk, Shape::Keys)?;
        layout.check("dv", dv, Shape::Keys)?;
        let s = self.stream();
        // SAFETY: sizes checked above; the layout's block tables are device arrays of
        // padded_kv_blocks entries (the launcher rejects misaligned pointers).
        unsafe {
            launch::attention::backward_postprocess_dkv(
                dptr(dk_pool, s),
                dptr(dv_pool, s),
                layout.varlen(self),
                dptr(dk, s),
                dptr(dv, s),
                self.raw_stream(),
            )?
        };
        Ok(())
    }
}
