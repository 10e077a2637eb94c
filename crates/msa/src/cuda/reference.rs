//! The naive fp32 GPU references (`msa_reference_*`): TEST ORACLES, not a way to train. They
//! compute the contract's definitions on CUDA cores, one CTA per output row or key block, share
//! no code with the kernels, take any selection (entries that are negative, future or past the
//! document are ignored, repeats count once) and need no `prepare`. The GPU suite compares
//! every element of the fast kernels' outputs with them at real scale, and checks them in turn
//! against the CPU reference (`msa-ref`) on small and sampled cases.

use cudarc::driver::CudaSlice;
use half::bf16;

use super::attention::attention_views;
use super::{CudaMsa, DeviceLayout, KlInputs, Views};
use crate::error::Result;
use crate::raw;

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
        let shape = layout.shape();
        let s = shape.sizes();
        let mut out = self.output::<f32>(s.queries)?;
        let mut lse = self.output::<f32>(s.query_heads)?;
        {
            let mut g = Views::new(self)?;
            let lay = layout.views(&mut g)?;
            let inputs = raw::ReferenceInputs {
                attention: attention_views(&mut g, q, k, v, s)?,
                topk: g.read("topk_indices", topk, s.selection)?,
            };
            let mut o = g.write("reference out", &mut out, s.queries)?;
            let mut l = g.write("reference lse", &mut lse, s.query_heads)?;
            // SAFETY: every view is a live allocation of this context whose guard `g` holds
            // until the launch is enqueued; the stream is the context's and the layout this
            // shape's.
            unsafe { raw::reference_forward(shape, &lay, &inputs, &mut o, &mut l, g.stream())? };
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
        let shape = layout.shape();
        let s = shape.sizes();
        let mut delta = self.output::<f32>(s.query_heads)?;
        let mut dq = self.output::<f32>(s.queries)?;
        let mut dk = self.output::<f32>(s.keys)?;
        let mut dv = self.output::<f32>(s.keys)?;
        {
            let mut g = Views::new(self)?;
            let lay = layout.views(&mut g)?;
            let inputs = raw::ReferenceInputs {
                attention: attention_views(&mut g, q, k, v, s)?,
                topk: g.read("topk_indices", topk, s.selection)?,
            };
            let extra = raw::ReferenceBackwardInputs {
                dout: g.read("dout", dout, s.queries)?,
                out: g.read("out", out, s.queries)?,
                lse: g.read("lse", lse, s.query_heads)?,
            };
            let mut grads = raw::ReferenceGradients {
                delta: g.write("reference delta", &mut delta, s.query_heads)?,
                dq: g.write("reference dq", &mut dq, s.queries)?,
                dk: g.write("reference dk", &mut dk, s.keys)?,
                dv: g.write("reference dv", &mut dv, s.keys)?,
            };
            // SAFETY: as in `reference_forward`; `delta` is scratch freed in stream order.
            unsafe {
                raw::reference_backward(shape, &lay, &inputs, &extra, &mut grads, g.stream())?
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
        let shape = layout.shape();
        let s = shape.sizes();
        let mut dqi = self.output::<f32>(s.index_queries)?;
        let mut dki = self.output::<f32>(s.index_keys)?;
        {
            let mut g = Views::new(self)?;
            let lay = layout.views(&mut g)?;
            let ins = raw::ReferenceKlInputs {
                kl: inputs.views(&mut g, s)?,
                topk: g.read("topk_indices", topk, s.selection)?,
            };
            let mut q = g.write("reference dqi", &mut dqi, s.index_queries)?;
            let mut k = g.write("reference dki", &mut dki, s.index_keys)?;
            // SAFETY: as in `reference_forward`.
            unsafe {
                raw::reference_kl_backward(
                    shape,
                    &lay,
                    &ins,
                    loss_coeff,
                    &mut q,
                    &mut k,
                    g.stream(),
                )?
            };
        }
        Ok((dqi, dki))
    }
}
