//! An f64 oracle written straight from the contract's definitions (docs/contract.md §2, §3),
//! one query or one key at a time. It shares no code with `msa-ref`: the CPU reference's tests
//! judge it against this, `msa run --backend cpu` spot-checks the CPU backend with it, and it is
//! cheap enough for spot checks of any case.
//!
//! Inputs are bf16 (what every call takes) or f64 ([`Problem`] is generic over [`Value`]), so a
//! test can differentiate the oracle's outputs by finite differences of exact inputs.

use half::bf16;
use msa_plan::topology::{
    BLOCK_SIZE, HEADS_PER_GROUP, HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS,
    SOFTMAX_SCALE_F64, TOPK_BLOCKS,
};
use msa_plan::VarlenLayout;

/// An input element: read as f64, exactly.
pub trait Value: Copy + Send + Sync {
    fn to_f64(self) -> f64;
}

impl Value for bf16 {
    #[inline]
    fn to_f64(self) -> f64 {
        // Exact: a bf16 is the upper half of an f32.
        f32::from_bits((self.to_bits() as u32) << 16) as f64
    }
}

impl Value for f32 {
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Value for f64 {
    #[inline]
    fn to_f64(self) -> f64 {
        self
    }
}

/// The tensors of one attention problem (layouts of docs/contract.md §1).
pub struct Problem<'a, T: Value = bf16> {
    pub layout: &'a VarlenLayout,
    pub q: &'a [T],
    pub k: &'a [T],
    pub v: &'a [T],
    pub topk: &'a [i32],
    pub dout: Option<&'a [T]>,
    /// Index queries `[T, 4, 128]` and the shared index keys `[Tk, 1, 128]`.
    pub index: Option<(&'a [T], &'a [T])>,
}

impl<T: Value> Clone for Problem<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Value> Copy for Problem<'_, T> {}

#[inline]
fn row<T: Value>(x: &[T], r: usize, heads: usize, h: usize) -> impl Iterator<Item = f64> + '_ {
    let o = (r * heads + h) * HEAD_DIM;
    x[o..o + HEAD_DIM].iter().map(|v| v.to_f64())
}

/// ⟨a, b⟩ of two rows in f64, summed in element order.
#[inline]
fn dot(a: impl Iterator<Item = f64>, b: impl Iterator<Item = f64>) -> f64 {
    a.zip(b).map(|(x, y)| x * y).sum()
}

impl<T: Value> Problem<'_, T> {
    /// The attention score scale·⟨q[t, h], k[r, h/16]⟩.
    pub fn score(&self, t: usize, h: usize, r: usize) -> f64 {
        let g = h / HEADS_PER_GROUP;
        SOFTMAX_SCALE_F64
            * dot(
                row(self.q, t, NUM_Q_HEADS, h),
                row(self.k, r, NUM_KV_HEADS, g),
            )
    }

    /// dP of (query `t`, head `h`, key row `r`): ⟨dout[t, h], v[r, h/16]⟩.
    fn dout_v(&self, dout: &[T], t: usize, h: usize, r: usize) -> f64 {
        let g = h / HEADS_PER_GROUP;
        dot(
            row(dout, t, NUM_Q_HEADS, h),
            row(self.v, r, NUM_KV_HEADS, g),
        )
    }

    /// Whether `selection` (`[4, T, 16]`) lists the block of document key `j` for (query `t`,
    /// group `g`) and `j` is visible from position `p`: the definition of the token set.
    fn selects(&self, selection: &[i32], t: usize, g: usize, p: usize, j: usize) -> bool {
        let sel = &selection[(g * self.layout.total_q() + t) * TOPK_BLOCKS..][..TOPK_BLOCKS];
        j <= p && sel.contains(&((j / BLOCK_SIZE) as i32))
    }

    /// Packed K rows of the token set of (query `t`, group `g`), by definition.
    pub fn token_set(&self, t: usize, g: usize) -> Vec<usize> {
        self.selection_token_set(self.topk, t, g)
    }

    fn selection_token_set(&self, selection: &[i32], t: usize, g: usize) -> Vec<usize> {
        let (b, _, p) = self.layout.query_coords(t);
        let f = self.layout.fragment(b);
        (0..=p)
            .filter(|&j| self.selects(selection, t, g, p, j))
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

    /// dQ[t, h, :] in f64 (LSE and delta from the f64 O).
    pub fn dq_row(&self, t: usize, h: usize) -> Vec<f64> {
        let (lse, delta) = self.row_stats(t, h);
        self.dq_row_given(t, h, lse, delta)
    }

    /// dQ[t, h, :] in f64 with the (LSE, delta) the backward is given: a backend's backward
    /// takes delta from its *bf16* forward output (docs/contract.md §2.4), and on peaked
    /// softmaxes dP − delta cancels so far that this rounding alone moves dQ by ~1% against the
    /// exact delta; a check of a backend's dQ gives it the backend's statistics.
    pub fn dq_row_given(&self, t: usize, h: usize, lse: f64, delta: f64) -> Vec<f64> {
        let dout = self.dout.expect("dq_row needs dout");
        let g = h / HEADS_PER_GROUP;
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

    /// Queries whose token set for group `g` holds packed key row `r`, ascending.
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
                if self.selects(self.topk, t, g, f.position(i), j) {
                    queries.push(t);
                }
            }
        }
        queries.sort_unstable();
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

impl<T: Value> Problem<'_, T> {
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
        let s: Vec<f64> = self
            .selection_token_set(selection, t, g)
            .iter()
            .map(|&r| self.index_score(t, g, r))
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return m;
        }
        m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
    }

    /// The KL's `grad_scale = (1/√128)·loss_coeff / (4·T)`.
    fn grad_scale(&self, loss_coeff: f64) -> f64 {
        SOFTMAX_SCALE_F64 * loss_coeff / (NUM_INDEX_HEADS * self.layout.total_q()) as f64
    }

    /// `dz(r) = bf16(σ(r) − t̄(r))` of (query `t`, group `g`) for key row `r` of its token set,
    /// with the teacher's and the student's LSEs given.
    fn kl_dz(
        &self,
        t: usize,
        g: usize,
        r: usize,
        teacher_lse: &mut impl FnMut(usize, usize) -> f64,
        index_lse: f64,
    ) -> f64 {
        let teacher: f64 = (g * HEADS_PER_GROUP..(g + 1) * HEADS_PER_GROUP)
            .map(|h| (self.score(t, h, r) - teacher_lse(t, h)).exp())
            .sum::<f64>()
            / HEADS_PER_GROUP as f64;
        let sigma = (self.index_score(t, g, r) - index_lse).exp();
        bf16::from_f64(sigma - teacher).to_f64()
    }

    /// dQI[t, g, :] of the KL backward (docs/contract.md §3.2) in f64, with the teacher LSE and
    /// the index LSE recomputed exactly; dz is rounded to bf16 as the contract says.
    pub fn kl_dqi_row(&self, t: usize, g: usize, loss_coeff: f64) -> Vec<f64> {
        let (_, ki) = self.index.expect("KL checks need qi and ki");
        let ilse = self.index_selection_lse(self.topk, t, g);
        let lse = |t: usize, h: usize| self.attention_row(t, h).1;
        let teacher: Vec<f64> = (g * HEADS_PER_GROUP..(g + 1) * HEADS_PER_GROUP)
            .map(|h| lse(t, h))
            .collect();
        let mut teacher_lse = |_: usize, h: usize| teacher[h - g * HEADS_PER_GROUP];
        let grad_scale = self.grad_scale(loss_coeff);
        let mut dqi = vec![0f64; INDEX_DIM];
        for r in self.token_set(t, g) {
            let dz = self.kl_dz(t, g, r, &mut teacher_lse, ilse);
            for (d, kk) in dqi.iter_mut().zip(row(ki, r, 1, 0)) {
                *d += grad_scale * dz * kk;
            }
        }
        dqi
    }

    /// dKI[r, :] of the KL backward (docs/contract.md §3.2) in f64: the sum over the index heads
    /// g and the queries t whose token set of g holds key row `r` of `grad_scale·dz·qi[t, g]`,
    /// with `teacher_lse(t, h)` (the attention LSE) and `index_lse(g, t)` (the student's LSE
    /// over the same token set) given, as the kernel is given them: a key that thousands of
    /// queries attend to stays cheap.
    pub fn kl_dki_row(
        &self,
        r: usize,
        loss_coeff: f64,
        mut teacher_lse: impl FnMut(usize, usize) -> f64,
        mut index_lse: impl FnMut(usize, usize) -> f64,
    ) -> Vec<f64> {
        let (qi, _) = self.index.expect("KL checks need qi and ki");
        let grad_scale = self.grad_scale(loss_coeff);
        let mut dki = vec![0f64; INDEX_DIM];
        for g in 0..NUM_INDEX_HEADS {
            for t in self.key_queries(g, r) {
                let dz = self.kl_dz(t, g, r, &mut teacher_lse, index_lse(g, t));
                for (d, qq) in dki.iter_mut().zip(row(qi, t, NUM_INDEX_HEADS, g)) {
                    *d += grad_scale * dz * qq;
                }
            }
        }
        dki
    }
}

/// The whole forward by [`Problem::attention_row`]: `(out [T, 64, 128], lse [T, 64])`.
pub fn dense_forward<T: Value>(p: &Problem<'_, T>) -> (Vec<f64>, Vec<f64>) {
    let t = p.layout.total_q();
    let (mut out, mut lse) = (
        Vec::with_capacity(t * NUM_Q_HEADS * HEAD_DIM),
        Vec::with_capacity(t * NUM_Q_HEADS),
    );
    for q in 0..t {
        for h in 0..NUM_Q_HEADS {
            let (o, l) = p.attention_row(q, h);
            out.extend(o);
            lse.push(l);
        }
    }
    (out, lse)
}

/// Every gradient of `Σ dout·O` by [`Problem::dq_row`] and [`Problem::dkv_row`] with the f64
/// statistics: `[dq, dk, dv]` in the layouts of q, k and v.
pub fn dense_gradients<T: Value>(p: &Problem<'_, T>) -> [Vec<f64>; 3] {
    let (t, tk) = (p.layout.total_q(), p.layout.total_k());
    let stats: Vec<(f64, f64)> = (0..t * NUM_Q_HEADS)
        .map(|i| p.row_stats(i / NUM_Q_HEADS, i % NUM_Q_HEADS))
        .collect();
    let dq: Vec<f64> = (0..t * NUM_Q_HEADS)
        .flat_map(|i| p.dq_row(i / NUM_Q_HEADS, i % NUM_Q_HEADS))
        .collect();
    let (mut dk, mut dv) = (
        vec![0f64; tk * NUM_KV_HEADS * HEAD_DIM],
        vec![0f64; tk * NUM_KV_HEADS * HEAD_DIM],
    );
    for r in 0..tk {
        for g in 0..NUM_KV_HEADS {
            let queries = p.key_queries(g, r);
            let (a, b) = p.dkv_row(g, r, &queries, |t, h| stats[t * NUM_Q_HEADS + h]);
            let at = (r * NUM_KV_HEADS + g) * HEAD_DIM;
            dk[at..at + HEAD_DIM].copy_from_slice(&a);
            dv[at..at + HEAD_DIM].copy_from_slice(&b);
        }
    }
    [dq, dk, dv]
}
