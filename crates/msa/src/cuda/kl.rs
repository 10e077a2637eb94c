//! The KL backward of the index branch on device buffers: shape checks, then
//! `msa_kl_backward` over the physical CSR of `prepare`.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;
use msa_kernels::launch;
use msa_kernels::launch::attention::PhysicalCsr;
use msa_kernels::launch::kl::KlInputs as KernelInputs;
use msa_plan::topology::{INDEX_DIM, NUM_INDEX_HEADS};

use super::attention_bwd::DevicePhysicalCsr;
use super::layout::Shape;
use super::{CudaMsa, DeviceLayout, Metadata};
use crate::error::Result;

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

impl KlInputs<'_> {
    fn check(&self, layout: &DeviceLayout) -> Result<()> {
        layout.check("q", self.q, Shape::Queries)?;
        layout.check("k", self.k, Shape::Keys)?;
        layout.check("teacher_lse", self.teacher_lse, Shape::QueryHeads)?;
        layout.check("qi", self.qi, Shape::IndexQueries)?;
        layout.check("ki", self.ki, Shape::IndexKeys)?;
        layout.check("indexer_lse", self.indexer_lse, Shape::IndexHeads)
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
        let layout = metadata.layout();
        let h = layout.host();
        let mut dqi = self.output::<bf16>(h.total_q() * NUM_INDEX_HEADS * INDEX_DIM)?;
        let mut dki = self.output::<bf16>(h.total_k() * INDEX_DIM)?;
        let csr = DevicePhysicalCsr {
            row_ptr: metadata.phys_row_ptr(),
            q_indices: metadata.phys_q_indices(),
            valid: metadata.phys_valid(),
        };
        launch_kl_backward(
            self,
            layout,
            inputs,
            metadata.topk(),
            &csr,
            loss_coeff,
            &mut dqi,
            &mut dki,
        )?;
        Ok((dqi, dki))
    }
}

/// Enqueues the KL backward into `dqi` `[T, 4, 128]` and `dki` `[Tk, 1, 128]` (bf16, written
/// in full). `topk` `[4, T, 16]` must be validated and `csr` `prepare`'s physical CSR of it.
// One argument per role, as the C launcher.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_kl_backward(
    msa: &CudaMsa,
    layout: &DeviceLayout,
    inputs: &KlInputs<'_>,
    topk: &CudaSlice<i32>,
    csr: &DevicePhysicalCsr<'_>,
    loss_coeff: f32,
    dqi: &mut CudaSlice<bf16>,
    dki: &mut CudaSlice<bf16>,
) -> Result<()> {
    inputs.check(layout)?;
    layout.check("topk_indices", topk, Shape::Selection)?;
    csr.check(layout)?;
    layout.check("dqi", dqi, Shape::IndexQueries)?;
    layout.check("dki", dki, Shape::IndexKeys)?;

    let varlen = layout.varlen(msa);
    let bytes = launch::kl::workspace_bytes(varlen)?;
    // SAFETY: scratch; the kernels write every word they read.
    let workspace = unsafe { msa.stream().alloc::<u8>(bytes.max(1))? };
    let s = msa.stream();
    // With event tracking off (one stream orders everything) the guards record nothing, so the
    // addresses may outlive them.
    let ins = KernelInputs {
        q: inputs.q.device_ptr(s).0,
        k: inputs.k.device_ptr(s).0,
        teacher_lse: inputs.teacher_lse.device_ptr(s).0,
        qi: inputs.qi.device_ptr(s).0,
        ki: inputs.ki.device_ptr(s).0,
        indexer_lse: inputs.indexer_lse.device_ptr(s).0,
        topk: topk.device_ptr(s).0,
    };
    let pc = PhysicalCsr {
        row_ptr: csr.row_ptr.device_ptr(s).0,
        q_indices: csr.q_indices.device_ptr(s).0,
        valid: csr.valid.device_ptr(s).0,
    };
    let (ws, _gw) = workspace.device_ptr(s);
    let (dqi, _gq) = dqi.device_ptr_mut(s);
    let (dki, _gk) = dki.device_ptr_mut(s);
    // SAFETY: every buffer has the length checked above and is a live allocation of this
    // context, the workspace holds `bytes` (256-byte aligned), `varlen` points into `layout`'s
    // live arrays and the stream is the context's. Dropping the workspace after the launch is
    // safe: cudarc frees in stream order.
    unsafe {
        launch::kl::backward(
            &ins,
            &pc,
            varlen,
            loss_coeff,
            dqi,
            dki,
            ws,
            bytes,
            msa.raw_stream(),
        )?
    };
    Ok(())
}
