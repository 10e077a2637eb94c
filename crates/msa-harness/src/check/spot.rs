//! A backend's outputs against the independent f64 [`oracle`](super::oracle) on a few queries
//! and keys: the check of the CPU backend itself (`msa run --backend cpu`).

use msa_plan::topology::{HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS};
use rayon::prelude::*;

use super::oracle::Problem;
use super::sample::{gather_rows, Sample};
use super::{compare, structure, CheckReport, Tolerances};
use crate::io::{CallInputs, Outputs};

/// Key rows checked per sampled key range.
const KEYS_PER_RANGE: usize = 3;

fn f32s(x: impl IntoIterator<Item = f64>) -> Vec<f32> {
    x.into_iter().map(|v| v as f32).collect()
}

/// Spot checks of `got` on the sample's queries and on a few key rows of each sampled key range.
/// `kl_inputs` are the index LSE the backend's KL backward was given and its loss coefficient,
/// as for [`against_reference`](super::against_reference).
pub fn against_oracle(
    p: &CallInputs,
    got: &Outputs,
    sample: &Sample,
    tol: &Tolerances,
    kl_inputs: Option<(&[f32], f32)>,
) -> CheckReport {
    let l = &p.layout;
    let t = l.total_q();
    let prob = &Problem {
        layout: l,
        q: &p.q,
        k: &p.k,
        v: &p.v,
        topk: &p.topk_indices,
        dout: p.dout.as_deref(),
        index: p.index.as_ref().map(|i| (&i.qi[..], &i.ki[..])),
    };
    let qs = &sample.queries;
    let mut r = CheckReport::default();
    if let (Some(out), Some(lse)) = (&got.out, &got.lse) {
        let rows: Vec<(Vec<f64>, f64)> = qs
            .par_iter()
            .flat_map_iter(|&q| (0..NUM_Q_HEADS).map(move |h| prob.attention_row(q, h)))
            .collect();
        let o: Vec<f32> = rows
            .iter()
            .flat_map(|(row, _)| f32s(row.iter().copied()))
            .collect();
        let s: Vec<f32> = rows.iter().map(|(_, l)| *l as f32).collect();
        r.push(compare::close(
            "out",
            &gather_rows(out, NUM_Q_HEADS * HEAD_DIM, qs.iter().copied()),
            &o,
            tol.out_atol,
            tol.out_rtol,
        ));
        r.push(compare::close(
            "lse",
            &gather_rows(lse, NUM_Q_HEADS, qs.iter().copied()),
            &s,
            tol.lse_atol,
            tol.lse_rtol,
        ));
    }
    if let (Some(dq), Some(dk), Some(dv), Some(out), Some(lse), Some(dout)) =
        (&got.dq, &got.dk, &got.dv, &got.out, &got.lse, &p.dout)
    {
        // The gradients take each (query, head)'s LSE from the backend's forward and delta from
        // its bf16 `out`, as the kernels do (docs/contract.md §2.4): the forward is checked above,
        // delta's rounding is the contract's (on peaked inputs it alone moves dQ by ~1% against
        // an exact delta), and a key that thousands of queries attend to stays cheap.
        let stats = |t: usize, h: usize| {
            let at = (t * NUM_Q_HEADS + h) * HEAD_DIM;
            let delta = out[at..at + HEAD_DIM]
                .iter()
                .zip(&dout[at..at + HEAD_DIM])
                .map(|(o, d)| o.to_f64() * d.to_f64())
                .sum();
            (lse[t * NUM_Q_HEADS + h] as f64, delta)
        };
        let want: Vec<f32> = qs
            .par_iter()
            .flat_map_iter(|&q| {
                (0..NUM_Q_HEADS).flat_map(move |h| {
                    let (l, d) = stats(q, h);
                    f32s(prob.dq_row_given(q, h, l, d))
                })
            })
            .collect();
        r.push_all(compare::attention_gradient(
            "dq",
            &gather_rows(dq, NUM_Q_HEADS * HEAD_DIM, qs.iter().copied()),
            &want,
            tol,
        ));
        let rows: Vec<(usize, usize)> = key_rows(sample).collect();
        let per_row: Vec<(Vec<f64>, Vec<f64>)> = rows
            .par_iter()
            .map(|&(g, row)| prob.dkv_row(g, row, &prob.key_queries(g, row), stats))
            .collect();
        let (mut gk, mut gv, mut wk, mut wv) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (&(g, row), (a, b)) in rows.iter().zip(per_row) {
            let at = (row * NUM_KV_HEADS + g) * HEAD_DIM;
            gk.extend(dk[at..at + HEAD_DIM].iter().map(|x| x.to_f32()));
            gv.extend(dv[at..at + HEAD_DIM].iter().map(|x| x.to_f32()));
            wk.extend(f32s(a));
            wv.extend(f32s(b));
        }
        r.push_all(compare::attention_gradient("dk", &gk, &wk, tol));
        r.push_all(compare::attention_gradient("dv", &gv, &wv, tol));
    }
    if let (Some(itopk), Some(ilse)) = (&got.indexer_topk, &got.indexer_lse) {
        r.push(structure::indexer_selection(l, itopk));
        let mut worst_gap = f64::NEG_INFINITY;
        let (mut gl, mut wl) = (Vec::new(), Vec::new());
        for &q in qs {
            for g in 0..NUM_INDEX_HEADS {
                let scores = prob.index_block_scores(q, g);
                let local = scores.len() - 1;
                let mut nonlocal = scores[..local].to_vec();
                nonlocal.sort_by(|a, b| b.total_cmp(a));
                if let Some(&kth) = nonlocal.get(nonlocal.len().min(15).saturating_sub(1)) {
                    for &e in &itopk[(g * t + q) * 16..][..16] {
                        if e >= 0 && (e as usize) < local {
                            worst_gap = worst_gap.max(kth - scores[e as usize]);
                        }
                    }
                }
                gl.push(ilse[g * t + q]);
                wl.push(prob.index_selection_lse(itopk, q, g) as f32);
            }
        }
        r.push(super::CheckLine {
            tensor: "indexer_topk".into(),
            metric: "rank_shortfall",
            value: worst_gap.max(0.0),
            limit: tol.indexer_rank_slack,
            passed: worst_gap <= tol.indexer_rank_slack,
            detail: "15th-best score minus the worst selected non-local score".into(),
        });
        r.push(compare::close(
            "indexer_lse",
            &gl,
            &wl,
            tol.indexer_lse_atol,
            tol.indexer_lse_atol,
        ));
    }
    if let (Some(dqi), Some((indexer_lse, loss_coeff))) = (&got.dqi, kl_inputs) {
        let (gl, wl): (Vec<f32>, Vec<f32>) = (0..NUM_INDEX_HEADS)
            .flat_map(|g| qs.iter().map(move |&q| (q, g)))
            .map(|(q, g)| {
                let want = prob.index_selection_lse(&p.topk_indices, q, g);
                (indexer_lse[g * t + q], want as f32)
            })
            .unzip();
        r.push(compare::close(
            "kl_indexer_lse",
            &gl,
            &wl,
            tol.indexer_lse_atol,
            tol.indexer_lse_atol,
        ));
        let want: Vec<f32> = qs
            .par_iter()
            .flat_map_iter(|&q| {
                (0..NUM_INDEX_HEADS)
                    .flat_map(move |g| f32s(prob.kl_dqi_row(q, g, loss_coeff as f64)))
            })
            .collect();
        r.push_all(compare::gradient(
            "dqi",
            &gather_rows(dqi, NUM_INDEX_HEADS * INDEX_DIM, qs.iter().copied()),
            &want,
            tol,
        ));
    }
    if let (Some(dki), Some(lse), Some((indexer_lse, loss_coeff))) = (&got.dki, &got.lse, kl_inputs)
    {
        // dKI has one head: a few key rows of group 0's sampled ranges, each summed over every
        // (query, index head) whose token set holds it, with the LSEs the backend's KL was given
        // (the teacher's is its forward LSE, checked above; the student's, `kl_indexer_lse`).
        let rows: Vec<usize> = key_rows(sample)
            .filter(|(g, _)| *g == 0)
            .map(|(_, r)| r)
            .collect();
        let teacher = |t: usize, h: usize| lse[t * NUM_Q_HEADS + h] as f64;
        let student = |g: usize, q: usize| indexer_lse[g * t + q] as f64;
        let want: Vec<f32> = rows
            .par_iter()
            .flat_map_iter(|&row| f32s(prob.kl_dki_row(row, loss_coeff as f64, teacher, student)))
            .collect();
        r.push_all(compare::gradient(
            "dki",
            &gather_rows(dki, INDEX_DIM, rows.iter().copied()),
            &want,
            tol,
        ));
    }
    r
}

/// (group, packed key row): [`KEYS_PER_RANGE`] rows spread over each sampled key range.
fn key_rows(sample: &Sample) -> impl Iterator<Item = (usize, usize)> + '_ {
    sample.keys.iter().flat_map(|(g, rows)| {
        let step = (rows.len() / KEYS_PER_RANGE).max(1);
        rows.clone().step_by(step).map(move |row| (*g, row))
    })
}
