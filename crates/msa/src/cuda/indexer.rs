//! The indexer family on device buffers: the lightning indexer forward
//! ([`raw::indexer_forward`]) and the LSE of an attention selection's token sets
//! ([`raw::selection_lse`]); the raw calls check every size before any launch.

use cudarc::driver::CudaSlice;
use half::bf16;

use super::{CudaMsa, DeviceLayout, Metadata, Views};
use crate::error::Result;
use crate::raw;

impl CudaMsa {
    /// The indexer forward (docs/contract.md §3.1) of `qi` `[T, 4, 128]` against the shared index
    /// keys `ki` `[Tk, 1, 128]` (bf16): `(topk, lse)` with `topk` `[4, T, 16]` i32 (per head and
    /// query the top min(15, p/128) non-local blocks by (score desc, id asc), then the local block,
    /// then -1) and `lse` `[4, T]` f32 (natural-log LSE of `qi·ki/√128` over the selected visible
    /// keys). Deterministic: repeated calls are bitwise equal.
    pub fn indexer_forward(
        &self,
        layout: &DeviceLayout,
        qi: &CudaSlice<bf16>,
        ki: &CudaSlice<bf16>,
    ) -> Result<(CudaSlice<i32>, CudaSlice<f32>)> {
        let shape = layout.shape();
        let s = shape.sizes();
        let mut topk = self.output::<i32>(s.selection)?;
        let mut lse = self.output::<f32>(s.index_lse)?;
        let mut workspace = self.scratch(s.indexer_workspace_bytes)?;
        {
            let mut g = Views::new(self)?;
            let lay = layout.views(&mut g)?;
            let qi = g.read("qi", qi, s.index_queries)?;
            let ki = g.read("ki", ki, s.index_keys)?;
            let mut topk = g.write("indexer topk", &mut topk, s.selection)?;
            let mut lse = g.write("indexer lse", &mut lse, s.index_lse)?;
            let ws = g.workspace("indexer workspace", &mut workspace)?;
            // SAFETY: every view is a live allocation of this context (guards held by `g` until
            // the launches are enqueued; the workspace is freed in stream order after them), the
            // stream is the context's and the layout is this shape's.
            unsafe {
                raw::indexer_forward(shape, &lay, qi, ki, &mut topk, &mut lse, ws, g.stream())?
            };
        }
        Ok((topk, lse))
    }

    /// The `indexer_lse` input of [`CudaMsa::kl_backward`] (docs/contract.md §3.2's consistency
    /// requirement): `[4, T]` f32, the natural-log LSE of `qi·ki/√128` (qi `[T, 4, 128]`, ki
    /// `[Tk, 1, 128]`, bf16) over the token sets of the selection `metadata` was built from,
    /// `-inf` for an empty set. Deterministic: repeated calls are bitwise equal.
    pub fn selection_lse(
        &self,
        metadata: &Metadata,
        qi: &CudaSlice<bf16>,
        ki: &CudaSlice<bf16>,
    ) -> Result<CudaSlice<f32>> {
        let layout = metadata.layout();
        let shape = layout.shape();
        let s = shape.sizes();
        let mut lse = self.output::<f32>(s.index_lse)?;
        {
            let mut g = Views::new(self)?;
            let lay = layout.views(&mut g)?;
            let topk = g.read("topk_indices", metadata.topk(), s.selection)?;
            let qi = g.read("qi", qi, s.index_queries)?;
            let ki = g.read("ki", ki, s.index_keys)?;
            let mut out = g.write("indexer_lse", &mut lse, s.index_lse)?;
            // SAFETY: as in `indexer_forward`.
            unsafe { raw::selection_lse(shape, &lay, topk, qi, ki, &mut out, g.stream())? };
        }
        Ok(lse)
    }
}
