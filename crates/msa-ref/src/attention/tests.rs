use half::bf16;
use msa_plan::topology::{HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS};
use msa_plan::VarlenLayout;

use super::backward::backward_with_delta;
use super::*;
use crate::compare::allclose;
use crate::error::RefError;
use crate::testing::{bf16s, in_set, plant_peaks, queries, to_f64};
use msa_oracle::{dense_forward, dense_gradients, Problem};
use msa_plan::peak::PEAKED_STD;
use msa_plan::testing::{messy_topk, recent_topk, SplitMix64};

const D: usize = HEAD_DIM;

struct Case {
    layout: VarlenLayout,
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    topk: Vec<i32>,
    dout: Vec<bf16>,
}

impl Case {
    fn new(
        layout: VarlenLayout,
        topk: impl FnOnce(&VarlenLayout, &mut SplitMix64) -> Vec<i32>,
        seed: u64,
    ) -> Self {
        let mut rng = SplitMix64::new(seed);
        let (t, tk) = (layout.total_q(), layout.total_k());
        let q = bf16s(&mut rng, t * NUM_Q_HEADS * D, 0.2);
        let k = bf16s(&mut rng, tk * NUM_KV_HEADS * D, 0.2);
        let v = bf16s(&mut rng, tk * NUM_KV_HEADS * D, 0.2);
        let dout = bf16s(&mut rng, t * NUM_Q_HEADS * D, 0.1);
        let topk = topk(&layout, &mut rng);
        Self {
            layout,
            q,
            k,
            v,
            topk,
            dout,
        }
    }

    /// Peaked inputs (docs/contract.md §7.3): q and k of std 1.5 and a planted maximum-score key
    /// per (query, group) in a late selected block.
    fn peaked(
        layout: VarlenLayout,
        topk: impl FnOnce(&VarlenLayout, &mut SplitMix64) -> Vec<i32>,
        seed: u64,
    ) -> Self {
        let mut rng = SplitMix64::new(seed);
        let (t, tk) = (layout.total_q(), layout.total_k());
        let mut q = bf16s(&mut rng, t * NUM_Q_HEADS * D, PEAKED_STD);
        let k = bf16s(&mut rng, tk * NUM_KV_HEADS * D, PEAKED_STD);
        let v = bf16s(&mut rng, tk * NUM_KV_HEADS * D, 0.2);
        let dout = bf16s(&mut rng, t * NUM_Q_HEADS * D, 0.1);
        let topk = topk(&layout, &mut rng);
        plant_peaks(&layout, &topk, &mut q, 16, &k, NUM_KV_HEADS, seed);
        Self {
            layout,
            q,
            k,
            v,
            topk,
            dout,
        }
    }

    fn inputs(&self) -> AttentionInputs<'_> {
        AttentionInputs {
            layout: &self.layout,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            topk: &self.topk,
        }
    }

    /// The same problem for the f64 oracle.
    fn problem(&self) -> Problem<'_> {
        Problem {
            layout: &self.layout,
            q: &self.q,
            k: &self.k,
            v: &self.v,
            topk: &self.topk,
            dout: Some(&self.dout),
            index: None,
        }
    }

    /// The oracle's `(out, lse)`.
    fn dense(&self) -> (Vec<f64>, Vec<f64>) {
        dense_forward(&self.problem())
    }
}

/// Random selections padded with every entry the contract ignores.
fn random(l: &VarlenLayout, rng: &mut SplitMix64) -> Vec<i32> {
    messy_topk(l, rng.next_u64())
}

fn recent(l: &VarlenLayout, _: &mut SplitMix64) -> Vec<i32> {
    recent_topk(l)
}

/// A document split into 3 CP fragments (partial last blocks), then a short document.
fn fragments() -> VarlenLayout {
    VarlenLayout::new(
        &[0, 20, 45, 60, 70],
        &[0, 300, 700, 1000, 1050],
        Some(&[0, 0, 0, 3]),
    )
    .unwrap()
}

/// Single-token documents between documents that are not multiples of 128.
fn odd_documents() -> VarlenLayout {
    VarlenLayout::new(&[0, 1, 3, 4, 20], &[0, 1, 130, 131, 400], None).unwrap()
}

/// More than 16 visible blocks, so selections are really sparse.
fn long_document() -> VarlenLayout {
    VarlenLayout::new(&[0, 4], &[0, 2600], None).unwrap()
}

fn as_f32(x: &[f64]) -> Vec<f32> {
    x.iter().map(|&v| v as f32).collect()
}

/// The contract's shared-fragment example (`testing.py make_shared_fragment_metadata`).
fn contract_example() -> VarlenLayout {
    VarlenLayout::new(&[0, 32, 64], &[0, 128, 256], Some(&[0, 0])).unwrap()
}

#[test]
fn forward_equals_dense_attention_under_the_selection_mask() {
    let cases = [
        Case::new(contract_example(), random, 11),
        Case::new(fragments(), random, 1),
        Case::new(fragments(), recent, 2),
        Case::new(odd_documents(), random, 3),
        Case::new(long_document(), random, 4),
        Case::new(long_document(), recent, 5),
        Case::peaked(fragments(), random, 16),
        Case::peaked(long_document(), recent, 17),
    ];
    for (i, case) in cases.iter().enumerate() {
        let fwd = forward(&case.inputs()).unwrap();
        let (out, lse) = case.dense();
        // Peaked scores (|s| up to ~20) carry a tenfold larger f32 rounding into exp.
        let atol = if i >= 6 { 2e-6 } else { 2e-7 };
        let r = allclose(&fwd.out, &as_f32(&out), atol, 1e-6);
        assert!(r.passed(), "case {i} out: {r}");
        let r = allclose(&fwd.lse, &as_f32(&lse), 1e-6, 1e-6);
        assert!(r.passed(), "case {i} lse: {r}");
        assert_eq!(fwd.out_bf16(), crate::compare::to_bf16(&fwd.out));
    }
    // The random pattern really produced empty sets (zero rows, -inf LSE) and invalid entries.
    let fwd = forward(&cases[1].inputs()).unwrap();
    let empty = fwd.lse.iter().filter(|l| **l == f32::NEG_INFINITY).count();
    assert!(empty >= 16, "{empty} empty (query, head) sets");
    // Peaked inputs really are: MSA's inputs give LSE ≈ ln(keys) (below 8 for 2,048 keys), the
    // planted keys lift most rows far above it.
    let peaked = forward(&cases[7].inputs()).unwrap();
    let high = peaked.lse.iter().filter(|l| **l > 10.0).count();
    assert!(
        high * 10 > peaked.lse.len() * 8,
        "{high} of {}",
        peaked.lse.len()
    );
}

#[test]
fn backward_equals_dense_gradients() {
    let cases = [
        Case::new(contract_example(), recent, 12),
        Case::new(fragments(), random, 13),
        Case::new(odd_documents(), random, 14),
        Case::new(long_document(), recent, 15),
        Case::peaked(fragments(), random, 18),
        Case::peaked(long_document(), recent, 19),
    ];
    for (i, case) in cases.iter().enumerate() {
        let (out, lse) = case.dense();
        let dout = to_f64(&case.dout);
        let delta: Vec<f32> = out
            .chunks_exact(D)
            .zip(dout.chunks_exact(D))
            .map(|(o, d)| o.iter().zip(d).map(|(a, b)| a * b).sum::<f64>() as f32)
            .collect();
        let got = backward_with_delta(&case.inputs(), &case.dout, &delta, &as_f32(&lse));
        let want = dense_gradients(&case.problem());
        for (name, got, want) in [
            ("dq", &got.dq, &want[0]),
            ("dk", &got.dk, &want[1]),
            ("dv", &got.dv, &want[2]),
        ] {
            let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
            let r = allclose(got, &as_f32(want), 1e-5 * scale, 1e-4);
            assert!(r.passed(), "case {i} {name}: {r}");
        }
    }
}

/// `L = Σ dout·O` in f64.
fn loss(case: &Case, q: &[f64], k: &[f64], v: &[f64]) -> f64 {
    let (out, _) = dense_forward(&Problem {
        layout: &case.layout,
        q,
        k,
        v,
        topk: &case.topk,
        dout: None,
        index: None,
    });
    out.iter()
        .zip(&case.dout)
        .map(|(o, d)| o * d.to_f64())
        .sum()
}

#[test]
fn gradients_match_central_finite_differences() {
    let layout = VarlenLayout::new(&[0, 3, 8], &[0, 200, 300], Some(&[0, 0])).unwrap();
    let mut case = Case::new(layout, random, 6);
    let t = case.layout.total_q();
    // Group 3 never selects block 1, so its keys 128..256 have zero gradients.
    case.topk[3 * t * TOPK_BLOCKS..]
        .iter_mut()
        .filter(|e| **e == 1)
        .for_each(|e| *e = -1);
    let (out, lse) = case.dense();
    // The exact delta (from the unrounded output), so only f32 rounding separates the
    // reference from the true gradient.
    let delta: Vec<f32> = (0..t * NUM_Q_HEADS)
        .map(|r| {
            (0..D)
                .map(|d| out[r * D + d] * case.dout[r * D + d].to_f64())
                .sum::<f64>() as f32
        })
        .collect();
    let grads = backward_with_delta(&case.inputs(), &case.dout, &delta, &as_f32(&lse));

    let mut rng = SplitMix64::new(60);
    let base = [to_f64(&case.q), to_f64(&case.k), to_f64(&case.v)];
    // Keys some query selects (non-zero gradients) and one key nobody selects.
    let mut selected = Vec::new();
    for &(q, p, _) in &queries(&case.layout) {
        for g in 0..NUM_KV_HEADS {
            for j in 0..=p {
                if in_set(&case.topk, t, g, q, p, j) {
                    selected.push((j, g));
                }
            }
        }
    }
    let unselected = (150, 3);
    assert!(!selected.contains(&unselected));
    let h = 1e-4;
    for (which, grad) in [&grads.dq, &grads.dk, &grads.dv].into_iter().enumerate() {
        let scale = grad.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
        let mut entries: Vec<usize> = (0..6)
            .map(|_| match which {
                0 => rng.below(base[0].len()),
                _ => {
                    let (j, g) = selected[rng.below(selected.len())];
                    (j * NUM_KV_HEADS + g) * D + rng.below(D)
                }
            })
            .collect();
        if which > 0 {
            entries.push((unselected.0 * NUM_KV_HEADS + unselected.1) * D + 5);
        }
        for at in entries {
            let eval = |delta: f64| {
                let mut x = base.clone();
                x[which][at] += delta;
                loss(&case, &x[0], &x[1], &x[2])
            };
            let fd = (eval(h) - eval(-h)) / (2.0 * h);
            let got = grad[at] as f64;
            assert!(
                (got - fd).abs() <= 1e-5 * scale + 1e-4 * fd.abs(),
                "tensor {which} entry {at}: {got} vs fd {fd}"
            );
        }
    }

    // The public entry point (delta from the bf16 output) stays within bf16 rounding of it.
    let out_bf16 = crate::compare::to_bf16(&as_f32(&out));
    let public = backward(&case.inputs(), &case.dout, &out_bf16, &as_f32(&lse)).unwrap();
    for (a, b) in [
        (&public.dq, &grads.dq),
        (&public.dk, &grads.dk),
        (&public.dv, &grads.dv),
    ] {
        assert!(crate::compare::cosine(a, b) > 0.9999);
    }
    assert_eq!(public.dv, grads.dv, "dV does not depend on delta");
}

#[test]
fn empty_selections_give_zero_output_and_zero_gradients() {
    // Only ignored entries: -1, negative, past the document, and future blocks.
    let layout = VarlenLayout::new(&[0, 32, 64], &[0, 128, 300], Some(&[0, 0])).unwrap();
    let junk = |l: &VarlenLayout, _: &mut SplitMix64| {
        let mut topk = vec![-1i32; NUM_KV_HEADS * l.total_q() * TOPK_BLOCKS];
        for (i, e) in topk.iter_mut().enumerate() {
            *e = [-1, -7, 3, 9][i % 4];
        }
        // Fragment 0's queries (positions 96..127) would see block 2 only in the future.
        topk[..TOPK_BLOCKS].fill(2);
        topk
    };
    let case = Case::new(layout, junk, 7);
    let fwd = forward(&case.inputs()).unwrap();
    assert!(fwd.out.iter().all(|&x| x == 0.0));
    assert!(fwd.lse.iter().all(|&x| x == f32::NEG_INFINITY));
    let g = backward(&case.inputs(), &case.dout, &fwd.out_bf16(), &fwd.lse).unwrap();
    assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|&x| x == 0.0));
}

#[test]
fn unselected_keys_get_exact_zero_gradients() {
    // Group 0 never selects block 1; group 1 selects only block 0 of fragment 1's document.
    let layout = VarlenLayout::new(&[0, 10, 20], &[0, 200, 400], Some(&[0, 0])).unwrap();
    let pattern = |l: &VarlenLayout, _: &mut SplitMix64| {
        let t = l.total_q();
        let mut topk = recent_topk(l);
        for q in 0..t {
            topk[q * TOPK_BLOCKS..(q + 1) * TOPK_BLOCKS]
                .iter_mut()
                .for_each(|e| {
                    if *e == 1 {
                        *e = -1
                    }
                });
            topk[(t + q) * TOPK_BLOCKS..(t + q + 1) * TOPK_BLOCKS]
                .copy_from_slice(&[0; TOPK_BLOCKS]);
        }
        topk
    };
    let case = Case::new(layout, pattern, 8);
    let fwd = forward(&case.inputs()).unwrap();
    let g = backward(&case.inputs(), &case.dout, &fwd.out_bf16(), &fwd.lse).unwrap();
    let at = |j: usize, grp: usize| (j * NUM_KV_HEADS + grp) * D..(j * NUM_KV_HEADS + grp + 1) * D;
    for j in 0..400 {
        let (zero_g0, zero_g1) = (j / 128 == 1, j >= 128);
        for (grp, zero) in [(0, zero_g0), (1, zero_g1)] {
            for t in [&g.dk, &g.dv] {
                let row = &t[at(j, grp)];
                assert_eq!(row.iter().all(|&x| x == 0.0), zero, "key {j} group {grp}");
            }
        }
    }
}

#[test]
fn subset_apis_equal_full_results_and_threads_do_not_matter() {
    let case = Case::new(fragments(), random, 9);
    let inputs = case.inputs();
    let fwd = forward(&inputs).unwrap();
    let (out, lse) = (fwd.out_bf16(), fwd.lse.clone());
    let full = backward(&inputs, &case.dout, &out, &lse).unwrap();

    let qs = [69, 3, 20, 3, 44, 0];
    let sub = forward_queries(&inputs, &qs).unwrap();
    let dq = backward_dq_queries(&inputs, &case.dout, &out, &lse, &qs).unwrap();
    let row = NUM_Q_HEADS * D;
    for (i, &q) in qs.iter().enumerate() {
        assert_eq!(
            sub.out[i * row..(i + 1) * row],
            fwd.out[q * row..(q + 1) * row]
        );
        assert_eq!(
            sub.lse[i * NUM_Q_HEADS..(i + 1) * NUM_Q_HEADS],
            fwd.lse[q * NUM_Q_HEADS..(q + 1) * NUM_Q_HEADS]
        );
        assert_eq!(dq[i * row..(i + 1) * row], full.dq[q * row..(q + 1) * row]);
    }
    for (g, rows) in [
        (0, 0..1050),
        (1, 100..300),
        (3, 250..260),
        (2, 999..1001),
        (2, 5..5),
    ] {
        let (dk, dv) = backward_dkv_keys(&inputs, &case.dout, &out, &lse, g, rows.clone()).unwrap();
        for (i, j) in rows.enumerate() {
            let at = (j * NUM_KV_HEADS + g) * D;
            assert_eq!(
                dk[i * D..(i + 1) * D],
                full.dk[at..at + D],
                "dk key {j} group {g}"
            );
            assert_eq!(
                dv[i * D..(i + 1) * D],
                full.dv[at..at + D],
                "dv key {j} group {g}"
            );
        }
    }

    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let serial = pool.install(|| backward(&inputs, &case.dout, &out, &lse).unwrap());
    assert_eq!(serial, full);
    assert_eq!(pool.install(|| forward(&inputs).unwrap()), fwd);
}

#[test]
fn malformed_inputs_are_rejected() {
    let case = Case::new(odd_documents(), recent, 10);
    let mut inputs = case.inputs();
    inputs.v = &case.v[1..];
    assert!(matches!(
        forward(&inputs),
        Err(RefError::Length { name: "v", .. })
    ));
    let inputs = case.inputs();
    let err = forward_queries(&inputs, &[0, 20]).unwrap_err();
    assert_eq!(err.to_string(), "query 20 is out of range (limit 20)");
    let fwd = forward(&inputs).unwrap();
    let (out, lse) = (fwd.out_bf16(), fwd.lse.clone());
    let short = &lse[1..];
    assert!(matches!(
        backward(&inputs, &case.dout, &out, short),
        Err(RefError::Length { name: "lse", .. })
    ));
    let err = backward_dkv_keys(&inputs, &case.dout, &out, &lse, 4, 0..1).unwrap_err();
    assert!(matches!(err, RefError::OutOfRange { what: "group", .. }));
    let err = backward_dkv_keys(&inputs, &case.dout, &out, &lse, 0, 390..401).unwrap_err();
    assert_eq!(
        err.to_string(),
        "key rows 390..401 is out of range (limit 400)"
    );
}

mod oracle_cross_check {
    //! The reference against the independent f64 oracle (msa-oracle) over random layouts whose
    //! documents are longer than 2,048 tokens (more than 16 blocks: selections really leave
    //! blocks out) and random selections holding every entry the contract ignores (-1, other
    //! negatives, future blocks, ids past the document, repeats), on MSA's and on peaked inputs.

    use msa_oracle::{dense_forward, dense_gradients, Problem};
    use msa_plan::testing::{layout_from_documents, messy_topk, DocumentFragments};
    use proptest::prelude::*;

    use super::*;
    use crate::indexer::{selection_lse, IndexerInputs};
    use crate::kl::kl_backward;
    use msa_plan::topology::{INDEX_DIM, NUM_INDEX_HEADS};

    /// One document of 2,049 to 4,200 tokens held as one or two fragments of at most 10
    /// queries each, anywhere in the document.
    fn long_document() -> impl Strategy<Value = DocumentFragments> {
        (2049usize..=4200).prop_flat_map(|len| {
            prop::collection::vec((1..=len, 1usize..=10), 1..=2).prop_map(move |mut cuts| {
                cuts.sort_unstable();
                let mut frags: DocumentFragments = Vec::new();
                for (end, n) in cuts {
                    let prev = frags.last().map_or(0, |f| f.1);
                    let begin = end.saturating_sub(n).max(prev);
                    if begin < end {
                        frags.push((begin, end));
                    }
                }
                frags
            })
        })
    }

    /// One or two long documents, the second sometimes a short one.
    fn layouts() -> impl Strategy<Value = VarlenLayout> {
        let short = (1usize..=300).prop_map(|len| vec![(len.saturating_sub(6), len)]);
        (
            long_document(),
            prop_oneof![long_document(), short],
            any::<bool>(),
        )
            .prop_map(|(a, b, two)| {
                let docs = if two { vec![a, b] } else { vec![a] };
                layout_from_documents(&docs, true)
            })
    }

    fn max_ratio(got: &[f32], want: &[f64], atol: f64, rtol: f64) -> f64 {
        got.iter()
            .zip(want)
            .map(|(&g, &w)| {
                if g as f64 == w {
                    0.0
                } else {
                    (g as f64 - w).abs() / (atol + rtol * w.abs())
                }
            })
            .fold(0.0, f64::max)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 8, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn the_reference_agrees_with_the_oracle(l in layouts(), seed in any::<u64>(), peaked in any::<bool>()) {
            let topk = move |l: &VarlenLayout, _: &mut SplitMix64| messy_topk(l, seed);
            let case = if peaked { Case::peaked(l, topk, seed) } else { Case::new(l, topk, seed) };
            let mut rng = SplitMix64::new(seed ^ 0x5EED);
            let (t, tk) = (case.layout.total_q(), case.layout.total_k());
            let qi = bf16s(&mut rng, t * NUM_INDEX_HEADS * INDEX_DIM, 0.2);
            let ki = bf16s(&mut rng, tk * INDEX_DIM, 0.2);
            let prob = Problem { index: Some((&qi, &ki)), ..case.problem() };

            // Forward: every query and head.
            let fwd = forward(&case.inputs()).unwrap();
            let (out, lse) = dense_forward(&prob);
            prop_assert!(max_ratio(&fwd.out, &out, 2e-6, 1e-5) <= 1.0);
            prop_assert!(max_ratio(&fwd.lse, &lse, 1e-5, 1e-6) <= 1.0);

            // Backward with the oracle's exact statistics: f32 accumulation is the difference.
            let dout = to_f64(&case.dout);
            let delta: Vec<f32> = out
                .chunks_exact(D)
                .zip(dout.chunks_exact(D))
                .map(|(o, d)| o.iter().zip(d).map(|(a, b)| a * b).sum::<f64>() as f32)
                .collect();
            let got = backward_with_delta(&case.inputs(), &case.dout, &delta, &as_f32(&lse));
            let want = dense_gradients(&prob);
            for (name, g, w) in [("dq", &got.dq, &want[0]), ("dk", &got.dk, &want[1]), ("dv", &got.dv, &want[2])] {
                let scale = w.iter().fold(0f64, |m, x| m.max(x.abs()));
                let r = allclose(g, &as_f32(w), 1e-5 * scale, 1e-4);
                prop_assert!(r.passed(), "{}: {}", name, r);
            }

            // KL: dQI against the oracle's exact row, dKI against its independent row given the
            // LSEs the reference takes; dz is rounded to bf16 on both sides.
            let ii = IndexerInputs { layout: &case.layout, qi: &qi, ki: &ki };
            let all: Vec<usize> = (0..t).collect();
            let ilse = selection_lse(&ii, &case.topk, &all).unwrap();
            let kl_inputs = AttentionInputs { v: &case.k, ..case.inputs() };
            let g = kl_backward(&kl_inputs, &fwd.lse, &qi, &ki, &ilse, 1.7).unwrap();
            let dqi: Vec<f64> = (0..t)
                .flat_map(|q| (0..NUM_INDEX_HEADS).map(move |h| (q, h)))
                .flat_map(|(q, h)| prob.kl_dqi_row(q, h, 1.7))
                .collect();
            let dki: Vec<f64> = (0..tk)
                .flat_map(|r| {
                    prob.kl_dki_row(
                        r,
                        1.7,
                        |q, h| fwd.lse[q * NUM_Q_HEADS + h] as f64,
                        |h, q| ilse[h * t + q] as f64,
                    )
                })
                .collect();
            for (name, got, want) in [("dqi", &g.dqi, dqi), ("dki", &g.dki, dki)] {
                let want = as_f32(&want);
                let l2 = crate::compare::l2_rel(got, &want);
                prop_assert!(l2 < 2e-3, "{} l2_rel {}", name, l2);
            }
        }
    }
}
