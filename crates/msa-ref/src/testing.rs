//! Test inputs: a seeded generator, layouts, selections and an independent dense f64
//! attention.

/// xorshift64* with Box-Muller normals.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

use half::bf16;
use msa_plan::topology::{
    BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS, SOFTMAX_SCALE_F64, TOPK_BLOCKS,
};
use msa_plan::VarlenLayout;

/// `n` bf16 values `N(0,1)·std`, never zero.
pub(crate) fn bf16s(rng: &mut Rng, n: usize, std: f64) -> Vec<bf16> {
    (0..n)
        .map(|_| loop {
            let x = bf16::from_f64(rng.normal() * std);
            if x.to_f32() != 0.0 {
                break x;
            }
        })
        .collect()
}

pub(crate) fn to_f64(x: &[bf16]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Every packed query with its document position and number of key blocks.
pub(crate) fn queries(layout: &VarlenLayout) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for f in layout.fragments() {
        for i in 0..f.q_len {
            out.push((f.q_start + i, f.position(i), f.num_blocks));
        }
    }
    out
}

/// The "recent 16" pattern: blocks `local-15..=local` ascending (local last), then -1.
pub(crate) fn recent_topk(layout: &VarlenLayout) -> Vec<i32> {
    let t = layout.total_q();
    let mut topk = vec![-1i32; NUM_KV_HEADS * t * TOPK_BLOCKS];
    for g in 0..NUM_KV_HEADS {
        for &(q, p, _) in &queries(layout) {
            let local = p / BLOCK_SIZE;
            let first = (local + 1).saturating_sub(TOPK_BLOCKS);
            for (s, e) in (first..=local).enumerate() {
                topk[(g * t + q) * TOPK_BLOCKS + s] = e as i32;
            }
        }
    }
    topk
}

/// Random selections in shuffled slots, padded with entries the contract ignores (-1, other
/// negatives, ids past the document, duplicates, future blocks); the local block is sometimes
/// left out and about one row in ten selects nothing valid.
pub(crate) fn random_topk(layout: &VarlenLayout, rng: &mut Rng) -> Vec<i32> {
    let t = layout.total_q();
    let mut topk = vec![-1i32; NUM_KV_HEADS * t * TOPK_BLOCKS];
    for g in 0..NUM_KV_HEADS {
        for &(q, p, num_blocks) in &queries(layout) {
            let local = p / BLOCK_SIZE;
            let mut row: Vec<i32> = Vec::new();
            if rng.below(10) != 0 {
                let mut pool: Vec<i32> = (0..=local as i32).collect();
                let count = 1 + rng.below(pool.len().min(TOPK_BLOCKS - 2));
                if rng.below(4) != 0 {
                    row.push(local as i32);
                    pool.pop();
                }
                while row.len() < count && !pool.is_empty() {
                    row.push(pool.swap_remove(rng.below(pool.len())));
                }
            }
            while row.len() < TOPK_BLOCKS {
                let junk = match rng.below(5) {
                    0 => -1,
                    1 => -1 - rng.below(5) as i32,
                    2 => (num_blocks + rng.below(3)) as i32,
                    3 if local + 1 < num_blocks => {
                        (local + 1 + rng.below(num_blocks - local - 1)) as i32
                    }
                    _ if !row.is_empty() => row[rng.below(row.len())],
                    _ => -1,
                };
                row.push(junk);
            }
            for i in (1..row.len()).rev() {
                row.swap(i, rng.below(i + 1));
            }
            topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS].copy_from_slice(&row);
        }
    }
    topk
}

/// Whether key `j` (document-local) is in the token set of (query, group), straight from the
/// definition: its block is listed and `j <= p`.
pub(crate) fn in_set(topk: &[i32], t: usize, g: usize, q: usize, p: usize, j: usize) -> bool {
    let row = &topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS];
    j <= p && row.contains(&((j / BLOCK_SIZE) as i32))
}

/// Dense softmax attention in f64 under the mask the selection defines: `(out [T,64,128],
/// lse [T,64])`, with out 0 and lse `-inf` for an empty set.
pub(crate) fn dense_attention(
    layout: &VarlenLayout,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    topk: &[i32],
) -> (Vec<f64>, Vec<f64>) {
    let (t, d) = (layout.total_q(), HEAD_DIM);
    let mut out = vec![0f64; t * NUM_Q_HEADS * d];
    let mut lse = vec![f64::NEG_INFINITY; t * NUM_Q_HEADS];
    for f in layout.fragments() {
        for i in 0..f.q_len {
            let (qq, p) = (f.q_start + i, f.position(i));
            for h in 0..NUM_Q_HEADS {
                let g = h / (NUM_Q_HEADS / NUM_KV_HEADS);
                let qrow = &q[(qq * NUM_Q_HEADS + h) * d..][..d];
                let keys: Vec<usize> = (0..f.k_len)
                    .filter(|&j| in_set(topk, t, g, qq, p, j))
                    .collect();
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let krow = &k[((f.k_base + j) * NUM_KV_HEADS + g) * d..][..d];
                        SOFTMAX_SCALE_F64 * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>()
                    })
                    .collect();
                if keys.is_empty() {
                    continue;
                }
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                lse[qq * NUM_Q_HEADS + h] = m + l.ln();
                let o = &mut out[(qq * NUM_Q_HEADS + h) * d..][..d];
                for (&j, s) in keys.iter().zip(&scores) {
                    let w = (s - m).exp() / l;
                    let vrow = &v[((f.k_base + j) * NUM_KV_HEADS + g) * d..][..d];
                    for (o, x) in o.iter_mut().zip(vrow) {
                        *o += w * x;
                    }
                }
            }
        }
    }
    (out, lse)
}

/// Gradients of `Σ dout·O` for [`dense_attention`], in f64 from the textbook formulas
/// (`dS = P ∘ (dO·Vᵀ − rowsum(dO ∘ O))`): `(dq, dk, dv)`.
pub(crate) fn dense_gradients(
    layout: &VarlenLayout,
    [q, k, v]: [&[f64]; 3],
    dout: &[f64],
    topk: &[i32],
) -> [Vec<f64>; 3] {
    let (t, d) = (layout.total_q(), HEAD_DIM);
    let row = |x: &[f64], i: usize| x[i * d..(i + 1) * d].to_vec();
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let (mut dq, mut dk, mut dv) = (
        vec![0f64; q.len()],
        vec![0f64; k.len()],
        vec![0f64; v.len()],
    );
    for f in layout.fragments() {
        for i in 0..f.q_len {
            let (qq, p) = (f.q_start + i, f.position(i));
            for h in 0..NUM_Q_HEADS {
                let g = h / (NUM_Q_HEADS / NUM_KV_HEADS);
                let (qh, doh) = (
                    row(q, qq * NUM_Q_HEADS + h),
                    row(dout, qq * NUM_Q_HEADS + h),
                );
                let kv: Vec<usize> = (0..f.k_len)
                    .filter(|&j| in_set(topk, t, g, qq, p, j))
                    .map(|j| (f.k_base + j) * NUM_KV_HEADS + g)
                    .collect();
                let s: Vec<f64> = kv
                    .iter()
                    .map(|&r| SOFTMAX_SCALE_F64 * dot(&qh, &row(k, r)))
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let prob: Vec<f64> = s.iter().map(|x| (x - m).exp() / l).collect();
                let dp: Vec<f64> = kv.iter().map(|&r| dot(&doh, &row(v, r))).collect();
                let delta: f64 = prob.iter().zip(&dp).map(|(p, x)| p * x).sum();
                for ((&r, p), x) in kv.iter().zip(&prob).zip(&dp) {
                    let ds = SOFTMAX_SCALE_F64 * p * (x - delta);
                    let kr = row(k, r);
                    for c in 0..d {
                        dq[(qq * NUM_Q_HEADS + h) * d + c] += ds * kr[c];
                        dk[r * d + c] += ds * qh[c];
                        dv[r * d + c] += p * doh[c];
                    }
                }
            }
        }
    }
    [dq, dk, dv]
}
