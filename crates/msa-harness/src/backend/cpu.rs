//! The stages on the CPU reference (`msa-ref`): inputs are borrowed, never copied.

use std::borrow::Cow;

use half::bf16;
use msa_plan::topk::validate_topk;
use msa_plan::VarlenLayout;
use msa_ref::attention::{self, AttentionInputs};
use msa_ref::compare::to_bf16;
use msa_ref::indexer::{self, IndexerInputs};
use msa_ref::kl;

use msa_workloads::{copy_rows, Segment};

use super::executor::{Attention, Executor, Index};
use crate::cp::RankExecutor;
use crate::error::Result;

/// The CPU reference of the whole contract.
pub struct CpuReference;

/// A selection the host rule accepted, with its layout.
pub struct CpuMetadata<'a> {
    layout: &'a VarlenLayout,
    topk: &'a [i32],
}

impl CpuMetadata<'_> {
    fn attention<'t>(&'t self, attn: &Attention<'t, Cow<'_, [bf16]>>) -> AttentionInputs<'t> {
        AttentionInputs {
            layout: self.layout,
            q: attn.q,
            k: attn.k,
            v: attn.v,
            topk: self.topk,
        }
    }
}

fn index_inputs<'t>(
    layout: &'t VarlenLayout,
    index: &Index<'t, Cow<'_, [bf16]>>,
) -> IndexerInputs<'t> {
    IndexerInputs {
        layout,
        qi: index.qi,
        ki: index.ki,
    }
}

impl<'a> Executor<'a> for CpuReference {
    type Bf16 = Cow<'a, [bf16]>;
    type F32 = Vec<f32>;
    type I32 = Vec<i32>;
    type Layout = &'a VarlenLayout;
    type Metadata = CpuMetadata<'a>;

    fn upload(&self, host: &'a [bf16]) -> Result<Self::Bf16> {
        Ok(Cow::Borrowed(host))
    }

    fn layout(&self, host: &'a VarlenLayout) -> Result<Self::Layout> {
        Ok(host)
    }

    fn prepare(&self, layout: &Self::Layout, topk: &'a [i32]) -> Result<Self::Metadata> {
        validate_topk(layout, topk)?;
        Ok(CpuMetadata { layout, topk })
    }

    fn build_tables(&self, _meta: &mut Self::Metadata) -> Result<()> {
        Ok(())
    }

    fn forward(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
    ) -> Result<(Self::Bf16, Self::F32)> {
        let fwd = attention::forward(&meta.attention(attn))?;
        Ok((Cow::Owned(fwd.out_bf16()), fwd.lse))
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
        let (dq, dk, dv) = self.backward_keys(meta, attn, dout, out, lse, deterministic)?;
        Ok([dq, Cow::Owned(to_bf16(&dk)), Cow::Owned(to_bf16(&dv))])
    }

    fn indexer(
        &self,
        layout: &Self::Layout,
        index: &Index<'_, Self::Bf16>,
    ) -> Result<(Self::I32, Self::F32)> {
        let r = indexer::forward(&index_inputs(layout, index))?;
        Ok((r.topk, r.lse))
    }

    fn selection_lse(
        &self,
        meta: &Self::Metadata,
        index: &Index<'_, Self::Bf16>,
    ) -> Result<Self::F32> {
        let all: Vec<usize> = (0..meta.layout.total_q()).collect();
        Ok(indexer::selection_lse(
            &index_inputs(meta.layout, index),
            meta.topk,
            &all,
        )?)
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
        let (dqi, dki) =
            self.kl_backward_keys(meta, attn, index, teacher_lse, indexer_lse, loss_coeff)?;
        Ok((dqi, Cow::Owned(to_bf16(&dki))))
    }

    /// Every stage has finished when it returns.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn download_bf16(&self, x: Self::Bf16) -> Result<Vec<bf16>> {
        Ok(x.into_owned())
    }

    fn download_f32(&self, x: Self::F32) -> Result<Vec<f32>> {
        Ok(x)
    }

    fn download_i32(&self, x: Self::I32) -> Result<Vec<i32>> {
        Ok(x)
    }
}

/// The per-rank call of a CP split on the CPU reference: key gradients stay unrounded f32.
impl<'a> RankExecutor<'a> for CpuReference {
    type KeyGrad = Vec<f32>;

    fn gather_rows(
        &self,
        src: &Self::Bf16,
        width: usize,
        segs: &[Segment],
        rows: usize,
    ) -> Result<Self::Bf16> {
        let mut out = vec![bf16::ZERO; rows * width];
        copy_rows(src, &mut out, width, segs);
        Ok(Cow::Owned(out))
    }

    fn concat(&self, parts: &[&Self::Bf16]) -> Result<Self::Bf16> {
        Ok(Cow::Owned(
            parts.iter().flat_map(|p| p.iter().copied()).collect(),
        ))
    }

    fn backward_keys(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
        dout: &Self::Bf16,
        out: &Self::Bf16,
        lse: &Self::F32,
        _deterministic: bool,
    ) -> Result<(Self::Bf16, Vec<f32>, Vec<f32>)> {
        let g = attention::backward(&meta.attention(attn), dout, out, lse)?;
        Ok((Cow::Owned(to_bf16(&g.dq)), g.dk, g.dv))
    }

    fn kl_backward_keys(
        &self,
        meta: &Self::Metadata,
        attn: &Attention<'_, Self::Bf16>,
        index: &Index<'_, Self::Bf16>,
        teacher_lse: &Self::F32,
        indexer_lse: &Self::F32,
        loss_coeff: f32,
    ) -> Result<(Self::Bf16, Vec<f32>)> {
        let g = kl::kl_backward(
            &meta.attention(attn),
            teacher_lse,
            index.qi,
            index.ki,
            indexer_lse,
            loss_coeff,
        )?;
        Ok((Cow::Owned(to_bf16(&g.dqi)), g.dki))
    }

    fn key_grad_f32(&self, x: Vec<f32>) -> Result<Vec<f32>> {
        Ok(x)
    }
}
