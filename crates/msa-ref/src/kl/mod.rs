//! KL backward of the index branch (docs/contract.md §3.2).
//!
//! On the sparse token set S(q, g): teacher `t̄(j) = mean_h exp(scale·q_h·k_j − teacher_lse)`
//! over the group's 16 heads, student `σ(j) = exp(iscale·qi·ki_j − indexer_lse)`,
//! `dz = bf16(σ − t̄)`, `dqi = grad_scale·Σ_j dz·ki_j`, `dki_j = grad_scale·Σ_{q,g} dz·qi`,
//! `grad_scale = iscale·loss_coeff / (4·T)`. dQI is query-parallel, dKI key-block-parallel
//! (over every query of every fragment of the document); both get dz from one function.

mod loss;
#[cfg(test)]
mod tests;

pub use loss::kl_loss;

use std::ops::Range;

use half::bf16;
use msa_plan::topology::{
    BLOCK_SIZE, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, SOFTMAX_SCALE,
    SOFTMAX_SCALE_F64,
};
use rayon::prelude::*;

use crate::attention::{check_key_rows, AttentionInputs, GROUP_ROWS, HEADS};
use crate::blocks::{BlockTable, KeyCache};
use crate::compare::{round_bf16, widen};
use crate::error::{expect_indices, expect_len, Result};
use crate::gemm::{accumulate, dot_rows, D};
use crate::selection::{selected_blocks, topk_row, QueryPos, Selection, Visits};

/// KL gradients, unrounded f32.
#[derive(Debug, Clone, PartialEq)]
pub struct KlGrads {
    /// `[T, 4, 128]`.
    pub dqi: Vec<f32>,
    /// `[Tk, 1, 128]`; keys in no token set get exact zeros.
    pub dki: Vec<f32>,
}

/// dQI and dKI. `inputs` supplies q, k and the selection (v is not read); `teacher_lse`
/// `[T, 64]` is the attention forward LSE, `qi` `[T, 4, 128]`, `ki` `[Tk, 1, 128]`,
/// `indexer_lse` `[4, T]`.
pub fn kl_backward(
    inputs: &AttentionInputs<'_>,
    teacher_lse: &[f32],
    qi: &[bf16],
    ki: &[bf16],
    indexer_lse: &[f32],
    loss_coeff: f32,
) -> Result<KlGrads> {
    let args = Args::checked(inputs, teacher_lse, qi, ki, indexer_lse, loss_coeff)?;
    Ok(grads::<true>(&args))
}

/// dQI rows `[n, 4, 128]` of the given packed queries, in the given order; equal, bit for
/// bit, to the same rows of [`kl_backward`].
pub fn kl_dqi_queries(
    inputs: &AttentionInputs<'_>,
    teacher_lse: &[f32],
    qi: &[bf16],
    ki: &[bf16],
    indexer_lse: &[f32],
    loss_coeff: f32,
    queries: &[usize],
) -> Result<Vec<f32>> {
    let args = Args::checked(inputs, teacher_lse, qi, ki, indexer_lse, loss_coeff)?;
    expect_indices("query", queries, inputs.layout.total_q())?;
    let kl = Kl::new(&args, selected_blocks(inputs.layout, inputs.topk, queries));
    Ok(kl.dqi::<true>(queries))
}

/// dKI rows `[n, 128]` of the packed key rows `key_rows`; equal, bit for bit, to the same rows
/// of [`kl_backward`].
pub fn kl_dki_keys(
    inputs: &AttentionInputs<'_>,
    teacher_lse: &[f32],
    qi: &[bf16],
    ki: &[bf16],
    indexer_lse: &[f32],
    loss_coeff: f32,
    key_rows: Range<usize>,
) -> Result<Vec<f32>> {
    let args = Args::checked(inputs, teacher_lse, qi, ki, indexer_lse, loss_coeff)?;
    check_key_rows(&key_rows, inputs.layout.total_k())?;
    let table = BlockTable::new(inputs.layout);
    let blocks = table.overlapping(&key_rows);
    let mut needed = vec![false; NUM_KV_HEADS * table.len()];
    for g in 0..NUM_KV_HEADS {
        for &pb in &blocks {
            needed[g * table.len() + pb] = true;
        }
    }
    let kl = Kl::new(&args, needed);
    let visits = Visits::new(inputs.layout, inputs.topk);
    let per_block: Vec<(Range<usize>, Vec<f32>)> = blocks
        .par_iter()
        .map(|&pb| {
            let rows = kl.table.rows(pb).expect("overlapping blocks are stored");
            let mut dki = vec![0f32; rows.len() * D];
            kl.dki_block::<true>(pb, &visits, &mut Scratch::new(), &mut dki);
            (rows, dki)
        })
        .collect();
    let mut dki = vec![0f32; key_rows.len() * D];
    for (rows, block) in per_block {
        let (lo, hi) = (rows.start.max(key_rows.start), rows.end.min(key_rows.end));
        dki[(lo - key_rows.start) * D..(hi - key_rows.start) * D]
            .copy_from_slice(&block[(lo - rows.start) * D..(hi - rows.start) * D]);
    }
    Ok(dki)
}

struct Args<'a> {
    inputs: &'a AttentionInputs<'a>,
    teacher_lse: &'a [f32],
    qi: &'a [bf16],
    ki: &'a [bf16],
    indexer_lse: &'a [f32],
    loss_coeff: f32,
}

impl<'a> Args<'a> {
    /// The arguments of a public entry point, sizes checked.
    fn checked(
        inputs: &'a AttentionInputs<'a>,
        teacher_lse: &'a [f32],
        qi: &'a [bf16],
        ki: &'a [bf16],
        indexer_lse: &'a [f32],
        loss_coeff: f32,
    ) -> Result<Self> {
        check_kl_inputs(inputs, teacher_lse, qi.len(), ki.len())?;
        let t = inputs.layout.total_q();
        expect_len("indexer_lse", indexer_lse.len(), &[NUM_INDEX_HEADS, t])?;
        Ok(Self {
            inputs,
            teacher_lse,
            qi,
            ki,
            indexer_lse,
            loss_coeff,
        })
    }
}

/// Sizes shared by the gradients and the loss.
fn check_kl_inputs(
    inputs: &AttentionInputs<'_>,
    teacher_lse: &[f32],
    qi_len: usize,
    ki_len: usize,
) -> Result<()> {
    inputs.check_qk()?;
    let (t, tk) = (inputs.layout.total_q(), inputs.layout.total_k());
    expect_len("teacher_lse", teacher_lse.len(), &[t, NUM_Q_HEADS])?;
    expect_len("qi", qi_len, &[t, NUM_INDEX_HEADS, INDEX_DIM])?;
    expect_len("ki", ki_len, &[tk, 1, INDEX_DIM])
}

/// Full gradients; `ROUND = false` skips the bf16 rounding of dz (exact gradients for tests).
fn grads<const ROUND: bool>(args: &Args<'_>) -> KlGrads {
    let layout = args.inputs.layout;
    let all: Vec<usize> = (0..layout.total_q()).collect();
    let kl = Kl::new(args, selected_blocks(layout, args.inputs.topk, &all));
    let dqi = kl.dqi::<ROUND>(&all);
    let visits = Visits::new(layout, args.inputs.topk);
    let mut dki = vec![0f32; layout.total_k() * D];
    let chunks = kl.table.split_rows(&mut dki, D);
    chunks
        .into_par_iter()
        .for_each_init(Scratch::new, |s, (pb, chunk)| {
            kl.dki_block::<ROUND>(pb, &visits, s, chunk);
        });
    KlGrads { dqi, dki }
}

struct Kl<'a> {
    args: &'a Args<'a>,
    grad_scale: f32,
    table: BlockTable,
    k: KeyCache,
    ki: KeyCache,
}

/// Per-thread buffers for one (query, group).
struct Scratch {
    q: Vec<f32>,
    teacher_lse: [f32; HEADS],
    qi: [f32; INDEX_DIM],
    indexer_lse: f32,
    /// Teacher scores `[16, c]`.
    t: Vec<f32>,
    /// Student scores, then dz, `[c]`.
    dz: Vec<f32>,
}

impl Scratch {
    fn new() -> Self {
        Self {
            q: vec![0f32; GROUP_ROWS],
            teacher_lse: [0f32; HEADS],
            qi: [0f32; INDEX_DIM],
            indexer_lse: 0.0,
            t: vec![0f32; HEADS * BLOCK_SIZE],
            dz: vec![0f32; BLOCK_SIZE],
        }
    }
}

impl<'a> Kl<'a> {
    /// `needed[g · P + pb]`: blocks to convert (index keys for any group that needs one).
    fn new(args: &'a Args<'a>, needed: Vec<bool>) -> Self {
        let table = BlockTable::new(args.inputs.layout);
        let p = table.len();
        let any: Vec<bool> = (0..p)
            .map(|pb| (0..NUM_KV_HEADS).any(|g| needed[g * p + pb]))
            .collect();
        let k = KeyCache::new(&table, args.inputs.k, NUM_KV_HEADS, &needed);
        let ki = KeyCache::new(&table, args.ki, 1, &any);
        let t = args.inputs.layout.total_q().max(1) as f64;
        let grad_scale = (SOFTMAX_SCALE_F64 * args.loss_coeff as f64 / (4.0 * t)) as f32;
        Self {
            args,
            grad_scale,
            table,
            k,
            ki,
        }
    }

    fn load(&self, s: &mut Scratch, q: usize, g: usize) {
        let a = self.args;
        widen(a.inputs.q_group(q, g), &mut s.q);
        let heads = q * NUM_Q_HEADS + g * HEADS;
        s.teacher_lse
            .copy_from_slice(&a.teacher_lse[heads..heads + HEADS]);
        let at = (q * NUM_INDEX_HEADS + g) * INDEX_DIM;
        widen(&a.qi[at..at + INDEX_DIM], &mut s.qi);
        s.indexer_lse = a.indexer_lse[g * a.inputs.layout.total_q() + q];
    }

    /// dz over the `c` keys of one block of (query, group), into `s.dz[..c]`.
    fn dz_block<const ROUND: bool>(&self, s: &mut Scratch, g: usize, pb: usize, c: usize) {
        let (t, dz) = (&mut s.t[..HEADS * c], &mut s.dz[..c]);
        dot_rows(&s.q, self.k.block(g, pb, c), t, c);
        dot_rows(&s.qi, self.ki.block(0, pb, c), dz, c);
        for (j, z) in dz.iter_mut().enumerate() {
            let mut teacher = 0f32;
            for h in 0..HEADS {
                teacher += (t[h * c + j] * SOFTMAX_SCALE - s.teacher_lse[h]).exp();
            }
            let student = (*z * SOFTMAX_SCALE - s.indexer_lse).exp();
            let d = student - teacher / HEADS as f32;
            *z = if ROUND { round_bf16(d) } else { d };
        }
    }

    /// dQI rows `[n, 4, 128]`.
    fn dqi<const ROUND: bool>(&self, queries: &[usize]) -> Vec<f32> {
        let (layout, topk) = (self.args.inputs.layout, self.args.inputs.topk);
        let row = NUM_INDEX_HEADS * INDEX_DIM;
        let mut dqi = vec![0f32; queries.len() * row];
        dqi.par_chunks_mut(row)
            .zip(queries.par_iter())
            .for_each_init(Scratch::new, |s, (dqi, &q)| {
                let pos = QueryPos::of(layout, q);
                for (g, dqi) in dqi.chunks_exact_mut(INDEX_DIM).enumerate() {
                    let sel = Selection::new(topk_row(topk, layout.total_q(), g, q), &pos);
                    if sel.is_empty() {
                        continue;
                    }
                    self.load(s, q, g);
                    for (e, c) in sel.blocks() {
                        let pb = pos.phys_base + e;
                        self.dz_block::<ROUND>(s, g, pb, c);
                        accumulate(&s.dz[..c], c, self.ki.block(0, pb, c), dqi);
                    }
                    dqi.iter_mut().for_each(|x| *x *= self.grad_scale);
                }
            });
        dqi
    }

    /// dKI `[keys, 128]` of physical block `pb` (zeroed by the caller): groups in order, each
    /// over its ascending visiting queries.
    fn dki_block<const ROUND: bool>(
        &self,
        pb: usize,
        visits: &Visits,
        s: &mut Scratch,
        dki: &mut [f32],
    ) {
        for g in 0..NUM_KV_HEADS {
            for &q in visits.of(g, pb) {
                let pos = QueryPos::of(self.args.inputs.layout, q as usize);
                let c = pos.visible_keys(pb - pos.phys_base);
                self.load(s, q as usize, g);
                self.dz_block::<ROUND>(s, g, pb, c);
                accumulate(&s.dz[..c], 1, &s.qi, &mut dki[..c * D]);
            }
        }
        dki.iter_mut().for_each(|x| *x *= self.grad_scale);
    }
}
