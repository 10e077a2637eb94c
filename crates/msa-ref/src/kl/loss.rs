//! The loss the KL backward differentiates, in f64, for finite-difference tests.

use half::bf16;
use msa_plan::topology::{
    HEAD_DIM as D, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, SOFTMAX_SCALE_F64,
};
use rayon::prelude::*;

use super::check_kl_inputs;
use crate::attention::{AttentionInputs, HEADS};
use crate::selection::{topk_row, QueryPos, Selection};

fn dot<A: Copy + Into<f64>, B: Copy + Into<f64>>(a: &[A], b: &[B]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x.into() * y.into()).sum()
}

/// `loss_coeff / (4·T) · Σ_{q,g} KL(t̄ ‖ σ)` on the sparse token sets, all in f64. The
/// student is normalized over the set here (its log-partition is recomputed from `qi`/`ki`),
/// so the derivative with respect to the student logits is `σ − t̄`, what the backward
/// computes from a consistent `indexer_lse`. `qi` and `ki` may be f64 so that tests can
/// perturb them continuously; the teacher (q, k, `teacher_lse`) is fixed.
pub fn kl_loss<E: Copy + Into<f64> + Sync>(
    inputs: &AttentionInputs<'_>,
    teacher_lse: &[f32],
    qi: &[E],
    ki: &[E],
    loss_coeff: f32,
) -> crate::Result<f64> {
    check_kl_inputs(inputs, teacher_lse, qi.len(), ki.len())?;
    let (layout, t) = (inputs.layout, inputs.layout.total_q());
    let per_query: Vec<f64> = (0..t)
        .into_par_iter()
        .map(|q| {
            let pos = QueryPos::of(layout, q);
            let mut total = 0f64;
            for g in 0..NUM_KV_HEADS {
                let sel = Selection::new(topk_row(inputs.topk, t, g, q), &pos);
                let keys = sel.blocks().flat_map(|(e, c)| {
                    (0..c).map(move |i| pos.k_base + e * msa_plan::topology::BLOCK_SIZE + i)
                });
                let qi_row = &qi[(q * NUM_INDEX_HEADS + g) * INDEX_DIM..][..INDEX_DIM];
                let (mut teacher, mut student) = (Vec::new(), Vec::new());
                for key in keys {
                    let k_row: &[bf16] = &inputs.k[(key * NUM_KV_HEADS + g) * D..][..D];
                    let mean = (0..HEADS)
                        .map(|h| {
                            let head = q * NUM_Q_HEADS + g * HEADS + h;
                            let s = SOFTMAX_SCALE_F64 * dot(&inputs.q[head * D..][..D], k_row);
                            (s - teacher_lse[head] as f64).exp()
                        })
                        .sum::<f64>()
                        / HEADS as f64;
                    teacher.push(mean);
                    student
                        .push(SOFTMAX_SCALE_F64 * dot(qi_row, &ki[key * INDEX_DIM..][..INDEX_DIM]));
                }
                let m = student.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let log_z = m + student.iter().map(|z| (z - m).exp()).sum::<f64>().ln();
                for (tb, z) in teacher.iter().zip(&student) {
                    if *tb > 0.0 {
                        total += tb * (tb.ln() - (z - log_z));
                    }
                }
            }
            total
        })
        .collect();
    Ok(loss_coeff as f64 / (4.0 * t.max(1) as f64) * per_query.iter().sum::<f64>())
}
