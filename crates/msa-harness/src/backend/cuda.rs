//! The stages on the GPU (`msa::cuda`): every tensor stays on the device between stages, the
//! selection is validated there by `prepare_forward`, and the CSR tables are built after the
//! forward, where the backward starts.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use half::bf16;
use msa::cuda::{BackwardOptions, CudaMsa, DeviceLayout, KlInputs, Metadata};
use msa_plan::VarlenLayout;
use msa_workloads::Segment;

use super::executor::{Attention, Executor, Index};
use crate::cp::RankExecutor;
use crate::error::Result;

impl Executor<'_> for CudaMsa {
    type Bf16 = CudaSlice<bf16>;
    type F32 = CudaSlice<f32>;
    type I32 = CudaSlice<i32>;
    type Layout = Arc<DeviceLayout>;
    type Metadata = Metadata;

    fn upload(&self, host: &[bf16]) -> Result<Self::Bf16> {
        Ok(CudaMsa::upload(self, host)?)
    }

    fn layout(&self, host: &VarlenLayout) -> Result<Self::Layout> {
        Ok(Arc::new(DeviceLayout::new(self, host.clone())?))
    }

    fn prepare(&self, layout: &Self::Layout, topk: &[i32]) -> Result<Self::Metadata> {
        Ok(CudaMsa::prepare_forward(
            self,
            layout,
            CudaMsa::upload(self, topk)?,
        )?)
    }

    fn build_tables(&self, meta: &mut Self::Metadata) -> Result<()> {
        Ok(CudaMsa::build_tables(self, meta)?)
    }

    fn forward(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
    ) -> Result<(Self::Bf16, Self::F32)> {
        let fwd = CudaMsa::forward(self, meta, attn.q, attn.k, attn.v)?;
        Ok((fwd.out, fwd.lse))
    }

    fn backward(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
        dout: &Self::Bf16,
        out: &Self::Bf16,
        lse: &Self::F32,
        deterministic: bool,
    ) -> Result<[Self::Bf16; 3]> {
        let opts = BackwardOptions { deterministic };
        let g = CudaMsa::backward(self, meta, attn.q, attn.k, attn.v, dout, out, lse, opts)?;
        Ok([g.dq, g.dk, g.dv])
    }

    fn indexer(
        &self,
        layout: &Self::Layout,
        index: &Index<'_, Self::Bf16>,
    ) -> Result<(Self::I32, Self::F32)> {
        Ok(self.indexer_forward(layout, index.qi, index.ki)?)
    }

    fn selection_lse(
        &self,
        meta: &Self::Metadata,
        index: &Index<'_, Self::Bf16>,
    ) -> Result<Self::F32> {
        Ok(CudaMsa::selection_lse(self, meta, index.qi, index.ki)?)
    }

    fn kl_backward(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
        index: &Index<'_, Self::Bf16>,
        teacher_lse: &Self::F32,
        indexer_lse: &Self::F32,
        loss_coeff: f32,
    ) -> Result<(Self::Bf16, Self::Bf16)> {
        let inputs = KlInputs {
            q: attn.q,
            k: attn.k,
            teacher_lse,
            qi: index.qi,
            ki: index.ki,
            indexer_lse,
        };
        Ok(CudaMsa::kl_backward(self, meta, &inputs, loss_coeff)?)
    }

    fn synchronize(&self) -> Result<()> {
        Ok(CudaMsa::synchronize(self)?)
    }

    fn download_bf16(&self, x: Self::Bf16) -> Result<Vec<bf16>> {
        Ok(self.download(&x)?)
    }

    fn download_f32(&self, x: Self::F32) -> Result<Vec<f32>> {
        Ok(self.download(&x)?)
    }

    fn download_i32(&self, x: Self::I32) -> Result<Vec<i32>> {
        Ok(self.download(&x)?)
    }
}

/// The naive fp32 GPU references of one call (`CudaMsa::reference_*`, test oracles): the
/// forward of `p`; the backward given `got`'s forward outputs (`out`, `lse`), as the kernels
/// are given them; and, with `kl` (the index LSE the backend's KL backward was given and its
/// loss coefficient), the KL backward with `got`'s LSE as the teacher's. Every tensor `got` has
/// gets its complete reference, for [`against_full`](crate::check::against_full).
pub fn gpu_reference(
    m: &CudaMsa,
    p: &crate::io::CallInputs,
    got: &crate::io::Outputs,
    kl: Option<(&[f32], f32)>,
) -> Result<crate::check::FullReference> {
    let layout = DeviceLayout::new(m, p.layout.clone())?;
    let (q, k, v) = (m.upload(&p.q)?, m.upload(&p.k)?, m.upload(&p.v)?);
    let topk = m.upload(&p.topk_indices)?;
    let mut r = crate::check::FullReference::default();
    let fwd = m.reference_forward(&layout, &q, &k, &v, &topk)?;
    r.out = Some(m.download(&fwd.out)?);
    r.lse = Some(m.download(&fwd.lse)?);
    let (Some(out), Some(lse)) = (&got.out, &got.lse) else {
        return Ok(r);
    };
    let lse = m.upload(lse)?;
    if let (Some(dout), Some(_)) = (&p.dout, &got.dq) {
        let (dout, out) = (m.upload(dout)?, m.upload(out)?);
        let g = m.reference_backward(&layout, &q, &k, &v, &topk, &dout, &out, &lse)?;
        r.dq = Some(m.download(&g.dq)?);
        r.dk = Some(m.download(&g.dk)?);
        r.dv = Some(m.download(&g.dv)?);
    }
    if let (Some(index), Some((indexer_lse, loss_coeff)), Some(_)) = (&p.index, kl, &got.dqi) {
        let (qi, ki) = (m.upload(&index.qi)?, m.upload(&index.ki)?);
        let indexer_lse = m.upload(indexer_lse)?;
        let inputs = KlInputs {
            q: &q,
            k: &k,
            teacher_lse: &lse,
            qi: &qi,
            ki: &ki,
            indexer_lse: &indexer_lse,
        };
        let (dqi, dki) = m.reference_kl_backward(&layout, &inputs, &topk, loss_coeff)?;
        r.dqi = Some(m.download(&dqi)?);
        r.dki = Some(m.download(&dki)?);
    }
    // Empty tensors come back as the facade's one-element buffers.
    let (t, tk) = (p.layout.total_q(), p.layout.total_k());
    for (x, n) in [
        (&mut r.out, t * 64 * 128),
        (&mut r.lse, t * 64),
        (&mut r.dq, t * 64 * 128),
        (&mut r.dk, tk * 4 * 128),
        (&mut r.dv, tk * 4 * 128),
        (&mut r.dqi, t * 4 * 128),
        (&mut r.dki, tk * 128),
    ] {
        if let Some(x) = x {
            x.truncate(n);
        }
    }
    Ok(r)
}

/// The per-rank call of a CP split on the GPU: rows move by device copies; the kernels round
/// dK/dV/dKI to bf16 in their epilogue, so a rank's key gradients come to the reduction as bf16
/// widened to f32.
impl RankExecutor<'_> for CudaMsa {
    type KeyGrad = CudaSlice<bf16>;

    fn gather_rows(
        &self,
        src: &Self::Bf16,
        width: usize,
        segs: &[Segment],
        rows: usize,
    ) -> Result<Self::Bf16> {
        let mut out = self.zeros::<bf16>(rows * width)?;
        for s in segs {
            let from = src.slice(s.src * width..(s.src + s.len) * width);
            let mut to = out.slice_mut(s.dst * width..(s.dst + s.len) * width);
            self.stream().memcpy_dtod(&from, &mut to)?;
        }
        Ok(out)
    }

    fn concat(&self, parts: &[&Self::Bf16]) -> Result<Self::Bf16> {
        let mut out = self.zeros::<bf16>(parts.iter().map(|p| p.len()).sum())?;
        let mut at = 0;
        for p in parts {
            let mut to = out.slice_mut(at..at + p.len());
            self.stream().memcpy_dtod(*p, &mut to)?;
            at += p.len();
        }
        Ok(out)
    }

    fn backward_keys(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
        dout: &Self::Bf16,
        out: &Self::Bf16,
        lse: &Self::F32,
        deterministic: bool,
    ) -> Result<(Self::Bf16, Self::KeyGrad, Self::KeyGrad)> {
        let [dq, dk, dv] = Executor::backward(self, meta, attn, dout, out, lse, deterministic)?;
        Ok((dq, dk, dv))
    }

    fn kl_backward_keys(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
        index: &Index<'_, Self::Bf16>,
        teacher_lse: &Self::F32,
        indexer_lse: &Self::F32,
        loss_coeff: f32,
    ) -> Result<(Self::Bf16, Self::KeyGrad)> {
        Executor::kl_backward(
            self,
            meta,
            attn,
            index,
            teacher_lse,
            indexer_lse,
            loss_coeff,
        )
    }

    fn key_grad_f32(&self, x: Self::KeyGrad) -> Result<Vec<f32>> {
        Ok(self.download(&x)?.iter().map(|v| v.to_f32()).collect())
    }
}
