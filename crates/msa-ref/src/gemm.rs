//! The two dense products every pass is built from, over 128-wide rows, with an AVX2+FMA
//! variant picked at run time.
//!
//! Both variants are generated from one source (`kernels!`) over their own 8-lane vector
//! primitives, so they run the same operations in the same order and differ only in fused
//! versus separate multiply-add. Each output element is produced by the same sequence whatever
//! the tile shape or its position in the tile, so a score recomputed in another pass (or for a
//! subset of queries) is bitwise equal to the first computation. The AVX2 primitives are
//! explicit intrinsics: autovectorization of these tiles turned out to depend on how the
//! crate is split into codegen units.

use msa_plan::topology::{HEAD_DIM, INDEX_DIM};

/// Row width of every operand: the attention head dim and the indexer dim are both 128.
pub(crate) const D: usize = HEAD_DIM;
const _: () = assert!(HEAD_DIM == INDEX_DIM);

#[inline(always)]
fn row(m: &[f32], i: usize) -> &[f32; D] {
    m[i * D..(i + 1) * D].try_into().unwrap()
}

/// The kernels over a backend's vector type `V` and primitives `zero`, `load`, `store`,
/// `splat`, `add`, `madd`, `hsum` (a fixed pairwise tree over the 8 lanes) and `hsum8` (the
/// same tree for 8 vectors at once).
macro_rules! kernels {
    ($(#[$attr:meta])*) => {
        /// Dot products of `R` rows with `K` keys: one 8-lane chain per pair, 8 independent
        /// chains for the 4 x 2 tile, and 6 loads per 8 multiply-adds.
        $(#[$attr])*
        fn dot_tile<const R: usize, const K: usize>(
            rows: [&[f32; D]; R],
            keys: [&[f32; D]; K],
        ) -> [[f32; K]; R] {
            let mut acc = [[zero(); K]; R];
            for c in 0..D / 8 {
                let mut x = [zero(); K];
                for k in 0..K {
                    x[k] = load(&keys[k][c * 8..]);
                }
                for r in 0..R {
                    let a = load(&rows[r][c * 8..]);
                    for k in 0..K {
                        acc[r][k] = madd(a, x[k], acc[r][k]);
                    }
                }
            }
            let mut out = [[0f32; K]; R];
            if R * K == 8 {
                let mut all = [zero(); 8];
                for (i, v) in all.iter_mut().enumerate() {
                    *v = acc[i / K][i % K];
                }
                for (i, sum) in hsum8(all).into_iter().enumerate() {
                    out[i / K][i % K] = sum;
                }
            } else {
                for r in 0..R {
                    for k in 0..K {
                        out[r][k] = hsum(acc[r][k]);
                    }
                }
            }
            out
        }

        $(#[$attr])*
        fn dot_rows_from<const K: usize>(a: &[f32], keys: [&[f32; D]; K], j: usize, out: &mut [f32], ldo: usize) {
            let m = a.len() / D;
            let mut i = 0;
            while i + 4 <= m {
                let t = dot_tile::<4, K>([row(a, i), row(a, i + 1), row(a, i + 2), row(a, i + 3)], keys);
                for (r, t) in t.iter().enumerate() {
                    out[(i + r) * ldo + j..][..K].copy_from_slice(t);
                }
                i += 4;
            }
            for i in i..m {
                let t = dot_tile::<1, K>([row(a, i)], keys);
                out[i * ldo + j..][..K].copy_from_slice(&t[0]);
            }
        }

        /// `out[i·ldo + j] = a_i · b_j`.
        $(#[$attr])*
        pub(super) fn dot_rows(a: &[f32], b: &[f32], out: &mut [f32], ldo: usize) {
            let n = b.len() / D;
            let mut j = 0;
            while j + 2 <= n {
                dot_rows_from::<2>(a, [row(b, j), row(b, j + 1)], j, out, ldo);
                j += 2;
            }
            if j < n {
                dot_rows_from::<1>(a, [row(b, j)], j, out, ldo);
            }
        }

        /// `W · B` for `R` output rows, 32 columns at a time: 4 chains per row.
        $(#[$attr])*
        fn accumulate_rows<const R: usize>(w: [&[f32]; R], b: &[f32], out: [&mut [f32]; R]) {
            for c in 0..D / 32 {
                let mut acc = [[zero(); 4]; R];
                for (j, bj) in b.chunks_exact(D).enumerate() {
                    let bj = &bj[c * 32..c * 32 + 32];
                    let x = [load(bj), load(&bj[8..]), load(&bj[16..]), load(&bj[24..])];
                    for r in 0..R {
                        let wr = splat(w[r][j]);
                        for v in 0..4 {
                            acc[r][v] = madd(wr, x[v], acc[r][v]);
                        }
                    }
                }
                for r in 0..R {
                    for v in 0..4 {
                        let o = &mut out[r][c * 32 + v * 8..];
                        let sum = add(load(o), acc[r][v]);
                        store(o, sum);
                    }
                }
            }
        }

        /// `out_i += Σ_j w[i·ldw + j] · b_j`.
        $(#[$attr])*
        pub(super) fn accumulate(w: &[f32], ldw: usize, b: &[f32], out: &mut [f32]) {
            let n = b.len() / D;
            let wrow = |i: usize| &w[i * ldw..i * ldw + n];
            let mut pairs = out.chunks_exact_mut(2 * D);
            let mut i = 0;
            for pair in &mut pairs {
                let (o0, o1) = pair.split_at_mut(D);
                accumulate_rows::<2>([wrow(i), wrow(i + 1)], b, [o0, o1]);
                i += 2;
            }
            let last = pairs.into_remainder();
            if !last.is_empty() {
                accumulate_rows::<1>([wrow(i)], b, [last]);
            }
        }
    };
}

/// Plain f32 lanes (separate multiply and add: without hardware FMA, `mul_add` is a libm call).
mod portable {
    use super::{row, D};

    type V = [f32; 8];

    #[inline(always)]
    fn zero() -> V {
        [0.0; 8]
    }

    #[inline(always)]
    fn load(s: &[f32]) -> V {
        s[..8].try_into().unwrap()
    }

    #[inline(always)]
    fn store(s: &mut [f32], v: V) {
        s[..8].copy_from_slice(&v);
    }

    #[inline(always)]
    fn splat(x: f32) -> V {
        [x; 8]
    }

    #[inline(always)]
    fn add(a: V, b: V) -> V {
        std::array::from_fn(|l| a[l] + b[l])
    }

    #[inline(always)]
    fn madd(a: V, b: V, c: V) -> V {
        std::array::from_fn(|l| a[l] * b[l] + c[l])
    }

    #[inline(always)]
    fn hsum(v: V) -> f32 {
        let q = [v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]];
        (q[0] + q[2]) + (q[1] + q[3])
    }

    #[inline(always)]
    fn hsum8(v: [V; 8]) -> [f32; 8] {
        v.map(hsum)
    }

    kernels!(#[inline(always)]);
}

/// AVX2 registers with fused multiply-add.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{row, D};

    type V = __m256;

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn zero() -> V {
        _mm256_setzero_ps()
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn load(s: &[f32]) -> V {
        let s = &s[..8];
        // SAFETY: `s` holds 8 floats; the load is unaligned.
        unsafe { _mm256_loadu_ps(s.as_ptr()) }
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn store(s: &mut [f32], v: V) {
        let s = &mut s[..8];
        // SAFETY: `s` holds 8 floats; the store is unaligned.
        unsafe { _mm256_storeu_ps(s.as_mut_ptr(), v) }
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn splat(x: f32) -> V {
        _mm256_set1_ps(x)
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn add(a: V, b: V) -> V {
        _mm256_add_ps(a, b)
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn madd(a: V, b: V, c: V) -> V {
        _mm256_fmadd_ps(a, b, c)
    }

    /// The portable tree: `q_l = v_l + v_{l+4}`, then `(q0 + q2) + (q1 + q3)`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn hsum(v: V) -> f32 {
        let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(q, _mm_movehl_ps(q, q));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    }

    /// `[a.lo + a.hi | b.lo + b.hi]`: the first level of the tree for two vectors.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn fold_halves(a: V, b: V) -> V {
        let lo = _mm256_permute2f128_ps::<0x20>(a, b);
        let hi = _mm256_permute2f128_ps::<0x31>(a, b);
        _mm256_add_ps(lo, hi)
    }

    /// Per 128-bit lane, `[x0 + x2, x1 + x3, y0 + y2, y1 + y3]`: the second level.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn fold_pairs(x: V, y: V) -> V {
        let even = _mm256_shuffle_ps::<0b01_00_01_00>(x, y);
        let odd = _mm256_shuffle_ps::<0b11_10_11_10>(x, y);
        _mm256_add_ps(even, odd)
    }

    /// `hsum` of 8 vectors with the tree transposed: 21 vector operations instead of 48.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn hsum8(v: [V; 8]) -> [f32; 8] {
        let ac_bd = fold_pairs(fold_halves(v[0], v[1]), fold_halves(v[2], v[3]));
        let eg_fh = fold_pairs(fold_halves(v[4], v[5]), fold_halves(v[6], v[7]));
        let first = _mm256_shuffle_ps::<0b10_00_10_00>(ac_bd, eg_fh);
        let second = _mm256_shuffle_ps::<0b11_01_11_01>(ac_bd, eg_fh);
        let mut t = [0f32; 8];
        store(&mut t, _mm256_add_ps(first, second));
        // Lanes hold [a c e g | b d f h].
        [t[0], t[4], t[1], t[5], t[2], t[6], t[3], t[7]]
    }

    kernels!(#[target_feature(enable = "avx2,fma")] #[inline]);
}

#[cfg(target_arch = "x86_64")]
fn avx2_fma() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// `out[i·ldo + j] = a_i · b_j` for the 128-wide rows `a_i` of `a` and `b_j` of `b`.
pub(crate) fn dot_rows(a: &[f32], b: &[f32], out: &mut [f32], ldo: usize) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time just above).
        return unsafe { avx2::dot_rows(a, b, out, ldo) };
    }
    portable::dot_rows(a, b, out, ldo)
}

/// `out_i += Σ_j w[i·ldw + j] · b_j` for the 128-wide rows `out_i` of `out` and `b_j` of `b`.
pub(crate) fn accumulate(w: &[f32], ldw: usize, b: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked at run time just above).
        return unsafe { avx2::accumulate(w, ldw, b, out) };
    }
    portable::accumulate(w, ldw, b, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use msa_plan::testing::SplitMix64;

    fn matrix(rng: &mut SplitMix64, rows: usize) -> Vec<f32> {
        (0..rows * D).map(|_| rng.normal() as f32).collect()
    }

    fn dot64(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
    }

    type DotRows = fn(&[f32], &[f32], &mut [f32], usize);
    type Accumulate = fn(&[f32], usize, &[f32], &mut [f32]);

    /// Every backend this CPU runs.
    fn backends() -> Vec<(DotRows, Accumulate)> {
        let mut all: Vec<(DotRows, Accumulate)> = vec![(portable::dot_rows, portable::accumulate)];
        #[cfg(target_arch = "x86_64")]
        if avx2_fma() {
            // SAFETY: AVX2 and FMA were detected above.
            all.push((
                |a, b, o, l| unsafe { avx2::dot_rows(a, b, o, l) },
                |w, l, b, o| unsafe { avx2::accumulate(w, l, b, o) },
            ));
        }
        all
    }

    #[test]
    fn products_match_f64_and_every_tile_shape_gives_the_same_bits() {
        let mut rng = SplitMix64::new(7);
        // 7 rows: a 4-row tile and a 1-row tail; 5 keys: two 2-key tiles and a 1-key tail.
        let (m, n) = (7, 5);
        let (a, b) = (matrix(&mut rng, m), matrix(&mut rng, n));
        let w: Vec<f32> = (0..m * 9).map(|_| rng.normal() as f32).collect();
        let init = matrix(&mut rng, m);
        for (dot_rows, accumulate) in backends() {
            let mut out = vec![0f32; m * n];
            dot_rows(&a, &b, &mut out, n);
            for i in 0..m {
                for j in 0..n {
                    let want = dot64(&a[i * D..(i + 1) * D], &b[j * D..(j + 1) * D]);
                    assert!((out[i * n + j] as f64 - want).abs() < 1e-5, "({i},{j})");
                    let mut one = [0f32];
                    dot_rows(&a[i * D..(i + 1) * D], &b[j * D..(j + 1) * D], &mut one, 1);
                    assert_eq!(one[0].to_bits(), out[i * n + j].to_bits());
                }
            }
            let mut acc = init.clone();
            accumulate(&w, 9, &b, &mut acc);
            for i in 0..m {
                for d in 0..D {
                    let terms = (0..n).map(|j| w[i * 9 + j] as f64 * b[j * D + d] as f64);
                    let want = init[i * D + d] as f64 + terms.sum::<f64>();
                    assert!((acc[i * D + d] as f64 - want).abs() < 1e-5, "({i},{d})");
                }
                let mut single = init[i * D..(i + 1) * D].to_vec();
                accumulate(&w[i * 9..], 9, &b, &mut single);
                assert_eq!(single, acc[i * D..(i + 1) * D]);
            }
        }
    }

    /// Whether the AVX2+FMA path can be tested here. Without it the test says so on stderr (a
    /// skip, not a silent pass) and fails when `MSA_REQUIRE_AVX2` is set, so a CI host that
    /// should have it cannot lose the comparison unnoticed.
    #[cfg(target_arch = "x86_64")]
    fn avx2_testable(test: &str) -> bool {
        if avx2_fma() {
            return true;
        }
        let required = std::env::var_os("MSA_REQUIRE_AVX2").is_some_and(|v| v != "0");
        assert!(
            !required,
            "{test}: this CPU has no AVX2+FMA but MSA_REQUIRE_AVX2 is set"
        );
        eprintln!("SKIPPED {test}: this CPU has no AVX2+FMA, only the portable path is tested");
        false
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_and_portable_paths_agree_to_rounding() {
        if !avx2_testable("avx2_and_portable_paths_agree_to_rounding") {
            return;
        }
        let mut rng = SplitMix64::new(11);
        let (a, b) = (matrix(&mut rng, 5), matrix(&mut rng, 3));
        let (mut fused, mut separate) = (vec![0f32; 15], vec![0f32; 15]);
        // SAFETY: AVX2 and FMA were detected above.
        unsafe { avx2::dot_rows(&a, &b, &mut fused, 3) };
        portable::dot_rows(&a, &b, &mut separate, 3);
        for (x, y) in fused.iter().zip(&separate) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
        assert_ne!(
            fused, separate,
            "the paths really differ (fused multiply-add)"
        );
        let (mut fused, mut separate) = (a.clone(), a.clone());
        // SAFETY: as above.
        unsafe { avx2::accumulate(&b[..15], 3, &b, &mut fused) };
        portable::accumulate(&b[..15], 3, &b, &mut separate);
        for (x, y) in fused.iter().zip(&separate) {
            assert!((x - y).abs() < 1e-5, "{x} vs {y}");
        }
    }
}
