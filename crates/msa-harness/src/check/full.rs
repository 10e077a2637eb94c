//! A backend's outputs against complete fp32 reference tensors — the naive GPU reference's
//! (`msa::cuda::CudaMsa::reference_*`) at real scale — on EVERY element, under the limits of the
//! other checks, plus the full-tensor checks that need no reference (finiteness, exact zeros for
//! keys nobody attends to, LSE rows, Σ dV).

use half::bf16;
use msa_plan::topology::HEAD_DIM;

use super::{compare, structure, CheckReport, Tolerances};
use crate::error::{HarnessError, Result};
use crate::io::{CallInputs, Outputs};

/// Complete fp32 reference tensors of one call, in the layouts of [`Outputs`]; `None` for what
/// the reference did not compute.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FullReference {
    pub out: Option<Vec<f32>>,
    pub lse: Option<Vec<f32>>,
    pub dq: Option<Vec<f32>>,
    pub dk: Option<Vec<f32>>,
    pub dv: Option<Vec<f32>>,
    pub dqi: Option<Vec<f32>>,
    pub dki: Option<Vec<f32>>,
}

fn f32s(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// The output `name` the reference has and `got` must have too.
fn needed<'a, T>(name: &'static str, x: &'a Option<Vec<T>>) -> Result<&'a [T]> {
    x.as_deref().ok_or(HarnessError::MissingOutput(name))
}

/// Every element of `got` (the outputs of a call of `p`) against `want`.
pub fn against_full(
    p: &CallInputs,
    got: &Outputs,
    want: &FullReference,
    tol: &Tolerances,
) -> Result<CheckReport> {
    let l = &p.layout;
    let mut r = CheckReport::default();
    if let (Some(ro), Some(rl)) = (&want.out, &want.lse) {
        let (out, lse) = (needed("out", &got.out)?, needed("lse", &got.lse)?);
        r.push(structure::finite("out", out));
        r.push(compare::close(
            "out",
            &f32s(out),
            ro,
            tol.out_atol,
            tol.out_rtol,
        ));
        r.push(compare::close("lse", lse, rl, tol.lse_atol, tol.lse_rtol));
        r.push(structure::lse_rows(l, &p.topk_indices, lse));
    }
    if let (Some(rq), Some(rk), Some(rv)) = (&want.dq, &want.dk, &want.dv) {
        let (dq, dk, dv) = (
            needed("dq", &got.dq)?,
            needed("dk", &got.dk)?,
            needed("dv", &got.dv)?,
        );
        let attended = structure::attended_keys(l, &p.topk_indices);
        for (name, g) in [("dq", dq), ("dk", dk), ("dv", dv)] {
            r.push(structure::finite(name, g));
        }
        let (dk, dv) = (f32s(dk), f32s(dv));
        for (name, g) in [("dk", &dk), ("dv", &dv)] {
            r.push(compare::zeros(name, g, |i| !attended[i / HEAD_DIM]));
        }
        if let (Some(dout), Some(dv_bf16)) = (&p.dout, &got.dv) {
            r.push(structure::dv_sums(l, &p.topk_indices, dout, dv_bf16));
        }
        r.push_all(compare::attention_gradient("dq", &f32s(dq), rq, tol));
        r.push_all(compare::attention_gradient("dk", &dk, rk, tol));
        r.push_all(compare::attention_gradient("dv", &dv, rv, tol));
    }
    if let (Some(rqi), Some(rki)) = (&want.dqi, &want.dki) {
        let (dqi, dki) = (needed("dqi", &got.dqi)?, needed("dki", &got.dki)?);
        r.push(structure::finite("dqi", dqi));
        r.push(structure::finite("dki", dki));
        r.push_all(compare::gradient("dqi", &f32s(dqi), rqi, tol));
        r.push_all(compare::gradient("dki", &f32s(dki), rki, tol));
    }
    if r.lines.is_empty() {
        return Err(HarnessError::NothingToCompare);
    }
    Ok(r)
}
