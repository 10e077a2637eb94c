//! Attention forward: an exact softmax over each (query, group) token set, query-parallel.

use half::bf16;
use msa_plan::topology::{HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS, SOFTMAX_SCALE, TOPK_BLOCKS};
use rayon::prelude::*;

use super::{AttentionInputs, KvCache, GROUP_ROWS, HEADS, Q_ROW};
use crate::compare::{to_bf16, widen};
use crate::error::{expect_indices, Result};
use crate::gemm::{accumulate, dot_rows};
use crate::selection::{selected_blocks, topk_row, QueryPos, Selection};
use crate::softmax::{exp_shifted, lse};

/// Most tokens in one set: 16 full blocks.
const MAX_TOKENS: usize = TOPK_BLOCKS * msa_plan::topology::BLOCK_SIZE;

/// Attention output, unrounded.
#[derive(Debug, Clone, PartialEq)]
pub struct Forward {
    /// `[n, 64, 128]` f32: n = T, or the number of queries asked for.
    pub out: Vec<f32>,
    /// `[n, 64]` natural-log LSE; `-inf` for an empty selection (then the output row is 0).
    pub lse: Vec<f32>,
}

impl Forward {
    /// `out` rounded to bf16 (round to nearest even), as the kernels store it.
    pub fn out_bf16(&self) -> Vec<bf16> {
        to_bf16(&self.out)
    }
}

/// Forward of every query.
pub fn forward(inputs: &AttentionInputs<'_>) -> Result<Forward> {
    let all: Vec<usize> = (0..inputs.layout.total_q()).collect();
    forward_queries(inputs, &all)
}

/// Forward of the given packed queries; row i of the result belongs to `queries[i]`. Equal,
/// bit for bit, to the same rows of [`forward`].
pub fn forward_queries(inputs: &AttentionInputs<'_>, queries: &[usize]) -> Result<Forward> {
    inputs.check()?;
    expect_indices("query", queries, inputs.layout.total_q())?;
    let kv = KvCache::new(
        inputs,
        &selected_blocks(inputs.layout, inputs.topk, queries),
    );
    let mut out = vec![0f32; queries.len() * Q_ROW];
    let mut lse = vec![0f32; queries.len() * NUM_Q_HEADS];
    out.par_chunks_mut(Q_ROW)
        .zip(lse.par_chunks_mut(NUM_Q_HEADS))
        .zip(queries.par_iter())
        .for_each_init(Scratch::new, |scratch, ((out, lse), &q)| {
            let pos = QueryPos::of(inputs.layout, q);
            for g in 0..NUM_KV_HEADS {
                let sel =
                    Selection::new(topk_row(inputs.topk, inputs.layout.total_q(), g, q), &pos);
                let rows = g * GROUP_ROWS..(g + 1) * GROUP_ROWS;
                let heads = g * HEADS..(g + 1) * HEADS;
                if sel.is_empty() {
                    lse[heads].fill(f32::NEG_INFINITY);
                    continue;
                }
                widen(inputs.q_group(q, g), &mut scratch.q);
                group_forward(&kv, g, &pos, &sel, scratch, &mut out[rows], &mut lse[heads]);
            }
        });
    Ok(Forward { out, lse })
}

struct Scratch {
    q: Vec<f32>,
    p: Vec<f32>,
}

impl Scratch {
    fn new() -> Self {
        Self {
            q: vec![0f32; GROUP_ROWS],
            p: vec![0f32; HEADS * MAX_TOKENS],
        }
    }
}

/// The 16 heads of one group (queries already in `scratch.q`) over a non-empty set: scores
/// over the whole set, one softmax, `P·V` block by block.
fn group_forward(
    kv: &KvCache,
    g: usize,
    pos: &QueryPos,
    sel: &Selection,
    scratch: &mut Scratch,
    out: &mut [f32],
    lse_out: &mut [f32],
) {
    let n = sel.tokens();
    let p = &mut scratch.p[..HEADS * n];
    let mut at = 0;
    for (e, c) in sel.blocks() {
        dot_rows(
            &scratch.q,
            kv.k.block(g, pos.phys_base + e, c),
            &mut p[at..],
            n,
        );
        at += c;
    }
    let mut sums = [0f64; HEADS];
    for (h, row) in p.chunks_exact_mut(n).enumerate() {
        let (m, sum) = exp_shifted(row, SOFTMAX_SCALE);
        lse_out[h] = lse(m, sum);
        sums[h] = sum;
    }
    let mut at = 0;
    for (e, c) in sel.blocks() {
        accumulate(&p[at..], n, kv.v.block(g, pos.phys_base + e, c), out);
        at += c;
    }
    for (row, &sum) in out.chunks_exact_mut(HEAD_DIM).zip(&sums) {
        let l = sum as f32;
        row.iter_mut().for_each(|x| *x /= l);
    }
}
