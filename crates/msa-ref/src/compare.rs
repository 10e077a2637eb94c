//! Comparison metrics used by every check, and bf16 helpers.
//!
//! Metrics accumulate in f64. Slices of different lengths are a caller bug and panic.

use std::fmt;

use half::bf16;

/// bf16 values as f32 (exact).
pub fn to_f32(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// f32 values rounded to bf16 (round to nearest, ties to even; NaN stays NaN).
pub fn to_bf16(x: &[f32]) -> Vec<bf16> {
    x.iter().map(|&v| bf16::from_f32(v)).collect()
}

/// `x` rounded to the nearest bf16 (ties to even), as an f32.
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// bf16 to f32 into a reused buffer.
pub(crate) fn widen(src: &[bf16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

fn same_len(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "compared tensors differ in length");
}

/// `|a − e|`, with equal values (equal infinities included) at distance 0 and NaN for any
/// other non-finite pair.
fn distance(a: f32, e: f32) -> f64 {
    if a == e {
        0.0
    } else {
        (a as f64 - e as f64).abs()
    }
}

/// Largest `|a − e|`; NaN if any pair involves NaN or unequal infinities; 0 for empty slices.
pub fn max_abs_diff(actual: &[f32], expected: &[f32]) -> f64 {
    same_len(actual, expected);
    let mut worst = 0f64;
    for (&a, &e) in actual.iter().zip(expected) {
        let d = distance(a, e);
        if d.is_nan() || d == f64::INFINITY {
            return f64::NAN;
        }
        worst = worst.max(d);
    }
    worst
}

/// Cosine similarity of the flattened tensors. Two all-zero tensors are identical (1); an
/// all-zero tensor against a non-zero one shares no direction (0); any non-finite value
/// gives NaN.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    same_len(a, b);
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if !(ab.is_finite() && aa.is_finite() && bb.is_finite()) {
        return f64::NAN;
    }
    match (aa == 0.0, bb == 0.0) {
        (true, true) => 1.0,
        (true, false) | (false, true) => 0.0,
        (false, false) => ab / (aa.sqrt() * bb.sqrt()),
    }
}

/// `‖actual − expected‖₂ / ‖expected‖₂`; for an all-zero `expected`, 0 if `actual` is all
/// zero too and infinity otherwise; NaN if anything is non-finite.
pub fn l2_rel(actual: &[f32], expected: &[f32]) -> f64 {
    same_len(actual, expected);
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&a, &e) in actual.iter().zip(expected) {
        let (a, e) = (a as f64, e as f64);
        diff += (a - e) * (a - e);
        norm += e * e;
    }
    if !(diff.is_finite() && norm.is_finite()) {
        return f64::NAN;
    }
    match (diff == 0.0, norm == 0.0) {
        (true, _) => 0.0,
        (false, true) => f64::INFINITY,
        (false, false) => (diff / norm).sqrt(),
    }
}

/// Result of [`allclose`].
#[derive(Debug, Clone, PartialEq)]
pub struct CloseReport {
    /// Largest `|a − e|` over pairs where both are finite.
    pub max_abs: f64,
    /// Largest `|a − e| / |e|` over pairs where both are finite and `e ≠ 0`.
    pub max_rel: f64,
    /// The element furthest outside its bound (a non-finite mismatch first), or the closest to
    /// its bound when nothing violates it; `None` for empty input.
    pub worst_index: Option<usize>,
    /// Elements with `|a − e| > atol + rtol·|e|`, non-finite mismatches included.
    pub violations: usize,
    /// Non-finite elements of `actual`.
    pub nonfinite: usize,
}

impl CloseReport {
    pub fn passed(&self) -> bool {
        self.violations == 0
    }
}

impl fmt::Display for CloseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} violations, max_abs {:.3e}, max_rel {:.3e}, worst index {:?}, {} non-finite",
            self.violations, self.max_abs, self.max_rel, self.worst_index, self.nonfinite
        )
    }
}

/// `assert_close` semantics: element i passes when `|a − e| <= atol + rtol·|e|`. A NaN on
/// either side, or an infinity against anything but the same infinity, is a violation.
pub fn allclose(actual: &[f32], expected: &[f32], atol: f64, rtol: f64) -> CloseReport {
    same_len(actual, expected);
    let mut report = CloseReport {
        max_abs: 0.0,
        max_rel: 0.0,
        worst_index: None,
        violations: 0,
        nonfinite: 0,
    };
    // Badness: |a − e| / bound; infinite for a non-finite mismatch.
    let mut worst = f64::NEG_INFINITY;
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        if !a.is_finite() {
            report.nonfinite += 1;
        }
        let d = distance(a, e);
        let bound = atol + rtol * (e as f64).abs();
        let badness = if d.is_finite() {
            report.max_abs = report.max_abs.max(d);
            if e != 0.0 && e.is_finite() {
                report.max_rel = report.max_rel.max(d / (e as f64).abs());
            }
            if d > bound {
                report.violations += 1;
            }
            d / bound
        } else {
            report.violations += 1;
            f64::INFINITY
        };
        // NaN badness (0/0 with a zero bound) means an exact match.
        let badness = if badness.is_nan() { 0.0 } else { badness };
        if badness > worst {
            worst = badness;
            report.worst_index = Some(i);
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f32 = f32::INFINITY;
    const NAN: f32 = f32::NAN;

    #[test]
    fn bf16_rounding_is_nearest_even() {
        let ulp = 2f32.powi(-7); // bf16 spacing in [1, 2)
        assert_eq!(
            round_bf16(1.0 + ulp / 2.0),
            1.0,
            "tie goes to the even mantissa"
        );
        assert_eq!(
            round_bf16(1.0 + 1.5 * ulp),
            1.0 + 2.0 * ulp,
            "tie goes up to even"
        );
        assert_eq!(round_bf16(1.0 + 0.51 * ulp), 1.0 + ulp);
        assert!(round_bf16(NAN).is_nan());
        assert_eq!(to_f32(&to_bf16(&[0.1, -3.0])), vec![round_bf16(0.1), -3.0]);
    }

    #[test]
    fn max_abs_diff_treats_equal_infinities_as_equal() {
        assert_eq!(max_abs_diff(&[1.0, 2.0, INF], &[1.5, 1.0, INF]), 1.0);
        assert!(max_abs_diff(&[INF], &[-INF]).is_nan());
        assert!(max_abs_diff(&[1.0, NAN], &[1.0, NAN]).is_nan());
        assert_eq!(max_abs_diff(&[], &[]), 0.0);
    }

    #[test]
    #[should_panic(expected = "differ in length")]
    fn length_mismatch_panics() {
        max_abs_diff(&[1.0], &[]);
    }

    #[test]
    fn cosine_edge_cases() {
        assert!((cosine(&[1.0, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-15);
        assert!((cosine(&[1.0, 2.0], &[-1.0, -2.0]) + 1.0).abs() < 1e-15);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 3.0]), 0.0);
        assert_eq!(cosine(&[0.0, 0.0], &[0.0, 0.0]), 1.0);
        assert_eq!(cosine(&[0.0, 0.0], &[0.0, 1.0]), 0.0);
        assert!(cosine(&[NAN], &[1.0]).is_nan());
        assert!(cosine(&[INF], &[1.0]).is_nan());
        // f64 accumulation: f32 squares would overflow here.
        assert!((cosine(&[1e30, 1e30], &[1e30, 1e30]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn l2_rel_edge_cases() {
        assert!((l2_rel(&[3.0, 4.0], &[0.0, 4.0]) - 0.75).abs() < 1e-15);
        assert_eq!(l2_rel(&[0.0], &[0.0]), 0.0);
        assert_eq!(l2_rel(&[1.0], &[0.0]), f64::INFINITY);
        assert!(l2_rel(&[NAN], &[1.0]).is_nan());
    }

    #[test]
    fn allclose_follows_assert_close() {
        // Exactly on the bound passes; just past it fails.
        let r = allclose(&[1.5, 2.0], &[1.0, 2.0], 0.25, 0.25);
        assert!(r.passed(), "{r}");
        assert_eq!((r.max_abs, r.max_rel, r.worst_index), (0.5, 0.5, Some(0)));
        let r = allclose(&[1.0, 1.6], &[1.0, 1.0], 0.25, 0.25);
        assert_eq!((r.violations, r.worst_index), (1, Some(1)));

        let r = allclose(&[INF, -INF, 0.0], &[INF, -INF, 0.0], 0.0, 0.0);
        assert!(r.passed(), "equal infinities are fine: {r}");
        assert_eq!((r.nonfinite, r.max_abs), (2, 0.0));

        let r = allclose(
            &[1.0, NAN, INF, 1.0, 2.0],
            &[1.0, NAN, 1.0, -INF, 2.1],
            0.5,
            0.0,
        );
        assert_eq!((r.violations, r.nonfinite), (3, 2));
        assert_eq!(
            r.worst_index,
            Some(1),
            "first non-finite mismatch is the worst"
        );
        assert!(
            (r.max_abs - 0.1).abs() < 1e-6,
            "non-finite pairs stay out of max_abs"
        );
        assert_eq!(allclose(&[], &[], 0.0, 0.0).worst_index, None);
    }
}
