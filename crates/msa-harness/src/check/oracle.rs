//! An f64 oracle written straight from the contract's definition (§2.1), one query or one key
//! at a time. It shares no code with `msa-ref`, so `msa run --backend cpu` checks the CPU
//! reference against something independent, and it is cheap enough for spot checks of any case.

use half::bf16;
use msa_plan::topology::{
    BLOCK_SIZE, HEADS_PER_GROUP, HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS,
    SOFTMAX_SCALE_F64, TOPK_BLOCKS,
};
use msa_plan::VarlenLayout;

/// The tensors of one attention problem (layouts of docs/design.md).
#[derive(Clone, Copy)]
pub struct Problem<'a> {
    pub layout: &'a VarlenLayout,
    pub q: &'a [bf16],
    pub k: &'a [bf16],
    pub v: &'a [bf16],
    pub topk: &'a [i32],
    pub dout: Option<&'a [bf16]>,
    /// Index queries `[T, 4, 128]` and the shared index keys `[Tk, 1, 128]`.
    pub index: Option<(&'a [bf16], &'a [bf16])>,
}

fn row(x: &[bf16], r: usize, heads: usize, h: usize) -> impl Iterator<Item = f64> + '_ {
    let o = (r * heads + h) * HEAD_DIM;
    x[o..o + HEAD_DIM].iter().map(|v| v.to_f64())
}

/// ⟨a, b⟩ of two rows in f64, summed in element order.
fn dot(a: impl Iterator<Item = f64>, b: impl Iterator<Item = f64>) -> f64 {
    a.zip(b).map(|(x, y)| x * y).sum()
}

impl Problem<'_> {
    /// The attention score scale·⟨q[t, h], k[r, h/16]⟩.
    fn score(&self, t: usize, h: usize, r: usize) -> f64 {
        let g = h / HEADS_PER_GROUP;
        SOFTMAX_SCALE_F64
            * dot(
                row(self.q, t, NUM_Q_HEADS, h),
                row(self.k, r, NUM_KV_HEADS, g),
            )
    }

    /// dP of (query `t`, head `h`, key row `r`): ⟨dout[t, h], v[r, h/16]⟩.
    fn dout_v(&self, dout: &[bf16], t: usize, h: usize, r: usize) -> f64 {
        let g = h / HEADS_PER_GROUP;
        dot(
            row(dout, t, NUM_Q_HEADS, h),
            row(self.v, r, NUM_KV_HEADS, g),
        )
    }

    /// Packed K rows of the token set of (query `t`, group `g`), by definition.
    pub fn token_set(&self, t: usize, g: usize) -> Vec<usize> {
        let (b, _, p) = self.layout.query_coords(t);
        let f = self.layout.fragment(b);
        let sel = &self.topk[(g * self.layout.total_q() + t) * TOPK_BLOCKS..][..TOPK_BLOCKS];
        (0..=p)
            .filter(|j| sel.contains(&((j / BLOCK_SIZE) as i32)))
            .map(|j| f.k_base + j)
            .collect()
    }

    /// O[t, h, :] and LSE[t, h] in f64 (LSE = −inf and O = 0 for an empty set).
    pub fn attention_row(&self, t: usize, h: usize) -> (Vec<f64>, f64) {
        let g = h / HEADS_PER_GROUP;
        let keys = self.token_set(t, g);
        let s: Vec<f64> = keys.iter().map(|&r| self.score(t, h, r)).collect();
        let mut out = vec![0f64; HEAD_DIM];
        if s.is_empty() {
            return (out, f64::NEG_INFINITY);
        }
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
        for (&r, &x) in keys.iter().zip(&s) {
            let p = (x - m).exp() / l;
            for (o, vv) in out.iter_mut().zip(row(self.v, r, NUM_KV_HEADS, g)) {
                *o += p * vv;
            }
        }
        (out, m + l.ln())
    }

    /// dQ[t, h, :] in f64 (delta from the f64 O).
    pub fn dq_row(&self, t: usize, h: usize) -> Vec<f64> {
        let dout = self.dout.expect("dq_row needs dout");
        let g = h / HEADS_PER_GROUP;
        let (o, lse) = self.attention_row(t, h);
        let delta: f64 = o
            .iter()
            .zip(row(dout, t, NUM_Q_HEADS, h))
            .map(|(a, b)| a * b)
            .sum();
        let mut dq = vec![0f64; HEAD_DIM];
        for r in self.token_set(t, g) {
            let s = self.score(t, h, r);
            let p = (s - lse).exp();
            let dp = self.dout_v(dout, t, h, r);
            let ds = SOFTMAX_SCALE_F64 * p * (dp - delta);
            for (d, kk) in dq.iter_mut().zip(row(self.k, r, NUM_KV_HEADS, g)) {
                *d += ds * kk;
            }
        }
        dq
    }

    /// (LSE, delta) of (query `t`, head `h`) in f64, delta = Σ dout·O.
    pub fn row_stats(&self, t: usize, h: usize) -> (f64, f64) {
        let dout = self.dout.expect("row_stats needs dout");
        let (o, lse) = self.attention_row(t, h);
        (
            lse,
            o.iter()
                .zip(row(dout, t, NUM_Q_HEADS, h))
                .map(|(a, b)| a * b)
                .sum(),
        )
    }

    /// Queries whose token set for group `g` holds packed key row `r`.
    pub fn key_queries(&self, g: usize, r: usize) -> Vec<usize> {
        let l = self.layout;
        let mut queries = Vec::new();
        for f in l.fragments() {
            if r < f.k_base || r >= f.k_base + f.k_len {
                continue;
            }
            let j = r - f.k_base;
            for i in 0..f.q_len {
                let t = f.q_start + i;
                let sel = &self.topk[(g * l.total_q() + t) * TOPK_BLOCKS..][..TOPK_BLOCKS];
                if f.position(i) >= j && sel.contains(&((j / BLOCK_SIZE) as i32)) {
                    queries.push(t);
                }
            }
        }
        queries
    }

    /// dK and dV of packed key row `r`, group `g`, in f64, over `queries` (from
    /// [`Self::key_queries`]), with each (query, head)'s (LSE, delta) from `stats`.
    pub fn dkv_row(
        &self,
        g: usize,
        r: usize,
        queries: &[usize],
        mut stats: impl FnMut(usize, usize) -> (f64, f64),
    ) -> (Vec<f64>, Vec<f64>) {
        let dout = self.dout.expect("dkv_row needs dout");
        let (mut dk, mut dv) = (vec![0f64; HEAD_DIM], vec![0f64; HEAD_DIM]);
        for &t in queries {
            for h in g * HEADS_PER_GROUP..(g + 1) * HEADS_PER_GROUP {
                let (lse, delta) = stats(t, h);
                let s = self.score(t, h, r);
                let p = (s - lse).exp();
                let dp = self.dout_v(dout, t, h, r);
                let ds = SOFTMAX_SCALE_F64 * p * (dp - delta);
                let pairs = row(self.q, t, NUM_Q_HEADS, h).zip(row(dout, t, NUM_Q_HEADS, h));
                for ((a, b), (qq, dd)) in dk.iter_mut().zip(dv.iter_mut()).zip(pairs) {
                    *a += ds * qq;
                    *b += p * dd;
                }
            }
        }
        (dk, dv)
    }
}

impl Problem<'_> {
    fn index_score(&self, t: usize, g: usize, r: usize) -> f64 {
        let (qi, ki) = self.index.expect("indexer checks need qi and ki");
        SOFTMAX_SCALE_F64 * dot(row(qi, t, NUM_INDEX_HEADS, g), row(ki, r, 1, 0))
    }

    /// Indexer block scores of (query `t`, index head `g`): the max of qi·ki/√128 over the
    /// visible tokens of each block `0..=p/128`.
    pub fn index_block_scores(&self, t: usize, g: usize) -> Vec<f64> {
        let (b, _, p) = self.layout.query_coords(t);
        let f = self.layout.fragment(b);
        let mut out = vec![f64::NEG_INFINITY; p / BLOCK_SIZE + 1];
        for j in 0..=p {
            let s = self.index_score(t, g, f.k_base + j);
            out[j / BLOCK_SIZE] = out[j / BLOCK_SIZE].max(s);
        }
        out
    }

    /// logsumexp of qi·ki/√128 over the token set that `selection` (`[4, T, 16]`) gives
    /// (query `t`, head `g`).
    pub fn index_selection_lse(&self, selection: &[i32], t: usize, g: usize) -> f64 {
        let scratch = Problem {
            topk: selection,
            ..*self
        };
        let s: Vec<f64> = scratch
            .token_set(t, g)
            .iter()
            .map(|&r| self.index_score(t, g, r))
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return m;
        }
        m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    }

    /// dQI[t, g, :] of the KL backward (contract §3.2) in f64, with the teacher LSE and the
    /// index LSE recomputed exactly; dz is rounded to bf16 as the contract says.
    pub fn kl_dqi_row(&self, t: usize, g: usize, loss_coeff: f64) -> Vec<f64> {
        let (_, ki) = self.index.expect("KL checks need qi and ki");
        let keys = self.token_set(t, g);
        let ilse = self.index_selection_lse(self.topk, t, g);
        let mut teacher = vec![0f64; keys.len()];
        for h in g * HEADS_PER_GROUP..(g + 1) * HEADS_PER_GROUP {
            let (_, lse) = self.attention_row(t, h);
            for (tj, &r) in teacher.iter_mut().zip(&keys) {
                let s = self.score(t, h, r);
                *tj += (s - lse).exp() / HEADS_PER_GROUP as f64;
            }
        }
        let grad_scale =
            SOFTMAX_SCALE_F64 * loss_coeff / (NUM_INDEX_HEADS * self.layout.total_q()) as f64;
        let mut dqi = vec![0f64; INDEX_DIM];
        for (&r, tj) in keys.iter().zip(&teacher) {
            let sigma = (self.index_score(t, g, r) - ilse).exp();
            let dz = bf16::from_f64(sigma - tj).to_f64();
            for (d, kk) in dqi.iter_mut().zip(row(ki, r, 1, 0)) {
                *d += grad_scale * dz * kk;
            }
        }
        dqi
    }
}
