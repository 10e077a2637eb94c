//! Sparse attention backward on device buffers: the atomic main kernel over the device task
//! tables, and the deterministic pair (dQ query-outer, dK/dV physical-block-outer). Shape checks
//! first, then the launchers of `msa_kernels::launch::attention`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;
use msa_kernels::launch::attention::{BackwardInputs, PhysicalCsr, TaskTables};
use msa_plan::backward::abi::{DESC_WORDS, META_WORDS, TASK_QUERIES};

use super::layout::Shape;
use super::{CudaMsa, DeviceLayout};
use crate::error::{check_len, MsaError, Result};

/// Inputs of every backward kernel: q, dout `[T, 64, 128]` and k, v `[Tk, 4, 128]` (bf16), the
/// forward's lse and delta = rowsum(dout · out) `[T, 64]` (f32).
pub(crate) struct BackwardTensors<'a> {
    pub q: &'a CudaSlice<bf16>,
    pub k: &'a CudaSlice<bf16>,
    pub v: &'a CudaSlice<bf16>,
    pub dout: &'a CudaSlice<bf16>,
    pub lse: &'a CudaSlice<f32>,
    pub delta: &'a CudaSlice<f32>,
}

impl BackwardTensors<'_> {
    fn check(&self, layout: &DeviceLayout) -> Result<()> {
        layout.check("q", self.q, Shape::Queries)?;
        layout.check("k", self.k, Shape::Keys)?;
        layout.check("v", self.v, Shape::Keys)?;
        layout.check("dout", self.dout, Shape::Queries)?;
        layout.check("lse", self.lse, Shape::QueryHeads)?;
        layout.check("delta", self.delta, Shape::QueryHeads)
    }

    /// Device addresses. With event tracking off (one stream orders everything) the guards of
    /// `device_ptr` record nothing, so the addresses may outlive them.
    fn ptrs(&self, msa: &CudaMsa) -> BackwardInputs {
        let s = msa.stream();
        BackwardInputs {
            q: self.q.device_ptr(s).0,
            k: self.k.device_ptr(s).0,
            v: self.v.device_ptr(s).0,
            dout: self.dout.device_ptr(s).0,
            lse: self.lse.device_ptr(s).0,
            delta: self.delta.device_ptr(s).0,
        }
    }
}

/// The task build's output buffers in NeMo's layout (docs/contract.md §5.2): `tables` =
/// `task_meta [capacity, 4] | task_qrows [capacity, 8] | task_qpos [capacity, 8]`, `scratch`
/// starts with `desc [8]`. `grid_launch` is the host-side CTA bound
/// (`grid_launch_bound(capacity, num_sms)`).
pub(crate) struct TaskBuffers<'a> {
    pub tables: &'a CudaSlice<i32>,
    pub scratch: &'a CudaSlice<i32>,
    pub capacity: usize,
    pub grid_launch: usize,
}

/// fp32 accumulators of the atomic backward, zeroed by the caller: dq_accum `[T, 64, 128]` and
/// the workspace pools dk_pool, dv_pool `[W, 4, 128]` (W = 128 · padded_kv_blocks).
pub(crate) struct Accumulators<'a> {
    pub dq: &'a mut CudaSlice<f32>,
    pub dk_pool: &'a mut CudaSlice<f32>,
    pub dv_pool: &'a mut CudaSlice<f32>,
}

/// Enqueues the atomic main kernel: adds the final dQ into `acc.dq` and dK, dV into the pools
/// (the softmax scale is already inside dS; the postprocess only converts to bf16).
pub(crate) fn launch_backward_main(
    msa: &CudaMsa,
    layout: &DeviceLayout,
    inputs: &BackwardTensors<'_>,
    tasks: &TaskBuffers<'_>,
    acc: Accumulators<'_>,
) -> Result<()> {
    inputs.check(layout)?;
    let cap = tasks.capacity;
    check_len(
        "task tables",
        tasks.tables.len(),
        cap * (META_WORDS + 2 * TASK_QUERIES),
        "[capacity · 20] i32",
    )?;
    if tasks.scratch.len() < DESC_WORDS {
        return Err(MsaError::Tensor {
            name: "task-build scratch",
            expected: format!("at least {DESC_WORDS} i32 (the descriptor)"),
            got: format!("{} elements", tasks.scratch.len()),
        });
    }
    let grid_launch = i32::try_from(tasks.grid_launch).map_err(|_| MsaError::Tensor {
        name: "grid_launch",
        expected: "at most i32::MAX CTAs".into(),
        got: tasks.grid_launch.to_string(),
    })?;
    layout.check("dq_accum", acc.dq, Shape::Queries)?;
    layout.check("dk_pool", acc.dk_pool, Shape::Pool)?;
    layout.check("dv_pool", acc.dv_pool, Shape::Pool)?;

    let s = msa.stream();
    let varlen = layout.varlen(msa);
    let ins = inputs.ptrs(msa);
    let (tables, _gt) = tasks.tables.device_ptr(s);
    let (scratch, _gs) = tasks.scratch.device_ptr(s);
    let word = std::mem::size_of::<i32>() as u64;
    let tt = TaskTables {
        meta: tables,
        qrows: tables + (cap * META_WORDS) as u64 * word,
        qpos: tables + (cap * (META_WORDS + TASK_QUERIES)) as u64 * word,
        desc: scratch,
        grid_launch,
    };
    let (dq, _gq) = acc.dq.device_ptr_mut(s);
    let (dk, _gk) = acc.dk_pool.device_ptr_mut(s);
    let (dv, _gv) = acc.dv_pool.device_ptr_mut(s);
    // SAFETY: lengths checked above; the table sub-ranges lie inside `tables`; every buffer is a
    // live allocation of this context and the stream is the context's.
    unsafe {
        msa_kernels::launch::attention::backward_main(
            &ins,
            &tt,
            varlen,
            dq,
            dk,
            dv,
            msa.raw_stream(),
        )?
    };
    Ok(())
}

/// The physical CSR of `prepare` (`msa_plan::PhysicalCsr` on the device): row_ptr
/// `[4, P + 1]`, q_indices and valid `[4, T · 16]`.
pub(crate) struct DevicePhysicalCsr<'a> {
    pub row_ptr: &'a CudaSlice<i32>,
    pub q_indices: &'a CudaSlice<i32>,
    pub valid: &'a CudaSlice<i32>,
}

impl DevicePhysicalCsr<'_> {
    pub(crate) fn check(&self, layout: &DeviceLayout) -> Result<()> {
        layout.check("phys_row_ptr", self.row_ptr, Shape::PhysicalRows)?;
        layout.check("phys_q_indices", self.q_indices, Shape::Selection)?;
        layout.check("phys_valid", self.valid, Shape::Selection)
    }
}

/// bf16 gradients, written in full by the deterministic backward: dq `[T, 64, 128]`, dk and dv
/// `[Tk, 4, 128]` (key rows nobody selected get exact zeros).
pub(crate) struct Gradients<'a> {
    pub dq: &'a mut CudaSlice<bf16>,
    pub dk: &'a mut CudaSlice<bf16>,
    pub dv: &'a mut CudaSlice<bf16>,
}

/// Enqueues the deterministic backward (bitwise repeatable): dQ query-outer over `topk`
/// (validated `[4, T, 16]`), then dK/dV physical-block-outer over `csr`.
pub(crate) fn launch_backward_deterministic(
    msa: &CudaMsa,
    layout: &DeviceLayout,
    inputs: &BackwardTensors<'_>,
    topk: &CudaSlice<i32>,
    csr: &DevicePhysicalCsr<'_>,
    grads: Gradients<'_>,
) -> Result<()> {
    inputs.check(layout)?;
    layout.check("topk_indices", topk, Shape::Selection)?;
    csr.check(layout)?;
    layout.check("dq", grads.dq, Shape::Queries)?;
    layout.check("dk", grads.dk, Shape::Keys)?;
    layout.check("dv", grads.dv, Shape::Keys)?;

    let s = msa.stream();
    let varlen = layout.varlen(msa);
    let ins = inputs.ptrs(msa);
    let (topk, _gt) = topk.device_ptr(s);
    let (row_ptr, _gr) = csr.row_ptr.device_ptr(s);
    let (q_indices, _gi) = csr.q_indices.device_ptr(s);
    let (valid, _gv) = csr.valid.device_ptr(s);
    let pc = PhysicalCsr {
        row_ptr,
        q_indices,
        valid,
    };
    let (dq, _gq) = grads.dq.device_ptr_mut(s);
    let (dk, _gk) = grads.dk.device_ptr_mut(s);
    let (dv, _gw) = grads.dv.device_ptr_mut(s);
    // SAFETY: lengths checked above; every buffer is a live allocation of this context and the
    // stream is the context's.
    unsafe {
        msa_kernels::launch::attention::backward_dq(&ins, topk, varlen, dq, msa.raw_stream())?;
        msa_kernels::launch::attention::backward_dkv(&ins, &pc, varlen, dk, dv, msa.raw_stream())?;
    }
    Ok(())
}
