//! Two outputs of one call against each other (say the GPU's against the CPU's) under MSA's
//! tolerances: what `msa compare` checks.

use half::bf16;
use msa_plan::topology::TOPK_BLOCKS;

use super::{compare, CheckLine, CheckReport, Tolerances};
use crate::error::{HarnessError, Result};
use crate::io::Outputs;

fn f32s(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// Rows of `[4, T, 16]` selections that differ as sets.
fn selection_rows(a: &[i32], e: &[i32]) -> CheckLine {
    let differ = a
        .chunks(TOPK_BLOCKS)
        .zip(e.chunks(TOPK_BLOCKS))
        .filter(|(x, y)| {
            let (mut x, mut y) = (x.to_vec(), y.to_vec());
            x.sort_unstable();
            y.sort_unstable();
            x != y
        })
        .count();
    CheckLine {
        tensor: "indexer_topk".into(),
        metric: "rows_differ",
        value: differ as f64,
        limit: 0.0,
        passed: differ == 0,
        detail: format!("{} rows", a.len() / TOPK_BLOCKS),
    }
}

/// Element counts of every tensor.
fn lengths(o: &Outputs) -> [(&'static str, Option<usize>); 9] {
    [
        ("out", o.out.as_ref().map(Vec::len)),
        ("lse", o.lse.as_ref().map(Vec::len)),
        ("dq", o.dq.as_ref().map(Vec::len)),
        ("dk", o.dk.as_ref().map(Vec::len)),
        ("dv", o.dv.as_ref().map(Vec::len)),
        ("indexer_topk", o.indexer_topk.as_ref().map(Vec::len)),
        ("indexer_lse", o.indexer_lse.as_ref().map(Vec::len)),
        ("dqi", o.dqi.as_ref().map(Vec::len)),
        ("dki", o.dki.as_ref().map(Vec::len)),
    ]
}

/// Every tensor of `expected` in `actual`: a tensor `actual` lacks is a failed line, a tensor of
/// another size is an error (the outputs are of different calls), and outputs with no tensor in
/// common are an error too.
pub fn against_outputs(
    actual: &Outputs,
    expected: &Outputs,
    tol: &Tolerances,
) -> Result<CheckReport> {
    let mut r = CheckReport::default();
    for ((tensor, n), (_, m)) in lengths(actual).into_iter().zip(lengths(expected)) {
        match (n, m) {
            (Some(n), Some(m)) if n != m => {
                return Err(HarnessError::OutputSizes {
                    tensor,
                    actual: n,
                    expected: m,
                })
            }
            (None, Some(_)) => r.push(CheckLine {
                tensor: tensor.into(),
                metric: "missing",
                value: 1.0,
                limit: 0.0,
                passed: false,
                detail: "absent from the outputs under test".into(),
            }),
            _ => {}
        }
    }
    let (x, y) = (actual, expected);
    if let (Some(p), Some(q)) = (&x.out, &y.out) {
        r.push(compare::close(
            "out",
            &f32s(p),
            &f32s(q),
            tol.out_atol,
            tol.out_rtol,
        ));
    }
    if let (Some(p), Some(q)) = (&x.lse, &y.lse) {
        r.push(compare::close("lse", p, q, tol.lse_atol, tol.lse_rtol));
    }
    for (name, p, q) in [
        ("dq", &x.dq, &y.dq),
        ("dk", &x.dk, &y.dk),
        ("dv", &x.dv, &y.dv),
    ] {
        if let (Some(p), Some(q)) = (p, q) {
            r.push_all(compare::attention_gradient(name, &f32s(p), &f32s(q), tol));
        }
    }
    for (name, p, q) in [("dqi", &x.dqi, &y.dqi), ("dki", &x.dki, &y.dki)] {
        if let (Some(p), Some(q)) = (p, q) {
            r.push_all(compare::gradient(name, &f32s(p), &f32s(q), tol));
        }
    }
    if let (Some(p), Some(q)) = (&x.indexer_topk, &y.indexer_topk) {
        r.push(selection_rows(p, q));
    }
    if let (Some(p), Some(q)) = (&x.indexer_lse, &y.indexer_lse) {
        r.push(compare::close(
            "indexer_lse",
            p,
            q,
            tol.indexer_lse_atol,
            tol.indexer_lse_atol,
        ));
    }
    if r.lines.is_empty() {
        return Err(HarnessError::NothingToCompare);
    }
    Ok(r)
}
