//! The dQ grid of the deterministic sm_90a backward, host mirror of
//! kernels/src/attention/backward_det_grid.cuh (whose comment gives the argument): every dQ
//! contribution of a row is rounded to a multiple of the row's power of two `2^e`, chosen from a
//! bound on the sum of the contributions' magnitudes so that every partial sum is an integer
//! multiple of `2^e` below `2^(e + 24)`, exact in `f32`; the bulk reduce-adds then give the same
//! bits in any order.

/// `2^(e + SLACK) >= bound`: partial sums stay below `2^(e + 24)` with a factor 4 to spare.
pub const SLACK: i32 = 22;
/// Every nonzero multiple of the grid is a normal number (no flush to zero in the reduce-add).
pub const MIN_EXP: i32 = -126;
pub const MAX_EXP: i32 = 127 - 24;

/// The grid `2^e` of a row whose contributions' magnitudes sum to at most `bound`; NaN when the
/// bound is not finite (the row's dQ is then NaN, not silently rounded away).
pub fn grid_step(bound: f32) -> f32 {
    if !bound.is_finite() {
        return f32::NAN;
    }
    let e = if bound > 0.0 {
        // frexp: bound < 2^x, x = the exponent of bound's leading bit + 1.
        let x = if bound.is_normal() {
            ((bound.to_bits() >> 23) & 0xff) as i32 - 126
        } else {
            -126 - (bound.to_bits().leading_zeros() as i32 - 9)
        };
        (x - SLACK).clamp(MIN_EXP, MAX_EXP)
    } else {
        MIN_EXP
    };
    f32::from_bits(((127 + e) as u32) << 23)
}

/// `x` rounded to the grid `step` (ties to even, as the kernel's `rintf`).
pub fn to_grid(x: f32, step: f32) -> f32 {
    (x / step).round_ties_even() * step
}

/// The bound of one dQ row (the kernel's `backward_dq_step_kernel`): softmax scale × 1.01 × the
/// maximum over the row's selected blocks of `(|dO|₂ · Vn_b + |delta|) · Ka_b`, where
/// `blocks` holds each selected block's (max |K|, max |V_k|₂).
pub fn row_bound(dout_norm: f32, delta: f32, scale: f32, blocks: &[(f32, f32)]) -> f32 {
    let m = blocks
        .iter()
        .map(|&(ka, vn)| (dout_norm * vn + delta.abs()) * ka)
        .fold(0.0f32, f32::max);
    m * (scale * 1.01)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn steps_are_powers_of_two_with_the_slack() {
        for b in [
            1.0f32,
            0.75,
            3.0e-3,
            1.0e-30,
            6.0e4,
            f32::MIN_POSITIVE,
            1.0e-44,
        ] {
            let s = grid_step(b);
            assert_eq!(s.to_bits() & 0x7f_ffff, 0, "{b}: a power of two");
            let e = s.log2() as i32;
            assert!(e >= MIN_EXP);
            assert!(
                e == MIN_EXP
                    || (2f64.powi(e + SLACK) > b as f64 && 2f64.powi(e + SLACK - 1) <= b as f64),
                "{b}: e = {e}"
            );
        }
        assert_eq!(grid_step(0.0), f32::MIN_POSITIVE);
        assert_eq!(grid_step(1.0), 2f32.powi(1 - SLACK));
        assert_eq!(grid_step(0.5), 2f32.powi(-SLACK));
        assert!(grid_step(f32::INFINITY).is_nan() && grid_step(f32::NAN).is_nan());
        assert!(to_grid(1.0, grid_step(f32::NAN)).is_nan());
    }

    #[test]
    fn the_bound_covers_each_block() {
        let b = row_bound(2.0, -0.5, 0.125, &[(1.0, 3.0), (4.0, 0.5), (0.0, 9.0)]);
        assert_eq!(b, (2.0f32 * 3.0 + 0.5) * (0.125 * 1.01));
        assert_eq!(row_bound(1.0, 1.0, 1.0, &[]), 0.0);
    }

    proptest! {
        /// Up to 16 contributions whose magnitudes sum to at most the bound, rounded to the grid:
        /// every order of summing them in f32 gives the same bits, the exact sum.
        #[test]
        fn grid_sums_are_order_free(
            bound_exp in -120i32..100,
            parts in prop::collection::vec((-1.0f64..1.0, 0.0f64..1.0), 1..=16),
            seed in any::<u64>(),
        ) {
            let bound = 2f64.powi(bound_exp) * 1.7;
            let total: f64 = parts.iter().map(|p| p.1).sum();
            let step = grid_step(bound as f32);
            let c: Vec<f32> = parts
                .iter()
                .map(|&(sign, w)| to_grid((sign.signum() * w / total * bound) as f32, step))
                .collect();
            let exact: f64 = c.iter().map(|&x| x as f64).sum();
            let mut order: Vec<usize> = (0..c.len()).collect();
            let mut s = seed | 1;
            for round in 0..8 {
                if round > 0 {
                    for i in (1..order.len()).rev() {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        order.swap(i, (s % (i as u64 + 1)) as usize);
                    }
                }
                let mut acc = 0.0f32;
                for &i in &order {
                    acc += c[i];
                }
                prop_assert_eq!(acc as f64, exact);
            }
        }
    }
}
