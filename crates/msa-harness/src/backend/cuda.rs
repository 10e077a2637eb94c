//! The stages on the GPU (`msa::cuda`): every tensor stays on the device between stages, and
//! the selection is validated there by `prepare`.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use half::bf16;
use msa::cuda::{BackwardOptions, CudaMsa, DeviceLayout, KlInputs, Metadata};
use msa_plan::VarlenLayout;

use super::executor::{Attention, Executor, Index};
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
        Ok(CudaMsa::prepare(
            self,
            layout,
            CudaMsa::upload(self, topk)?,
        )?)
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
