//! Attention backward: a query-parallel pass for dQ and a key-block-parallel pass for dK/dV.
//!
//! Both passes get P and dS of a (query, group, block) from the same function, so they agree
//! on every value. Each output element has one owner that sums in a fixed order: no atomics,
//! bitwise deterministic whatever the thread count.

use std::ops::Range;

use half::bf16;
use msa_plan::topology::{HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS, SOFTMAX_SCALE};
use rayon::prelude::*;

use super::{AttentionInputs, KvCache, GROUP_ROWS, HEADS, Q_ROW};
use crate::blocks::BlockTable;
use crate::compare::widen;
use crate::error::{expect_indices, expect_len, RefError, Result};
use crate::gemm::{accumulate, dot_rows, D};
use crate::selection::{selected_blocks, topk_row, QueryPos, Selection, Visits};

const BLOCK: usize = msa_plan::topology::BLOCK_SIZE;
/// Elements of one packed key row of dK/dV, `[4, 128]`.
const KEY_ROW: usize = NUM_KV_HEADS * HEAD_DIM;

/// Gradients, unrounded f32, in the shapes of q, k and v.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads {
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
}

/// Gradients of every input. `out` is the bf16 forward output and `lse` the forward LSE:
/// as in the kernels, `delta = rowsum(dout · out)` comes from the bf16 `out` and
/// `P = exp(scale·qk − lse)` from the given `lse` (an `-inf` LSE reads as 0, as in the
/// kernels' preprocess). Keys no query selected get exact zeros.
pub fn backward(
    inputs: &AttentionInputs<'_>,
    dout: &[bf16],
    out: &[bf16],
    lse: &[f32],
) -> Result<Grads> {
    check_upstream(inputs, dout, out, lse)?;
    Ok(backward_with_delta(inputs, dout, &delta(dout, out), lse))
}

/// dQ of the given packed queries, `[n, 64, 128]` in the given order; equal, bit for bit, to
/// the same rows of [`backward`].
pub fn backward_dq_queries(
    inputs: &AttentionInputs<'_>,
    dout: &[bf16],
    out: &[bf16],
    lse: &[f32],
    queries: &[usize],
) -> Result<Vec<f32>> {
    check_upstream(inputs, dout, out, lse)?;
    expect_indices("query", queries, inputs.layout.total_q())?;
    let kv = KvCache::new(
        inputs,
        &selected_blocks(inputs.layout, inputs.topk, queries),
    );
    let delta = delta(dout, out);
    let pass = Pass {
        inputs,
        kv: &kv,
        dout,
        delta: &delta,
        lse,
    };
    Ok(pass.dq(queries))
}

/// dK and dV of `group` for the packed key rows `key_rows`, `[n, 128]` each; equal, bit for
/// bit, to the same rows and group of [`backward`].
pub fn backward_dkv_keys(
    inputs: &AttentionInputs<'_>,
    dout: &[bf16],
    out: &[bf16],
    lse: &[f32],
    group: usize,
    key_rows: Range<usize>,
) -> Result<(Vec<f32>, Vec<f32>)> {
    check_upstream(inputs, dout, out, lse)?;
    expect_indices("group", &[group], NUM_KV_HEADS)?;
    check_key_rows(&key_rows, inputs.layout.total_k())?;
    let table = BlockTable::new(inputs.layout);
    let blocks = table.overlapping(&key_rows);
    let mut needed = vec![false; NUM_KV_HEADS * table.len()];
    for &pb in &blocks {
        needed[group * table.len() + pb] = true;
    }
    let kv = KvCache::new(inputs, &needed);
    let delta = delta(dout, out);
    let pass = Pass {
        inputs,
        kv: &kv,
        dout,
        delta: &delta,
        lse,
    };
    let visits = Visits::new(inputs.layout, inputs.topk);
    let per_block: Vec<(Range<usize>, Vec<f32>, Vec<f32>)> = blocks
        .par_iter()
        .map(|&pb| {
            let rows = table.rows(pb).expect("overlapping blocks are stored");
            let (mut dk, mut dv) = (vec![0f32; rows.len() * D], vec![0f32; rows.len() * D]);
            pass.dkv_block(
                group,
                pb,
                visits.of(group, pb),
                &mut Scratch::new(),
                &mut dk,
                &mut dv,
            );
            (rows, dk, dv)
        })
        .collect();
    let n = key_rows.len();
    let (mut dk, mut dv) = (vec![0f32; n * D], vec![0f32; n * D]);
    for (rows, bk, bv) in per_block {
        let (lo, hi) = (rows.start.max(key_rows.start), rows.end.min(key_rows.end));
        let src = (lo - rows.start) * D..(hi - rows.start) * D;
        let dst = (lo - key_rows.start) * D..(hi - key_rows.start) * D;
        dk[dst.clone()].copy_from_slice(&bk[src.clone()]);
        dv[dst].copy_from_slice(&bv[src]);
    }
    Ok((dk, dv))
}

pub(crate) fn check_key_rows(key_rows: &Range<usize>, total_k: usize) -> Result<()> {
    if key_rows.start > key_rows.end || key_rows.end > total_k {
        let value = format!("{key_rows:?}");
        return Err(RefError::OutOfRange {
            what: "key rows",
            value,
            limit: total_k,
        });
    }
    Ok(())
}

fn check_upstream(
    inputs: &AttentionInputs<'_>,
    dout: &[bf16],
    out: &[bf16],
    lse: &[f32],
) -> Result<()> {
    inputs.check()?;
    let t = inputs.layout.total_q();
    expect_len("dout", dout.len(), &[t, NUM_Q_HEADS, HEAD_DIM])?;
    expect_len("out", out.len(), &[t, NUM_Q_HEADS, HEAD_DIM])?;
    expect_len("lse", lse.len(), &[t, NUM_Q_HEADS])
}

/// `delta[t, h] = Σ_d dout·out` from the bf16 tensors (f64 sum, rounded once).
fn delta(dout: &[bf16], out: &[bf16]) -> Vec<f32> {
    let mut delta = vec![0f32; dout.len() / HEAD_DIM];
    delta
        .par_chunks_mut(NUM_Q_HEADS)
        .enumerate()
        .for_each(|(t, row)| {
            for (h, d) in row.iter_mut().enumerate() {
                let at = (t * NUM_Q_HEADS + h) * HEAD_DIM;
                let pairs = dout[at..at + HEAD_DIM].iter().zip(&out[at..at + HEAD_DIM]);
                *d = pairs.map(|(a, b)| a.to_f64() * b.to_f64()).sum::<f64>() as f32;
            }
        });
    delta
}

/// The backward with `delta` `[T, 64]` given (tests pass the exact one).
pub(crate) fn backward_with_delta(
    inputs: &AttentionInputs<'_>,
    dout: &[bf16],
    delta: &[f32],
    lse: &[f32],
) -> Grads {
    let all: Vec<usize> = (0..inputs.layout.total_q()).collect();
    let kv = KvCache::new(inputs, &selected_blocks(inputs.layout, inputs.topk, &all));
    let pass = Pass {
        inputs,
        kv: &kv,
        dout,
        delta,
        lse,
    };
    let dq = pass.dq(&all);
    let (dk, dv) = pass.dkv(&Visits::new(inputs.layout, inputs.topk));
    Grads { dq, dk, dv }
}

struct Pass<'a> {
    inputs: &'a AttentionInputs<'a>,
    kv: &'a KvCache,
    dout: &'a [bf16],
    delta: &'a [f32],
    lse: &'a [f32],
}

/// Per-thread buffers: one (query, group)'s rows and one block's P and dS.
struct Scratch {
    q: Vec<f32>,
    dout: Vec<f32>,
    delta: [f32; HEADS],
    lse: [f32; HEADS],
    /// `[16, c]`, then transposed to `[c, 16]` in `pt`.
    p: Vec<f32>,
    ds: Vec<f32>,
    pt: Vec<f32>,
    dst: Vec<f32>,
}

impl Scratch {
    fn new() -> Self {
        let tile = HEADS * BLOCK;
        Self {
            q: vec![0f32; GROUP_ROWS],
            dout: vec![0f32; GROUP_ROWS],
            delta: [0f32; HEADS],
            lse: [0f32; HEADS],
            p: vec![0f32; tile],
            ds: vec![0f32; tile],
            pt: vec![0f32; tile],
            dst: vec![0f32; tile],
        }
    }
}

impl Pass<'_> {
    fn load(&self, s: &mut Scratch, q: usize, g: usize) {
        widen(self.inputs.q_group(q, g), &mut s.q);
        let at = q * Q_ROW + g * GROUP_ROWS;
        widen(&self.dout[at..at + GROUP_ROWS], &mut s.dout);
        let heads = q * NUM_Q_HEADS + g * HEADS..q * NUM_Q_HEADS + (g + 1) * HEADS;
        s.delta.copy_from_slice(&self.delta[heads.clone()]);
        for (l, &x) in s.lse.iter_mut().zip(&self.lse[heads]) {
            *l = if x == f32::NEG_INFINITY { 0.0 } else { x };
        }
    }

    /// `P = exp(scale·QKᵀ − lse)` and `dS = P ∘ (dO·Vᵀ − delta)` over `c` keys, `[16, c]`.
    fn probs_grads(&self, s: &mut Scratch, kb: &[f32], vb: &[f32], c: usize) {
        let (p, ds) = (&mut s.p[..HEADS * c], &mut s.ds[..HEADS * c]);
        dot_rows(&s.q, kb, p, c);
        dot_rows(&s.dout, vb, ds, c);
        for h in 0..HEADS {
            let (lse, delta) = (s.lse[h], s.delta[h]);
            for (x, d) in p[h * c..(h + 1) * c]
                .iter_mut()
                .zip(&mut ds[h * c..(h + 1) * c])
            {
                *x = (*x * SOFTMAX_SCALE - lse).exp();
                *d = *x * (*d - delta);
            }
        }
    }

    /// dQ rows `[n, 64, 128]` of `queries`: per (query, group), `scale · Σ_blocks dS·K`.
    fn dq(&self, queries: &[usize]) -> Vec<f32> {
        let (layout, topk) = (self.inputs.layout, self.inputs.topk);
        let mut dq = vec![0f32; queries.len() * Q_ROW];
        dq.par_chunks_mut(Q_ROW)
            .zip(queries.par_iter())
            .for_each_init(Scratch::new, |s, (dq, &q)| {
                let pos = QueryPos::of(layout, q);
                for (g, dq) in dq.chunks_exact_mut(GROUP_ROWS).enumerate() {
                    let sel = Selection::new(topk_row(topk, layout.total_q(), g, q), &pos);
                    if sel.is_empty() {
                        continue;
                    }
                    self.load(s, q, g);
                    for (e, c) in sel.blocks() {
                        let pb = pos.phys_base + e;
                        let kb = self.kv.k.block(g, pb, c);
                        self.probs_grads(s, kb, self.kv.v.block(g, pb, c), c);
                        accumulate(&s.ds[..HEADS * c], c, kb, dq);
                    }
                    dq.iter_mut().for_each(|x| *x *= SOFTMAX_SCALE);
                }
            });
        dq
    }

    /// dK/dV `[keys, 128]` of `group`'s physical block `pb` (zeroed by the caller), summed
    /// over `visits` (ascending queries of every fragment of the document).
    fn dkv_block(
        &self,
        g: usize,
        pb: usize,
        visits: &[u32],
        s: &mut Scratch,
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        let keys = dk.len() / D;
        let (kb, vb) = (self.kv.k.block(g, pb, keys), self.kv.v.block(g, pb, keys));
        for &q in visits {
            let pos = QueryPos::of(self.inputs.layout, q as usize);
            let c = pos.visible_keys(pb - pos.phys_base);
            self.load(s, q as usize, g);
            self.probs_grads(s, &kb[..c * D], &vb[..c * D], c);
            for h in 0..HEADS {
                for j in 0..c {
                    s.pt[j * HEADS + h] = s.p[h * c + j];
                    s.dst[j * HEADS + h] = s.ds[h * c + j];
                }
            }
            accumulate(&s.pt[..c * HEADS], HEADS, &s.dout, &mut dv[..c * D]);
            accumulate(&s.dst[..c * HEADS], HEADS, &s.q, &mut dk[..c * D]);
        }
        dk.iter_mut().for_each(|x| *x *= SOFTMAX_SCALE);
    }

    /// dK and dV of every key, `[Tk, 4, 128]`: one task per stored physical block.
    fn dkv(&self, visits: &Visits) -> (Vec<f32>, Vec<f32>) {
        let total_k = self.inputs.layout.total_k();
        let (mut dk, mut dv) = (vec![0f32; total_k * KEY_ROW], vec![0f32; total_k * KEY_ROW]);
        let chunks_k = self.kv.table.split_rows(&mut dk, KEY_ROW);
        let chunks_v = self.kv.table.split_rows(&mut dv, KEY_ROW);
        let init = || (Scratch::new(), vec![0f32; BLOCK * D], vec![0f32; BLOCK * D]);
        chunks_k.into_par_iter().zip(chunks_v).for_each_init(
            init,
            |(s, bk, bv), ((pb, ck), (_, cv))| {
                let keys = ck.len() / KEY_ROW;
                for g in 0..NUM_KV_HEADS {
                    let visits = visits.of(g, pb);
                    if visits.is_empty() {
                        continue;
                    }
                    let (bk, bv) = (&mut bk[..keys * D], &mut bv[..keys * D]);
                    bk.fill(0.0);
                    bv.fill(0.0);
                    self.dkv_block(g, pb, visits, s, bk, bv);
                    for r in 0..keys {
                        let at = r * KEY_ROW + g * D;
                        ck[at..at + D].copy_from_slice(&bk[r * D..(r + 1) * D]);
                        cv[at..at + D].copy_from_slice(&bv[r * D..(r + 1) * D]);
                    }
                }
            },
        );
        (dk, dv)
    }
}
