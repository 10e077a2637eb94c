//! Sparse attention of the contract (docs/contract.md §2): forward, backward and their subset
//! variants.
//!
//! Query head h reads the token set of group `h / 16`; scores are `scale·⟨q, k⟩` with
//! `scale = 128^-0.5`. Products accumulate in f32 and results are returned unrounded (see the
//! crate docs for every rounding point).

mod backward;
mod forward;

pub(crate) use backward::check_key_rows;
pub use backward::{backward, backward_dkv_keys, backward_dq_queries, Grads};
pub use forward::{forward, forward_queries, Forward};

#[cfg(test)]
mod tests;

use half::bf16;
use msa_plan::topology::{HEADS_PER_GROUP, HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS};
use msa_plan::VarlenLayout;

use crate::blocks::{BlockTable, KeyCache};
use crate::error::{expect_len, Result};

/// Inputs of the attention passes (MSA layouts, contiguous, row-major).
#[derive(Debug, Clone, Copy)]
pub struct AttentionInputs<'a> {
    pub layout: &'a VarlenLayout,
    /// `[T, 64, 128]`.
    pub q: &'a [bf16],
    /// `[Tk, 4, 128]`.
    pub k: &'a [bf16],
    /// `[Tk, 4, 128]`.
    pub v: &'a [bf16],
    /// `[4, T, 16]`, head-major, document-local block ids; entries outside `[0, num_blocks)`
    /// are ignored and duplicates count once.
    pub topk: &'a [i32],
}

/// Elements of one query's `[64, 128]` rows.
pub(crate) const Q_ROW: usize = NUM_Q_HEADS * HEAD_DIM;
/// Elements of one group's 16 query heads.
pub(crate) const GROUP_ROWS: usize = Q_ROW / NUM_KV_HEADS;
/// Query heads per group.
pub(crate) const HEADS: usize = HEADS_PER_GROUP;

impl AttentionInputs<'_> {
    /// Sizes of `q`, `k` and `topk` (everything the KL teacher reads).
    pub(crate) fn check_qk(&self) -> Result<()> {
        let (t, tk) = (self.layout.total_q(), self.layout.total_k());
        expect_len("q", self.q.len(), &[t, NUM_Q_HEADS, HEAD_DIM])?;
        expect_len("k", self.k.len(), &[tk, NUM_KV_HEADS, HEAD_DIM])?;
        expect_len("topk", self.topk.len(), &[NUM_KV_HEADS, t, TOPK_BLOCKS])
    }

    pub(crate) fn check(&self) -> Result<()> {
        self.check_qk()?;
        let tk = self.layout.total_k();
        expect_len("v", self.v.len(), &[tk, NUM_KV_HEADS, HEAD_DIM])
    }

    /// The 16 query heads of `group` for packed query `q`, `[16, 128]`.
    pub(crate) fn q_group(&self, q: usize, group: usize) -> &[bf16] {
        let at = q * Q_ROW + group * GROUP_ROWS;
        &self.q[at..at + GROUP_ROWS]
    }
}

/// f32 copies of the K and V blocks a call reads.
pub(crate) struct KvCache {
    pub table: BlockTable,
    pub k: KeyCache,
    pub v: KeyCache,
}

impl KvCache {
    /// `needed[g · P + pb]` marks the (group, physical block) pairs to convert.
    pub fn new(inputs: &AttentionInputs<'_>, needed: &[bool]) -> Self {
        let table = BlockTable::new(inputs.layout);
        let k = KeyCache::new(&table, inputs.k, NUM_KV_HEADS, needed);
        let v = KeyCache::new(&table, inputs.v, NUM_KV_HEADS, needed);
        Self { table, k, v }
    }
}
