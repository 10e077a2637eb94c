//! Row softmax pieces shared by the attention forward and the indexer LSE.

/// Replace raw dot products `x` by `exp(scale·x − m)` with `m = max(scale·x)`, and return `m`
/// and the sum of the exponentials. The sum is taken in f64 (it is scalar work next to the
/// products), the exponentials stay f32 because they feed f32 products.
pub(crate) fn exp_shifted(row: &mut [f32], scale: f32) -> (f32, f64) {
    row.iter_mut().for_each(|x| *x *= scale);
    let m = row_max(row);
    let mut sum = 0f64;
    for x in row.iter_mut() {
        *x = (*x - m).exp();
        sum += *x as f64;
    }
    (m, sum)
}

/// The largest value (NaN ignored; `-inf` for an empty row), with eight running maxima written
/// as selects so that the loop vectorizes.
pub(crate) fn row_max(row: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (&x, m) in chunk.iter().zip(&mut lanes) {
            *m = if x > *m { x } else { *m };
        }
    }
    let rest = chunks.remainder().iter().copied();
    lanes
        .into_iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, f32::max)
}

/// `m + ln(sum)` rounded once to f32; `-inf` for an empty row (`sum = 0`).
pub(crate) fn lse(m: f32, sum: f64) -> f32 {
    if sum == 0.0 {
        return f32::NEG_INFINITY;
    }
    (m as f64 + sum.ln()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_f64_logsumexp_and_handles_empty_rows() {
        let raw = [3.0f32, -1.0, 0.5, 10.0];
        let mut row = raw;
        let (m, sum) = exp_shifted(&mut row, 0.5);
        assert_eq!(m, 5.0);
        let want: f64 = raw
            .iter()
            .map(|&x| (0.5 * x as f64).exp())
            .sum::<f64>()
            .ln();
        assert!((lse(m, sum) as f64 - want).abs() < 1e-6);
        assert_eq!(row[3], 1.0);
        assert_eq!(lse(f32::NEG_INFINITY, 0.0), f32::NEG_INFINITY);
        assert_eq!(exp_shifted(&mut [], 1.0), (f32::NEG_INFINITY, 0.0));
        let v: Vec<f32> = (0..21).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
        assert_eq!(row_max(&v), 5.0);
        assert_eq!(row_max(&v[..3]), 2.0, "no full chunk");
        let mut w = v.clone();
        w[20] = 9.0;
        assert_eq!(row_max(&w), 9.0, "max in the remainder");
        assert_eq!(row_max(&[f32::NAN, -2.0]), -2.0);
    }
}
