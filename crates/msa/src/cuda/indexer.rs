//! The indexer family on device buffers: the lightning indexer forward
//! (`msa_indexer_forward`) and the LSE of an attention selection's token sets
//! (`msa_indexer_selection_lse`), each after shape checks.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;
use msa_kernels::launch;
use msa_plan::topology::{NUM_INDEX_HEADS, TOPK_BLOCKS};

use super::layout::Shape;
use super::{CudaMsa, DeviceLayout, Metadata};
use crate::error::Result;

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
        let h = layout.host();
        let t = h.total_q();
        layout.check("qi", qi, Shape::IndexQueries)?;
        layout.check("ki", ki, Shape::IndexKeys)?;
        let mut topk = self.output::<i32>(NUM_INDEX_HEADS * t * TOPK_BLOCKS)?;
        let mut lse = self.output::<f32>(NUM_INDEX_HEADS * t)?;

        let varlen = layout.varlen(self);
        let bytes = launch::indexer::workspace_bytes(varlen)?;
        // SAFETY: scratch; the kernels write every word they read.
        let workspace = unsafe { self.stream().alloc::<u8>(bytes.max(1))? };
        let s = self.stream();
        {
            let (qi, _gq) = qi.device_ptr(s);
            let (ki, _gk) = ki.device_ptr(s);
            let (ws, _gw) = workspace.device_ptr(s);
            let (topk, _gt) = topk.device_ptr_mut(s);
            let (lse, _gl) = lse.device_ptr_mut(s);
            // SAFETY: qi, ki, topk and lse have the lengths checked or allocated above, the
            // workspace holds `bytes` (cudarc allocations are 256-byte aligned), `varlen` points
            // into `layout`'s live arrays and the stream is the context's. Dropping the
            // workspace after the launch is safe: cudarc frees in stream order.
            unsafe {
                launch::indexer::forward(qi, ki, varlen, topk, lse, ws, bytes, self.raw_stream())?
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
        layout.check("qi", qi, Shape::IndexQueries)?;
        layout.check("ki", ki, Shape::IndexKeys)?;
        let mut lse = self.output::<f32>(NUM_INDEX_HEADS * layout.host().total_q())?;
        let varlen = layout.varlen(self);
        let s = self.stream();
        {
            let (qi, _gq) = qi.device_ptr(s);
            let (ki, _gk) = ki.device_ptr(s);
            let (topk, _gt) = metadata.topk().device_ptr(s);
            let (lse, _gl) = lse.device_ptr_mut(s);
            // SAFETY: qi and ki have the lengths checked above, the selection is the metadata's
            // `[4, T, 16]` and lse was allocated `[4, T]` for this layout; `varlen` points into
            // the layout's live arrays and the stream is the context's.
            unsafe {
                launch::indexer::selection_lse(qi, ki, topk, varlen, lse, self.raw_stream())?
            };
        }
        Ok(lse)
    }
}
