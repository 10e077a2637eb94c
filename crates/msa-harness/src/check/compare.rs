//! Report lines for the comparisons every check makes. Full-tensor comparisons at real scale
//! hold 10⁸ elements, so every metric is summed over fixed chunks in parallel and the chunks are
//! combined in order: the result does not depend on the thread count.

use rayon::prelude::*;

use super::CheckLine;

/// Elements per chunk of the parallel metrics.
const CHUNK: usize = 1 << 16;

/// `assert_close` with MSA's semantics: value is the worst |a − e| / (atol + rtol·|e|), so a
/// value ≤ 1 passes; NaN or a mismatched infinity fails; equal infinities agree.
pub fn close(tensor: &str, actual: &[f32], expected: &[f32], atol: f64, rtol: f64) -> CheckLine {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{tensor}: compared slices differ in length"
    );
    // Per chunk: (worst ratio, its index, elements over, max |a − e|); the first worst wins.
    let parts: Vec<(f64, usize, usize, f64)> = actual
        .par_chunks(CHUNK)
        .zip(expected.par_chunks(CHUNK))
        .enumerate()
        .map(|(c, (xa, xe))| {
            let (mut worst, mut worst_i, mut bad, mut max_abs) = (0f64, 0usize, 0usize, 0f64);
            for (i, (&a, &e)) in xa.iter().zip(xe).enumerate() {
                let (a, e) = (a as f64, e as f64);
                let ratio = if a == e {
                    0.0
                } else if !a.is_finite() || !e.is_finite() {
                    f64::INFINITY
                } else {
                    max_abs = max_abs.max((a - e).abs());
                    (a - e).abs() / (atol + rtol * e.abs())
                };
                if ratio > 1.0 {
                    bad += 1;
                }
                if ratio > worst || ratio.is_nan() {
                    worst = if ratio.is_nan() { f64::INFINITY } else { ratio };
                    worst_i = c * CHUNK + i;
                }
            }
            (worst, worst_i, bad, max_abs)
        })
        .collect();
    let (mut worst, mut worst_i, mut bad, mut max_abs) = (0f64, 0usize, 0usize, 0f64);
    for (w, i, b, m) in parts {
        if w > worst {
            (worst, worst_i) = (w, i);
        }
        bad += b;
        max_abs = max_abs.max(m);
    }
    CheckLine {
        tensor: tensor.to_string(),
        metric: "close_ratio",
        value: worst,
        limit: 1.0,
        passed: bad == 0,
        detail: format!(
            "max_abs {max_abs:.3e}, atol {atol:.0e} rtol {rtol:.0e}, {bad} of {} over, worst at {worst_i}",
            actual.len()
        ),
    }
}

/// RMS below which an attention gradient is numerically zero: when every query sees a single
/// key, dS = P·(dP − delta) = 0 exactly, so both sides hold only rounding noise (~1e-10) and
/// their cosine means nothing. Attention gradients of any other case are ~1e-5 and larger.
const NEGLIGIBLE_RMS: f64 = 1e-7;

/// Flattened cosine similarity in f64; any non-finite element fails.
pub fn cosine(tensor: &str, actual: &[f32], expected: &[f32], min: f64) -> CheckLine {
    cosine_line(tensor, actual, expected, min, None)
}

/// [`cosine`] for attention gradients: two numerically zero tensors (RMS below
/// [`NEGLIGIBLE_RMS`], within 1e-6 of each other) also pass. Not for the KL gradients, whose
/// scale (1/(4·T)) makes them tiny by construction.
pub fn attention_grad_cosine(
    tensor: &str,
    actual: &[f32],
    expected: &[f32],
    min: f64,
) -> CheckLine {
    cosine_line(tensor, actual, expected, min, Some(NEGLIGIBLE_RMS))
}

/// The sums every vector metric is made of, in f64.
#[derive(Default, Clone, Copy)]
struct Sums {
    /// Σ a·e, Σ a², Σ e², Σ (a − e)².
    ae: f64,
    aa: f64,
    ee: f64,
    dd: f64,
    /// max |a − e|.
    max_abs: f64,
    /// Non-finite elements of `a`.
    nonfinite: usize,
}

impl Sums {
    fn of(actual: &[f32], expected: &[f32]) -> Self {
        let parts: Vec<Sums> = actual
            .par_chunks(CHUNK)
            .zip(expected.par_chunks(CHUNK))
            .map(|(xa, xe)| {
                let mut s = Sums::default();
                for (&a, &e) in xa.iter().zip(xe) {
                    let (a64, e64) = (a as f64, e as f64);
                    s.ae += a64 * e64;
                    s.aa += a64 * a64;
                    s.ee += e64 * e64;
                    s.dd += (a64 - e64) * (a64 - e64);
                    s.max_abs = s.max_abs.max((a64 - e64).abs());
                    s.nonfinite += usize::from(!a.is_finite());
                }
                s
            })
            .collect();
        parts.into_iter().fold(Sums::default(), |s, p| Sums {
            ae: s.ae + p.ae,
            aa: s.aa + p.aa,
            ee: s.ee + p.ee,
            dd: s.dd + p.dd,
            max_abs: if p.max_abs.is_nan() {
                f64::NAN
            } else {
                s.max_abs.max(p.max_abs)
            },
            nonfinite: s.nonfinite + p.nonfinite,
        })
    }

    /// Cosine similarity, with `msa_ref::compare::cosine`'s rules for zeros and non-finite values.
    fn cosine(&self) -> f64 {
        if !(self.ae.is_finite() && self.aa.is_finite() && self.ee.is_finite()) {
            return f64::NAN;
        }
        match (self.aa == 0.0, self.ee == 0.0) {
            (true, true) => 1.0,
            (true, false) | (false, true) => 0.0,
            (false, false) => self.ae / (self.aa.sqrt() * self.ee.sqrt()),
        }
    }

    /// ‖a − e‖ / ‖e‖, with `msa_ref::compare::l2_rel`'s rules.
    fn l2_rel(&self) -> f64 {
        if !(self.dd.is_finite() && self.ee.is_finite()) {
            return f64::NAN;
        }
        match (self.dd == 0.0, self.ee == 0.0) {
            (true, _) => 0.0,
            (false, true) => f64::INFINITY,
            (false, false) => (self.dd / self.ee).sqrt(),
        }
    }

    /// Whether both sides are numerically zero: RMS below `zero_rms` and within ten times it of
    /// each other everywhere (see [`NEGLIGIBLE_RMS`], [`kl_gradient`]).
    fn negligible(&self, n: usize, zero_rms: f64) -> bool {
        let n = n.max(1) as f64;
        (self.ee / n).sqrt() < zero_rms
            && (self.aa / n).sqrt() < zero_rms
            && self.max_abs < 10.0 * zero_rms
    }
}

fn cosine_line(
    tensor: &str,
    actual: &[f32],
    expected: &[f32],
    min: f64,
    zero_rms: Option<f64>,
) -> CheckLine {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{tensor}: compared slices differ in length"
    );
    let sums = Sums::of(actual, expected);
    let (nonfinite, c, l2) = (sums.nonfinite, sums.cosine(), sums.l2_rel());
    let negligible = zero_rms.is_some_and(|z| sums.negligible(actual.len(), z));
    CheckLine {
        tensor: tensor.to_string(),
        metric: "cosine",
        value: c,
        limit: min,
        passed: nonfinite == 0 && (c > min || negligible),
        detail: format!(
            "l2_rel {l2:.3e}, {nonfinite} non-finite, n {}{}",
            actual.len(),
            if negligible {
                ", both numerically zero"
            } else {
                ""
            }
        ),
    }
}

/// Relative L2 error `‖actual − expected‖₂ / ‖expected‖₂` (f64) at most `max`; any non-finite
/// element fails. Unlike the cosine it sees scale: a gradient multiplied by 1000 (or 0.01) has
/// cosine 1 and relative L2 error 999 (0.99).
pub fn l2_rel(tensor: &str, actual: &[f32], expected: &[f32], max: f64) -> CheckLine {
    l2_rel_line(tensor, actual, expected, max, None)
}

/// [`l2_rel`] for attention gradients: two numerically zero tensors pass, as in
/// [`attention_grad_cosine`].
pub fn attention_grad_l2_rel(
    tensor: &str,
    actual: &[f32],
    expected: &[f32],
    max: f64,
) -> CheckLine {
    l2_rel_line(tensor, actual, expected, max, Some(NEGLIGIBLE_RMS))
}

fn l2_rel_line(
    tensor: &str,
    actual: &[f32],
    expected: &[f32],
    max: f64,
    zero_rms: Option<f64>,
) -> CheckLine {
    assert_eq!(
        actual.len(),
        expected.len(),
        "{tensor}: compared slices differ in length"
    );
    let sums = Sums::of(actual, expected);
    let (nonfinite, l2) = (sums.nonfinite, sums.l2_rel());
    let negligible = zero_rms.is_some_and(|z| sums.negligible(actual.len(), z));
    let (na, ne) = (sums.aa.sqrt(), sums.ee.sqrt());
    CheckLine {
        tensor: tensor.to_string(),
        metric: "l2_rel",
        // NaN (a non-finite element) reads as the worst value.
        value: if l2.is_nan() { f64::INFINITY } else { l2 },
        limit: max,
        passed: nonfinite == 0 && (l2 <= max || negligible),
        detail: format!(
            "norm ratio {:.4e}, {nonfinite} non-finite, n {}{}",
            if ne > 0.0 { na / ne } else { f64::NAN },
            actual.len(),
            if negligible {
                ", both numerically zero"
            } else {
                ""
            }
        ),
    }
}

/// Both lines of a gradient check: MSA's cosine (direction) and the relative L2 error (scale
/// too), with the limits of `tol`.
pub fn gradient(
    tensor: &str,
    actual: &[f32],
    expected: &[f32],
    tol: &super::Tolerances,
) -> [CheckLine; 2] {
    [
        cosine(tensor, actual, expected, tol.grad_cosine),
        l2_rel(tensor, actual, expected, tol.grad_l2_rel),
    ]
}

/// [`gradient`] for attention gradients (numerically zero pairs pass both lines).
pub fn attention_gradient(
    tensor: &str,
    actual: &[f32],
    expected: &[f32],
    tol: &super::Tolerances,
) -> [CheckLine; 2] {
    [
        attention_grad_cosine(tensor, actual, expected, tol.grad_cosine),
        attention_grad_l2_rel(tensor, actual, expected, tol.grad_l2_rel),
    ]
}

/// The scale of the KL gradients (docs/contract.md §3.2): iscale · loss_coeff / (4 · max(T, 1)).
pub fn kl_grad_scale(loss_coeff: f32, total_q: usize) -> f64 {
    f64::from(loss_coeff)
        / (msa_plan::topology::INDEX_DIM as f64).sqrt()
        / (4.0 * total_q.max(1) as f64)
}

/// [`gradient`] for the KL gradients dqi, dki: two tensors whose RMS is below `1e-4 ·
/// grad_scale` pass both lines. When every query sees a single key the student and the teacher
/// are both exactly 1, so dz = 0 and both sides hold only the rounding of `exp(x − lse)` near 1
/// (scores of ~25 computed in two accumulation orders: ~1e-6 relative, so dqi, dki ~1e-6 ·
/// grad_scale); a KL gradient of a query with two or more keys is ~1e-3 · grad_scale and larger.
pub fn kl_gradient(
    tensor: &str,
    actual: &[f32],
    expected: &[f32],
    tol: &super::Tolerances,
    grad_scale: f64,
) -> [CheckLine; 2] {
    let zero = Some(1e-4 * grad_scale.abs());
    [
        cosine_line(tensor, actual, expected, tol.grad_cosine, zero),
        l2_rel_line(tensor, actual, expected, tol.grad_l2_rel, zero),
    ]
}

/// Exact equality of integer tensors (metadata, selections).
pub fn exact(tensor: &str, actual: &[i32], expected: &[i32]) -> CheckLine {
    let mismatches = actual.iter().zip(expected).filter(|(a, e)| a != e).count()
        + actual.len().abs_diff(expected.len());
    let first = actual.iter().zip(expected).position(|(a, e)| a != e);
    CheckLine {
        tensor: tensor.to_string(),
        metric: "mismatches",
        value: mismatches as f64,
        limit: 0.0,
        passed: mismatches == 0,
        detail: first.map_or(String::new(), |i| {
            format!("first at {i}: {} vs {}", actual[i], expected[i])
        }),
    }
}

/// Bitwise equality of two runs (deterministic mode).
pub fn bitwise(tensor: &str, first: &[u16], second: &[u16]) -> CheckLine {
    let diff = first.iter().zip(second).filter(|(a, b)| a != b).count()
        + first.len().abs_diff(second.len());
    CheckLine {
        tensor: tensor.to_string(),
        metric: "bitwise_diff",
        value: diff as f64,
        limit: 0.0,
        passed: diff == 0,
        detail: format!("n {}", first.len()),
    }
}

/// Elements that must be exactly zero (keys nobody selected) but are not.
pub fn zeros(tensor: &str, values: &[f32], must_be_zero: impl Fn(usize) -> bool) -> CheckLine {
    let bad = values
        .iter()
        .enumerate()
        .filter(|(i, v)| must_be_zero(*i) && **v != 0.0)
        .count();
    CheckLine {
        tensor: tensor.to_string(),
        metric: "nonzero_unselected",
        value: bad as f64,
        limit: 0.0,
        passed: bad == 0,
        detail: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Tolerances;

    /// Single-key KL gradients are rounding noise on both sides and pass; a kernel that loses a
    /// real KL gradient (zeros against ~1e-3 · grad_scale) fails, and so does noise against it.
    #[test]
    fn kl_gradients_pass_only_when_both_sides_are_numerically_zero() {
        let tol = Tolerances::strict();
        let grad_scale = 0.0376;
        let noise = |seed: u32| -> Vec<f32> {
            (0..512u32)
                .map(|i| {
                    (((i.wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0) * 1e-7
                })
                .collect()
        };
        let (a, e) = (noise(1), noise(7));
        assert!(
            cosine("dqi", &a, &e, tol.grad_cosine).value < 0.99,
            "uncorrelated noise"
        );
        assert!(kl_gradient("dqi", &a, &e, &tol, grad_scale)
            .iter()
            .all(|l| l.passed));
        let real: Vec<f32> = e.iter().map(|x| x * 1e3).collect();
        let lost = vec![0.0f32; real.len()];
        assert!(kl_gradient("dqi", &lost, &real, &tol, grad_scale)
            .iter()
            .all(|l| !l.passed));
        assert!(kl_gradient("dqi", &a, &real, &tol, grad_scale)
            .iter()
            .all(|l| !l.passed));
    }
}
