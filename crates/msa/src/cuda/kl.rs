//! The KL backward of the index branch on device buffers: allocations, then [`raw::kl_backward`]
//! (KV-outer over the physical CSR of `prepare`), which checks every size before any launch.

use cudarc::driver::CudaSlice;
use half::bf16;

use super::{CudaMsa, Metadata, Views};
use crate::error::Result;
use crate::raw;

/// Inputs of the KL backward (docs/contract.md §3.2): the attention's q `[T, 64, 128]` and k
/// `[Tk, 4, 128]`, its forward LSE `teacher_lse` `[T, 64]`, the index tensors qi `[T, 4, 128]`
/// and ki `[Tk, 1, 128]`, and `indexer_lse` `[4, T]`, the logsumexp of `qi·ki/√128` over the
/// attention's own token sets (docs/contract.md §3.2, consistency).
pub struct KlInputs<'a> {
    pub q: &'a CudaSlice<bf16>,
    pub k: &'a CudaSlice<bf16>,
    pub teacher_lse: &'a CudaSlice<f32>,
    pub qi: &'a CudaSlice<bf16>,
    pub ki: &'a CudaSlice<bf16>,
    pub indexer_lse: &'a CudaSlice<f32>,
}

impl<'a> KlInputs<'a> {
    /// Views of every input whose guards `g` holds.
    pub(super) fn views<'v>(&self, g: &mut Views<'v>, s: &raw::Sizes) -> Result<raw::KlInputs>
    where
        'a: 'v,
    {
        Ok(raw::KlInputs {
            q: g.read("q", self.q, s.queries)?,
            k: g.read("k", self.k, s.keys)?,
            teacher_lse: g.read("teacher_lse", self.teacher_lse, s.query_heads)?,
            qi: g.read("qi", self.qi, s.index_queries)?,
            ki: g.read("ki", self.ki, s.index_keys)?,
            indexer_lse: g.read("indexer_lse", self.indexer_lse, s.index_lse)?,
        })
    }
}

impl CudaMsa {
    /// The KL backward (docs/contract.md §3.2) of the selection `metadata` was built from: `(dqi,
    /// dki)`, bf16 `[T, 4, 128]` and `[Tk, 1, 128]`, every element written (keys in no token set
    /// get exact zeros). Deterministic: repeated calls are bitwise equal. `metadata` must have been
    /// validated ([`CudaMsa::prepare`], or [`Metadata::check`] after `prepare_unchecked`).
    pub fn kl_backward(
        &self,
        metadata: &Metadata,
        inputs: &KlInputs<'_>,
        loss_coeff: f32,
    ) -> Result<(CudaSlice<bf16>, CudaSlice<bf16>)> {
        // Before any allocation (a poisoned one launches a fill).
        let tables = metadata.tables("kl_backward")?;
        let layout = metadata.layout();
        let shape = layout.shape();
        let s = shape.sizes();
        let mut dqi = self.output::<bf16>(s.index_queries)?;
        let mut dki = self.output::<bf16>(s.index_keys)?;
        let mut workspace = self.scratch(s.kl_workspace_bytes)?;
        {
            let mut g = Views::new(self)?;
            let lay = layout.views(&mut g)?;
            let m = metadata.views(&mut g, tables)?;
            let raw_inputs = inputs.views(&mut g, s)?;
            let mut dqi_v = g.write("dqi", &mut dqi, s.index_queries)?;
            let mut dki_v = g.write("dki", &mut dki, s.index_keys)?;
            let ws = g.workspace("KL workspace", &mut workspace)?;
            // SAFETY: every view is a live allocation of this context (guards held by `g` until
            // the launches are enqueued; the workspace is freed in stream order after them), the
            // stream is the context's, the layout and metadata are this call's.
            unsafe {
                raw::kl_backward(
                    shape,
                    &lay,
                    &m,
                    &raw_inputs,
                    loss_coeff,
                    &mut dqi_v,
                    &mut dki_v,
                    ws,
                    g.stream(),
                )?
            };
        }
        Ok((dqi, dki))
    }
}
