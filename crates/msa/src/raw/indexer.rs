//! The indexer family into caller buffers (kernels/include/msa/indexer.h): the lightning indexer
//! forward and the LSE of an attention selection's token sets.

use half::bf16;
use msa_kernels::{launch, sys};

use super::check;
use super::layout::Layout;
use super::shape::CallShape;
use super::view::{DevSlice, DevSliceMut, Stream};
use crate::error::Result;

fn check_index_inputs(shape: &CallShape, qi: &DevSlice<bf16>, ki: &DevSlice<bf16>) -> Result<()> {
    let s = shape.sizes();
    check::tensor("qi", qi, s.index_queries, "[T, 4, 128]")?;
    check::tensor("ki", ki, s.index_keys, "[Tk, 1, 128]")
}

/// The indexer forward (contract §3.1) of `qi` `[T, 4, 128]` against the shared index keys `ki`
/// `[Tk, 1, 128]` (bf16): `topk` `[4, T, 16]` i32 (per head and query the top min(15, p/128)
/// non-local blocks by (score desc, id asc), then the local block, then -1) and `lse` `[4, T]`
/// f32, every element written; deterministic. `workspace` holds at least
/// [`Sizes::indexer_workspace_bytes`](super::Sizes::indexer_workspace_bytes), 256-byte aligned.
/// Lengths are checked before any launch.
///
/// # Safety
/// Every view must be device memory of its length, usable from the current CUDA context, that
/// stays allocated until the launches have run; `stream` must be a live stream of that context;
/// `layout` must be the layout of `shape`.
// One argument per role, as the C launcher.
#[allow(clippy::too_many_arguments)]
pub unsafe fn indexer_forward(
    shape: &CallShape,
    layout: &Layout,
    qi: DevSlice<bf16>,
    ki: DevSlice<bf16>,
    topk: &mut DevSliceMut<i32>,
    lse: &mut DevSliceMut<f32>,
    workspace: DevSliceMut<u8>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    check_index_inputs(shape, &qi, &ki)?;
    check::output("indexer topk", topk, s.selection, "[4, T, 16]")?;
    check::output("indexer lse", lse, s.index_lse, "[4, T]")?;
    check::workspace("indexer workspace", &workspace, s.indexer_workspace_bytes)?;
    let params = sys::MsaIndexerParams {
        qi: qi.ptr().cast(),
        ki: ki.ptr().cast(),
        varlen: layout.varlen(shape),
        topk: topk.ptr(),
        lse: lse.ptr(),
    };
    // SAFETY: lengths and alignment checked above; the caller's contract covers the rest.
    unsafe {
        launch::indexer::forward(&params, workspace.addr(), workspace.len(), stream.as_raw())?
    };
    Ok(())
}

/// The `indexer_lse` input of [`kl_backward`](super::kl_backward) (contract §3.2): `lse`
/// `[4, T]` f32, the natural-log LSE of `qi·ki/√128` over the token sets of the selection `topk`
/// `[4, T, 16]` (the attention's validated selection), `-inf` for an empty set. One kernel, no
/// workspace, deterministic.
///
/// # Safety
/// As [`indexer_forward`].
pub unsafe fn selection_lse(
    shape: &CallShape,
    layout: &Layout,
    topk: DevSlice<i32>,
    qi: DevSlice<bf16>,
    ki: DevSlice<bf16>,
    lse: &mut DevSliceMut<f32>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    check::tensor("topk_indices", &topk, s.selection, "[4, T, 16]")?;
    check_index_inputs(shape, &qi, &ki)?;
    check::output("indexer_lse", lse, s.index_lse, "[4, T]")?;
    // SAFETY: lengths and alignment checked above; the caller's contract covers the rest.
    unsafe {
        launch::indexer::selection_lse(
            qi.addr(),
            ki.addr(),
            topk.addr(),
            layout.varlen(shape),
            lse.addr(),
            stream.as_raw(),
        )?
    };
    Ok(())
}
