//! The naive fp32 GPU references (kernels/include/msa/reference.h) into caller buffers: TEST
//! ORACLES for the GPU suite's full-tensor checks, not kernels to train with. They take any
//! selection (invalid entries ignored, repeats counted once) and need no `prepare`.

use half::bf16;
use msa_kernels::launch::reference as launch;

use super::check;
use super::layout::Layout;
use super::shape::CallShape;
use super::view::{DevSlice, DevSliceMut, Stream};
use super::{AttentionInputs, KlInputs};
use crate::error::Result;

/// The attention's inputs and the selection topk `[4, T, 16]` (any entries).
#[derive(Debug, Clone, Copy)]
pub struct ReferenceInputs {
    pub attention: AttentionInputs,
    pub topk: DevSlice<i32>,
}

fn tensors(shape: &CallShape, i: &ReferenceInputs) -> Result<launch::AttentionTensors> {
    i.attention.check(shape)?;
    check::tensor(
        "topk_indices",
        &i.topk,
        shape.sizes().selection,
        "[4, T, 16]",
    )?;
    let a = &i.attention;
    Ok(launch::AttentionTensors {
        q: a.q.addr(),
        k: a.k.addr(),
        v: a.v.addr(),
        topk: i.topk.addr(),
    })
}

/// TEST ORACLE: `out` `[T, 64, 128]` and `lse` `[T, 64]` (f32) by the definition.
///
/// # Safety
/// Every view must be device memory of its length in the current context that outlives the
/// launches; `stream` a live stream of that context; `layout` the layout of `shape`.
pub unsafe fn reference_forward(
    shape: &CallShape,
    layout: &Layout,
    inputs: &ReferenceInputs,
    out: &mut DevSliceMut<f32>,
    lse: &mut DevSliceMut<f32>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    let t = tensors(shape, inputs)?;
    check::output("reference out", out, s.queries, "[T, 64, 128]")?;
    check::output("reference lse", lse, s.query_heads, "[T, 64]")?;
    // SAFETY: lengths checked above; the caller's contract covers the rest.
    unsafe {
        launch::attention_forward(
            &t,
            layout.varlen(shape),
            out.addr(),
            lse.addr(),
            stream.as_raw(),
        )?
    };
    Ok(())
}

/// The backward's extra inputs: `dout`, the forward's bf16 `out` `[T, 64, 128]` and `lse`
/// `[T, 64]`, as the kernels are given them.
#[derive(Debug, Clone, Copy)]
pub struct ReferenceBackwardInputs {
    pub dout: DevSlice<bf16>,
    pub out: DevSlice<bf16>,
    pub lse: DevSlice<f32>,
}

/// fp32 outputs of [`reference_backward`]: `delta` `[T, 64]` (scratch), `dq` `[T, 64, 128]`,
/// `dk`, `dv` `[Tk, 4, 128]`.
pub struct ReferenceGradients {
    pub delta: DevSliceMut<f32>,
    pub dq: DevSliceMut<f32>,
    pub dk: DevSliceMut<f32>,
    pub dv: DevSliceMut<f32>,
}

/// TEST ORACLE: dq, dk, dv (f32) by the definition; keys in no token set get zeros.
///
/// # Safety
/// As [`reference_forward`].
pub unsafe fn reference_backward(
    shape: &CallShape,
    layout: &Layout,
    inputs: &ReferenceInputs,
    extra: &ReferenceBackwardInputs,
    grads: &mut ReferenceGradients,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    let t = tensors(shape, inputs)?;
    check::tensor("dout", &extra.dout, s.queries, "[T, 64, 128]")?;
    check::tensor("out", &extra.out, s.queries, "[T, 64, 128]")?;
    check::tensor("lse", &extra.lse, s.query_heads, "[T, 64]")?;
    check::output("reference delta", &grads.delta, s.query_heads, "[T, 64]")?;
    check::output("reference dq", &grads.dq, s.queries, "[T, 64, 128]")?;
    check::output("reference dk", &grads.dk, s.keys, "[Tk, 4, 128]")?;
    check::output("reference dv", &grads.dv, s.keys, "[Tk, 4, 128]")?;
    let ins = launch::BackwardInputs {
        dout: extra.dout.addr(),
        out: extra.out.addr(),
        lse: extra.lse.addr(),
    };
    let outs = launch::BackwardOutputs {
        delta: grads.delta.addr(),
        dq: grads.dq.addr(),
        dk: grads.dk.addr(),
        dv: grads.dv.addr(),
    };
    // SAFETY: lengths checked above; the caller's contract covers the rest.
    unsafe { launch::attention_backward(&t, &ins, layout.varlen(shape), &outs, stream.as_raw())? };
    Ok(())
}

/// The KL inputs of [`reference_kl_backward`] and the selection topk `[4, T, 16]`.
#[derive(Debug, Clone, Copy)]
pub struct ReferenceKlInputs {
    pub kl: KlInputs,
    pub topk: DevSlice<i32>,
}

/// TEST ORACLE: dqi `[T, 4, 128]` and dki `[Tk, 1, 128]` (f32) of the KL backward by the
/// definition (docs/contract.md §3.2).
///
/// # Safety
/// As [`reference_forward`].
// One argument per role, as the C launcher.
#[allow(clippy::too_many_arguments)]
pub unsafe fn reference_kl_backward(
    shape: &CallShape,
    layout: &Layout,
    inputs: &ReferenceKlInputs,
    loss_coeff: f32,
    dqi: &mut DevSliceMut<f32>,
    dki: &mut DevSliceMut<f32>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    inputs.kl.check(shape)?;
    check::tensor("topk_indices", &inputs.topk, s.selection, "[4, T, 16]")?;
    check::output("reference dqi", dqi, s.index_queries, "[T, 4, 128]")?;
    check::output("reference dki", dki, s.index_keys, "[Tk, 1, 128]")?;
    let kl = &inputs.kl;
    let ins = launch::KlInputs {
        q: kl.q.addr(),
        k: kl.k.addr(),
        teacher_lse: kl.teacher_lse.addr(),
        qi: kl.qi.addr(),
        ki: kl.ki.addr(),
        indexer_lse: kl.indexer_lse.addr(),
        topk: inputs.topk.addr(),
    };
    // SAFETY: lengths checked above; the caller's contract covers the rest.
    unsafe {
        launch::kl_backward(
            &ins,
            layout.varlen(shape),
            loss_coeff,
            dqi.addr(),
            dki.addr(),
            stream.as_raw(),
        )?
    };
    Ok(())
}
