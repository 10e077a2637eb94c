//! A backend's outputs against the CPU reference (`msa-ref`), fully or on a [`Sample`].
//! The backward and KL checks feed the reference the backend's own forward outputs (out, lse),
//! as the kernels receive them, so each stage is checked on its own.

use half::bf16;
use msa_plan::topology::{
    HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS,
};
use msa_ref::attention::{self, AttentionInputs};
use msa_ref::indexer::{self, IndexerInputs};
use msa_ref::kl;
use rayon::prelude::*;

use super::sample::{gather_rows, Sample};
use super::{compare, structure, CheckReport, Tolerances};
use crate::error::{HarnessError, Result};
use crate::io::{CallInputs, Outputs};

/// Sampled queries (evenly spread over the sample) whose indexer ranking is checked against
/// full reference block scores.
const RANKED_QUERIES: usize = 8;
const Q_ROW: usize = NUM_Q_HEADS * HEAD_DIM;
const KV_ROW: usize = NUM_KV_HEADS * HEAD_DIM;

/// The `queries` columns of a head-major `[4, T]` index tensor, head by head.
fn index_heads(x: &[f32], t: usize, queries: &[usize]) -> Vec<f32> {
    (0..NUM_INDEX_HEADS)
        .flat_map(|g| queries.iter().map(move |&q| x[g * t + q]))
        .collect()
}

/// Every check of `got` that `p` and the options allow. `kl_inputs` are the index LSE the
/// backend's KL backward was given (checked against the reference's LSE of the attention
/// selection) and its loss coefficient.
pub fn against_reference(
    p: &CallInputs,
    got: &Outputs,
    sample: &Sample,
    tol: &Tolerances,
    kl_inputs: Option<(&[f32], f32)>,
) -> Result<CheckReport> {
    let l = &p.layout;
    let inputs = AttentionInputs {
        layout: l,
        q: &p.q,
        k: &p.k,
        v: &p.v,
        topk: &p.topk_indices,
    };
    let full = sample.is_full();
    let qs = &sample.queries;
    let mut r = CheckReport::default();

    let Some(out) = &got.out else {
        return Err(HarnessError::MissingOutput("out"));
    };
    let Some(lse) = &got.lse else {
        return Err(HarnessError::MissingOutput("lse"));
    };
    let fwd = if full {
        attention::forward(&inputs)
    } else {
        attention::forward_queries(&inputs, qs)
    }?;
    r.push(structure::finite("out", out));
    r.push(compare::close(
        "out",
        &gather_rows(out, Q_ROW, qs.iter().copied()),
        &fwd.out,
        tol.out_atol,
        tol.out_rtol,
    ));
    r.push(compare::close(
        "lse",
        &gather_rows(lse, NUM_Q_HEADS, qs.iter().copied()),
        &fwd.lse,
        tol.lse_atol,
        tol.lse_rtol,
    ));
    r.push(structure::lse_rows(l, &p.topk_indices, lse));

    if let (Some(dout), Some(dq), Some(dk), Some(dv)) = (&p.dout, &got.dq, &got.dk, &got.dv) {
        let attended = structure::attended_keys(l, &p.topk_indices);
        for (name, g) in [("dq", dq), ("dk", dk), ("dv", dv)] {
            r.push(structure::finite(name, g));
        }
        for (name, g) in [("dk", dk), ("dv", dv)] {
            r.push(compare::zeros(
                name,
                &g.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
                |i| !attended[i / HEAD_DIM],
            ));
        }
        r.push(structure::dv_sums(l, &p.topk_indices, dout, dv));
        let (ref_dq, ref_dk, ref_dv) = if full {
            let gr = attention::backward(&inputs, dout, out, lse)?;
            (gr.dq, gr.dk, gr.dv)
        } else {
            let dq = attention::backward_dq_queries(&inputs, dout, out, lse, qs)?;
            let (mut dk, mut dv) = (Vec::new(), Vec::new());
            for (g, rows) in &sample.keys {
                let (a, b) =
                    attention::backward_dkv_keys(&inputs, dout, out, lse, *g, rows.clone())?;
                dk.extend(a);
                dv.extend(b);
            }
            (dq, dk, dv)
        };
        let got_keys = |x: &[bf16]| -> Vec<f32> {
            if full {
                return x.iter().map(|v| v.to_f32()).collect();
            }
            sample
                .keys
                .iter()
                .flat_map(|(g, rows)| {
                    rows.clone().flat_map(move |row| {
                        x[row * KV_ROW + g * HEAD_DIM..][..HEAD_DIM]
                            .iter()
                            .map(|v| v.to_f32())
                    })
                })
                .collect()
        };
        r.push_all(compare::attention_gradient(
            "dq",
            &gather_rows(dq, Q_ROW, qs.iter().copied()),
            &ref_dq,
            tol,
        ));
        r.push_all(compare::attention_gradient(
            "dk",
            &got_keys(dk),
            &ref_dk,
            tol,
        ));
        r.push_all(compare::attention_gradient(
            "dv",
            &got_keys(dv),
            &ref_dv,
            tol,
        ));
    }

    if let (Some(index), Some(itopk), Some(ilse)) = (&p.index, &got.indexer_topk, &got.indexer_lse)
    {
        let ii = IndexerInputs {
            layout: l,
            qi: &index.qi,
            ki: &index.ki,
        };
        r.push(structure::indexer_selection(l, itopk));
        let t = l.total_q();
        // Block scores scan a query's whole document: rank the first few sampled queries only.
        let ranked: Vec<usize> = qs
            .iter()
            .copied()
            .step_by(qs.len().div_ceil(RANKED_QUERIES).max(1))
            .collect();
        let gaps: Vec<f64> = ranked
            .par_iter()
            .flat_map_iter(|&q| (0..NUM_INDEX_HEADS).map(move |g| (q, g)))
            .map(|(q, g)| -> Result<f64> {
                let scores = indexer::block_scores(&ii, g, q)?;
                let local = scores.len() - 1;
                let mut nonlocal: Vec<f32> = scores[..local].to_vec();
                nonlocal.sort_by(|a, b| b.total_cmp(a));
                let Some(&kth) =
                    nonlocal.get(nonlocal.len().min(TOPK_BLOCKS - 1).saturating_sub(1))
                else {
                    return Ok(f64::NEG_INFINITY);
                };
                Ok(itopk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS]
                    .iter()
                    .filter(|&&e| e >= 0 && (e as usize) < local)
                    .map(|&e| (kth - scores[e as usize]) as f64)
                    .fold(f64::NEG_INFINITY, f64::max))
            })
            .collect::<Result<_>>()?;
        let worst_gap = gaps.into_iter().fold(f64::NEG_INFINITY, f64::max);
        r.push(super::CheckLine {
            tensor: "indexer_topk".into(),
            metric: "rank_shortfall",
            value: worst_gap.max(0.0),
            limit: tol.indexer_rank_slack,
            passed: worst_gap <= tol.indexer_rank_slack,
            detail: "15th-best score minus the worst selected non-local score".into(),
        });
        let sel_lse = indexer::selection_lse(&ii, itopk, qs)?;
        r.push(compare::close(
            "indexer_lse",
            &index_heads(ilse, t, qs),
            &sel_lse,
            tol.indexer_lse_atol,
            tol.indexer_lse_atol,
        ));
    }

    if let (Some(index), Some(dqi), Some(dki), Some((indexer_lse, loss_coeff))) =
        (&p.index, &got.dqi, &got.dki, kl_inputs)
    {
        let ii = IndexerInputs {
            layout: l,
            qi: &index.qi,
            ki: &index.ki,
        };
        r.push(compare::close(
            "kl_indexer_lse",
            &index_heads(indexer_lse, l.total_q(), qs),
            &indexer::selection_lse(&ii, &p.topk_indices, qs)?,
            tol.indexer_lse_atol,
            tol.indexer_lse_atol,
        ));
        r.push(structure::finite("dqi", dqi));
        r.push(structure::finite("dki", dki));
        let (ref_dqi, ref_dki) = if full {
            let g = kl::kl_backward(&inputs, lse, &index.qi, &index.ki, indexer_lse, loss_coeff)?;
            (g.dqi, g.dki)
        } else {
            let dqi = kl::kl_dqi_queries(
                &inputs,
                lse,
                &index.qi,
                &index.ki,
                indexer_lse,
                loss_coeff,
                qs,
            )?;
            let mut dki = Vec::new();
            for (_, rows) in sample.keys.iter().filter(|(g, _)| *g == 0) {
                dki.extend(kl::kl_dki_keys(
                    &inputs,
                    lse,
                    &index.qi,
                    &index.ki,
                    indexer_lse,
                    loss_coeff,
                    rows.clone(),
                )?);
            }
            (dqi, dki)
        };
        let got_dki: Vec<f32> = if full {
            dki.iter().map(|v| v.to_f32()).collect()
        } else {
            sample
                .keys
                .iter()
                .filter(|(g, _)| *g == 0)
                .flat_map(|(_, rows)| gather_rows(dki, INDEX_DIM, rows.clone()))
                .collect()
        };
        let grad_scale = compare::kl_grad_scale(loss_coeff, p.layout.total_q());
        r.push_all(compare::kl_gradient(
            "dqi",
            &gather_rows(dqi, NUM_INDEX_HEADS * INDEX_DIM, qs.iter().copied()),
            &ref_dqi,
            tol,
            grad_scale,
        ));
        r.push_all(compare::kl_gradient(
            "dki", &got_dki, &ref_dki, tol, grad_scale,
        ));
    }
    Ok(r)
}
