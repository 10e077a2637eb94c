//! The KL backward of the index branch into caller buffers (kernels/include/msa/kl.h).

use half::bf16;
use msa_kernels::{launch, sys};

use super::check;
use super::layout::Layout;
use super::prepare::Metadata;
use super::shape::CallShape;
use super::view::{DevSlice, DevSliceMut, Stream};
use crate::error::Result;

/// Inputs of the KL backward (contract §1.5): the attention's q `[T, 64, 128]` and k
/// `[Tk, 4, 128]`, its forward LSE `teacher_lse` `[T, 64]`, the index tensors qi `[T, 4, 128]`
/// and ki `[Tk, 1, 128]`, and `indexer_lse` `[4, T]` over the attention's own token sets
/// ([`selection_lse`](super::selection_lse)).
#[derive(Debug, Clone, Copy)]
pub struct KlInputs {
    pub q: DevSlice<bf16>,
    pub k: DevSlice<bf16>,
    pub teacher_lse: DevSlice<f32>,
    pub qi: DevSlice<bf16>,
    pub ki: DevSlice<bf16>,
    pub indexer_lse: DevSlice<f32>,
}

impl KlInputs {
    pub(super) fn check(&self, shape: &CallShape) -> Result<()> {
        let s = shape.sizes();
        check::tensor("q", &self.q, s.queries, "[T, 64, 128]")?;
        check::tensor("k", &self.k, s.keys, "[Tk, 4, 128]")?;
        check::tensor("teacher_lse", &self.teacher_lse, s.query_heads, "[T, 64]")?;
        check::tensor("qi", &self.qi, s.index_queries, "[T, 4, 128]")?;
        check::tensor("ki", &self.ki, s.index_keys, "[Tk, 1, 128]")?;
        check::tensor("indexer_lse", &self.indexer_lse, s.index_lse, "[4, T]")
    }
}

/// The KL backward (contract §3.2) of `meta`'s selection: `dqi` `[T, 4, 128]` and `dki`
/// `[Tk, 1, 128]` (bf16), every element written (keys in no token set get exact zeros);
/// deterministic. `workspace` holds at least
/// [`Sizes::kl_workspace_bytes`](super::Sizes::kl_workspace_bytes), 256-byte aligned. Lengths
/// are checked before any launch.
///
/// # Safety
/// Every view must be device memory of its length, usable from the current CUDA context, that
/// stays allocated until the launches have run; `stream` must be a live stream of that context;
/// `layout` must be the layout of `shape` and `meta` [`prepare`](super::prepare)'s output for it,
/// on a selection that passed validation.
// One argument per role, as the C launcher.
#[allow(clippy::too_many_arguments)]
pub unsafe fn kl_backward(
    shape: &CallShape,
    layout: &Layout,
    meta: &Metadata,
    inputs: &KlInputs,
    loss_coeff: f32,
    dqi: &mut DevSliceMut<bf16>,
    dki: &mut DevSliceMut<bf16>,
    workspace: DevSliceMut<u8>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    meta.check(shape)?;
    inputs.check(shape)?;
    check::output("dqi", dqi, s.index_queries, "[T, 4, 128]")?;
    check::output("dki", dki, s.index_keys, "[Tk, 1, 128]")?;
    check::workspace("KL workspace", &workspace, s.kl_workspace_bytes)?;
    let params = sys::MsaKlParams {
        q: inputs.q.ptr().cast(),
        k: inputs.k.ptr().cast(),
        teacher_lse: inputs.teacher_lse.ptr(),
        qi: inputs.qi.ptr().cast(),
        ki: inputs.ki.ptr().cast(),
        indexer_lse: inputs.indexer_lse.ptr(),
        topk: meta.topk.ptr(),
        phys_row_ptr: meta.phys_row_ptr.ptr(),
        phys_q_indices: meta.phys_q_indices.ptr(),
        phys_valid: meta.phys_valid.ptr(),
        varlen: layout.varlen(shape),
        loss_coeff,
        dqi: dqi.ptr().cast(),
        dki: dki.ptr().cast(),
    };
    // SAFETY: lengths and alignment checked above; the caller's contract covers the rest.
    unsafe { launch::kl::backward(&params, workspace.addr(), workspace.len(), stream.as_raw())? };
    Ok(())
}
