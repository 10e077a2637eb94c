//! The naive fp32 GPU references (`msa_reference_*`): TEST ORACLES, not a way to train. They
//! compute the contract's definitions on CUDA cores, one CTA per output row or key block, share
//! no code with the kernels, take any selection (entries that are negative, future or past the
//! document are ignored, repeats count once) and need no `prepare`. The GPU suite compares
//! every element of the fast kernels' outputs with them at real scale, and checks them in turn
//! against the CPU reference (`msa-ref`) on small and sampled cases.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;
use msa_kernels::launch::kl::KlInputs as KernelKlInputs;
use msa_kernels::launch::reference::{
    self as launch, AttentionTensors, BackwardInputs, BackwardOutputs,
};
use msa_plan::topology::{HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS};

use super::layout::Shape;
use super::{CudaMsa, DeviceLayout, KlInputs};
use crate::error::Result;

/// fp32 forward of [`CudaMsa::reference_forward`]: `out` `[T, 64, 128]`, `lse` `[T, 64]`.
pub struct ReferenceForward {
    pub out: CudaSlice<f32>,
    pub lse: CudaSlice<f32>,
}

/// fp32 gradients of [`CudaMsa::reference_backward`], with the shapes of q, k and v.
pub struct ReferenceGrads {
    pub dq: CudaSlice<f32>,
    pub dk: CudaSlice<f32>,
    pub dv: CudaSlice<f32>,
}

impl CudaMsa {
    fn attention_tensors(
        &self,
        layout: &DeviceLayout,
        q: &CudaSlice<bf16>,
        k: &CudaSlice<bf16>,
        v: &CudaSlice<bf16>,
        topk: &CudaSlice<i32>,
    ) -> Result<AttentionTensors> {
        layout.check("q", q, Shape::Queries)?;
        layout.check("k", k, Shape::Keys)?;
        layout.check("v", v, Shape::Keys)?;
        layout.check("topk_indices", topk, Shape::Selection)?;
        let s = self.stream();
        // One stream orders every launch (event tracking is off): the addresses may outlive
        // the guards.
        Ok(AttentionTensors {
            q: q.device_ptr(s).0,
            k: k.device_ptr(s).0,
            v: v.device_ptr(s).0,
            topk: topk.device_ptr(s).0,
        })
    }

    /// TEST ORACLE: the attention forward of `topk` (`[4, T, 16]`, any entries) by its
    /// definition, in fp32 on CUDA cores. Slow; for the GPU suite's full-tensor checks.
    pub fn reference_forward(
        &self,
        layout: &DeviceLayout,
        q: &CudaSlice<bf16>,
        k: &CudaSlice<bf16>,
        v: &CudaSlice<bf16>,
        topk: &CudaSlice<i32>,
    ) -> Result<ReferenceForward> {
        let tensors = self.attention_tensors(layout, q, k, v, topk)?;
        let t = layout.host().total_q();
        let mut out = self.output::<f32>(t * NUM_Q_HEADS * HEAD_DIM)?;
        let mut lse = self.output::<f32>(t * NUM_Q_HEADS)?;
        let s = self.stream();
        let varlen = layout.varlen(self);
        {
            let (o, _go) = out.device_ptr_mut(s);
            let (l, _gl) = lse.device_ptr_mut(s);
            // SAFETY: every buffer is a live allocation of this context with the length checked
            // above (outputs allocated here), `varlen` points into `layout`'s live arrays and the
            // stream is the context's.
            unsafe { launch::attention_forward(&tensors, varlen, o, l, self.raw_stream())? };
        }
        Ok(ReferenceForward { out, lse })
    }

    /// TEST ORACLE: dq, dk, dv (fp32) of `topk` given the forward's bf16 `out` and its `lse`,
    /// as the kernels are given them, by their definition on CUDA cores. Keys in no token set
    /// get zeros. Slow; for the GPU suite's full-tensor checks.
    #[allow(clippy::too_many_arguments)]
    pub fn reference_backward(
        &self,
        layout: &DeviceLayout,
        q: &CudaSlice<bf16>,
        k: &CudaSlice<bf16>,
        v: &CudaSlice<bf16>,
        topk: &CudaSlice<i32>,
        dout: &CudaSlice<bf16>,
        out: &CudaSlice<bf16>,
        lse: &CudaSlice<f32>,
    ) -> Result<ReferenceGrads> {
        let tensors = self.attention_tensors(layout, q, k, v, topk)?;
        layout.check("dout", dout, Shape::Queries)?;
        layout.check("out", out, Shape::Queries)?;
        layout.check("lse", lse, Shape::QueryHeads)?;
        let h = layout.host();
        let (t, tk) = (h.total_q(), h.total_k());
        let mut delta = self.output::<f32>(t * NUM_Q_HEADS)?;
        let mut dq = self.output::<f32>(t * NUM_Q_HEADS * HEAD_DIM)?;
        let mut dk = self.output::<f32>(tk * NUM_KV_HEADS * HEAD_DIM)?;
        let mut dv = self.output::<f32>(tk * NUM_KV_HEADS * HEAD_DIM)?;
        let s = self.stream();
        let inputs = BackwardInputs {
            dout: dout.device_ptr(s).0,
            out: out.device_ptr(s).0,
            lse: lse.device_ptr(s).0,
        };
        let varlen = layout.varlen(self);
        {
            let (delta_p, _g0) = delta.device_ptr_mut(s);
            let (dq_p, _g1) = dq.device_ptr_mut(s);
            let (dk_p, _g2) = dk.device_ptr_mut(s);
            let (dv_p, _g3) = dv.device_ptr_mut(s);
            let outputs = BackwardOutputs {
                delta: delta_p,
                dq: dq_p,
                dk: dk_p,
                dv: dv_p,
            };
            // SAFETY: as in `reference_forward`; `delta` is scratch of [T, 64] f32, freed in stream
            // order after the launches.
            unsafe {
                launch::attention_backward(&tensors, &inputs, varlen, &outputs, self.raw_stream())?
            };
        }
        Ok(ReferenceGrads { dq, dk, dv })
    }

    /// TEST ORACLE: `(dqi [T, 4, 128], dki [Tk, 1, 128])` (fp32) of the KL backward of `topk`
    /// (`[4, T, 16]`, any entries) by its definition (docs/contract.md §3.2) on CUDA cores.
    pub fn reference_kl_backward(
        &self,
        layout: &DeviceLayout,
        inputs: &KlInputs<'_>,
        topk: &CudaSlice<i32>,
        loss_coeff: f32,
    ) -> Result<(CudaSlice<f32>, CudaSlice<f32>)> {
        layout.check("q", inputs.q, Shape::Queries)?;
        layout.check("k", inputs.k, Shape::Keys)?;
        layout.check("teacher_lse", inputs.teacher_lse, Shape::QueryHeads)?;
        layout.check("qi", inputs.qi, Shape::IndexQueries)?;
        layout.check("ki", inputs.ki, Shape::IndexKeys)?;
        layout.check("indexer_lse", inputs.indexer_lse, Shape::IndexHeads)?;
        layout.check("topk_indices", topk, Shape::Selection)?;
        let h = layout.host();
        let mut dqi = self.output::<f32>(h.total_q() * NUM_INDEX_HEADS * INDEX_DIM)?;
        let mut dki = self.output::<f32>(h.total_k() * INDEX_DIM)?;
        let s = self.stream();
        let ins = KernelKlInputs {
            q: inputs.q.device_ptr(s).0,
            k: inputs.k.device_ptr(s).0,
            teacher_lse: inputs.teacher_lse.device_ptr(s).0,
            qi: inputs.qi.device_ptr(s).0,
            ki: inputs.ki.device_ptr(s).0,
            indexer_lse: inputs.indexer_lse.device_ptr(s).0,
            topk: topk.device_ptr(s).0,
        };
        let varlen = layout.varlen(self);
        {
            let (dqi_p, _g0) = dqi.device_ptr_mut(s);
            let (dki_p, _g1) = dki.device_ptr_mut(s);
            // SAFETY: as in `reference_forward`.
            unsafe {
                launch::kl_backward(&ins, varlen, loss_coeff, dqi_p, dki_p, self.raw_stream())?
            };
        }
        Ok((dqi, dki))
    }
}
