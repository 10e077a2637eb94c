use half::bf16;
use msa_plan::topology::{
    HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS,
};
use msa_plan::VarlenLayout;

use super::*;
use crate::attention::forward;
use crate::compare::{cosine, l2_rel};
use crate::error::RefError;
use crate::indexer::{selection_lse, IndexerInputs};
use crate::testing::{bf16s, in_set, plant_peaks, queries, to_f64};
use msa_plan::peak::PEAKED_STD;
use msa_plan::testing::{messy_topk, SplitMix64};

const COEFF: f32 = 1.7;

struct Case {
    layout: VarlenLayout,
    q: Vec<bf16>,
    k: Vec<bf16>,
    topk: Vec<i32>,
    qi: Vec<bf16>,
    ki: Vec<bf16>,
    teacher_lse: Vec<f32>,
    indexer_lse: Vec<f32>,
}

impl Case {
    /// Random inputs; the teacher LSE is the attention forward's and the student LSE is taken
    /// over the same token sets, as the contract requires.
    fn new(
        layout: VarlenLayout,
        topk: impl FnOnce(&VarlenLayout, &mut SplitMix64) -> Vec<i32>,
        seed: u64,
    ) -> Self {
        Self::drawn(layout, topk, seed, false)
    }

    /// MSA's input protocol, or (`peaked`) q, k, qi, ki of std 1.5 with planted maximum-score
    /// keys (docs/contract.md §7.3): peaked teachers and students.
    fn drawn(
        layout: VarlenLayout,
        topk: impl FnOnce(&VarlenLayout, &mut SplitMix64) -> Vec<i32>,
        seed: u64,
        peaked: bool,
    ) -> Self {
        let mut rng = SplitMix64::new(seed);
        let (t, tk) = (layout.total_q(), layout.total_k());
        let std = if peaked { PEAKED_STD } else { 0.2 };
        let mut q = bf16s(&mut rng, t * NUM_Q_HEADS * HEAD_DIM, std);
        let k = bf16s(&mut rng, tk * NUM_KV_HEADS * HEAD_DIM, std);
        let mut qi = bf16s(&mut rng, t * NUM_INDEX_HEADS * INDEX_DIM, std);
        let ki = bf16s(&mut rng, tk * INDEX_DIM, std);
        let topk = topk(&layout, &mut rng);
        if peaked {
            plant_peaks(&layout, &topk, &mut q, 16, &k, NUM_KV_HEADS, seed);
            plant_peaks(&layout, &topk, &mut qi, 1, &ki, 1, seed);
        }
        let mut case = Self {
            layout,
            q,
            k,
            topk,
            qi,
            ki,
            teacher_lse: Vec::new(),
            indexer_lse: Vec::new(),
        };
        case.teacher_lse = forward(&case.inputs()).unwrap().lse;
        let indexer = IndexerInputs {
            layout: &case.layout,
            qi: &case.qi,
            ki: &case.ki,
        };
        let all: Vec<usize> = (0..t).collect();
        case.indexer_lse = selection_lse(&indexer, &case.topk, &all).unwrap();
        case
    }

    /// The KL never reads v; the teacher forward reads k in its place.
    fn inputs(&self) -> AttentionInputs<'_> {
        AttentionInputs {
            layout: &self.layout,
            q: &self.q,
            k: &self.k,
            v: &self.k,
            topk: &self.topk,
        }
    }

    fn backward(&self) -> KlGrads {
        kl_backward(
            &self.inputs(),
            &self.teacher_lse,
            &self.qi,
            &self.ki,
            &self.indexer_lse,
            COEFF,
        )
        .unwrap()
    }
}

/// Two CP fragments of one document; no group selects block 1, so keys 128..256 are in no set.
fn fragment_case(seed: u64) -> Case {
    fragment_case_drawn(seed, false)
}

fn fragment_case_drawn(seed: u64, peaked: bool) -> Case {
    let layout = VarlenLayout::new(&[0, 3, 8], &[0, 200, 300], Some(&[0, 0])).unwrap();
    let pattern = |l: &VarlenLayout, rng: &mut SplitMix64| {
        let mut topk = messy_topk(l, rng.next_u64());
        topk.iter_mut().filter(|e| **e == 1).for_each(|e| *e = -1);
        topk
    };
    Case::drawn(layout, pattern, seed, peaked)
}

#[test]
fn exact_gradients_match_finite_differences_of_the_loss() {
    finite_differences(fragment_case(31));
}

#[test]
fn exact_gradients_match_finite_differences_on_peaked_inputs() {
    finite_differences(fragment_case_drawn(37, true));
}

fn finite_differences(case: Case) {
    // dz is rounded to bf16 in the contract, a relative error up to 2^-9 per term; the FD check
    // runs the same code with the rounding switched off (`grads::<false>`) so that it can be
    // tight, and the rounded public path is compared with it separately.
    let inputs = case.inputs();
    let args = Args {
        inputs: &inputs,
        teacher_lse: &case.teacher_lse,
        qi: &case.qi,
        ki: &case.ki,
        indexer_lse: &case.indexer_lse,
        loss_coeff: COEFF,
    };
    let exact = grads::<false>(&args);
    let (qi, ki) = (to_f64(&case.qi), to_f64(&case.ki));
    let loss = |qi: &[f64], ki: &[f64]| kl_loss(&inputs, &case.teacher_lse, qi, ki, COEFF).unwrap();

    let t = case.layout.total_q();
    let mut live_queries = Vec::new();
    let mut live_keys = Vec::new();
    for &(q, p, _) in &queries(&case.layout) {
        for g in 0..NUM_INDEX_HEADS {
            let keys: Vec<usize> = (0..=p)
                .filter(|&j| in_set(&case.topk, t, g, q, p, j))
                .collect();
            if !keys.is_empty() {
                live_queries.push((q, g));
            }
            live_keys.extend(keys);
        }
    }
    let mut rng = SplitMix64::new(32);
    let h = 1e-4;
    let qi_entries: Vec<usize> = (0..8)
        .map(|_| {
            let (q, g) = live_queries[rng.below(live_queries.len())];
            (q * NUM_INDEX_HEADS + g) * INDEX_DIM + rng.below(INDEX_DIM)
        })
        .collect();
    let mut ki_entries: Vec<usize> = (0..8)
        .map(|_| live_keys[rng.below(live_keys.len())] * INDEX_DIM + rng.below(INDEX_DIM))
        .collect();
    ki_entries.push(150 * INDEX_DIM + 7); // a key in no set
    for (grad, entries, is_qi) in [
        (&exact.dqi, &qi_entries, true),
        (&exact.dki, &ki_entries, false),
    ] {
        let scale = grad.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
        for &at in entries {
            let eval = |d: f64| {
                let (mut qi, mut ki) = (qi.clone(), ki.clone());
                let x = if is_qi { &mut qi } else { &mut ki };
                x[at] += d;
                loss(&qi, &ki)
            };
            let fd = (eval(h) - eval(-h)) / (2.0 * h);
            let got = grad[at] as f64;
            assert!(
                (got - fd).abs() <= 1e-5 * scale + 1e-4 * fd.abs(),
                "qi {is_qi} entry {at}: {got} vs fd {fd}"
            );
        }
    }
    assert!(exact.dki[128 * INDEX_DIM..256 * INDEX_DIM]
        .iter()
        .all(|&x| x == 0.0));

    let public = case.backward();
    for (a, b) in [(&public.dqi, &exact.dqi), (&public.dki, &exact.dki)] {
        assert!(cosine(a, b) > 0.9999 && l2_rel(a, b) < 1e-2);
        assert_ne!(a, b, "dz is rounded");
    }
    assert!(public.dki[128 * INDEX_DIM..256 * INDEX_DIM]
        .iter()
        .all(|&x| x == 0.0));
    // Rows of empty sets are exact zeros.
    for q in 0..t {
        for g in 0..NUM_INDEX_HEADS {
            let row = &public.dqi[(q * NUM_INDEX_HEADS + g) * INDEX_DIM..][..INDEX_DIM];
            assert_eq!(
                row.iter().all(|&x| x == 0.0),
                !live_queries.contains(&(q, g)),
                "q {q} g {g}"
            );
        }
    }
}

#[test]
fn single_token_sets_have_exactly_zero_gradients() {
    // Teacher and student are both the one-point distribution: dz = 1 - 1 = 0 exactly.
    let layout = VarlenLayout::documents(&[0, 1, 2, 3]).unwrap();
    let only_block_0 = |l: &VarlenLayout, _: &mut SplitMix64| {
        let mut topk = vec![-1i32; NUM_KV_HEADS * l.total_q() * TOPK_BLOCKS];
        topk.iter_mut().step_by(TOPK_BLOCKS).for_each(|e| *e = 0);
        topk
    };
    let g = Case::new(layout, only_block_0, 33).backward();
    assert!(g.dqi.iter().chain(&g.dki).all(|&x| x == 0.0));
}

#[test]
fn subsets_equal_full_results_and_threads_do_not_matter() {
    let layout = VarlenLayout::new(
        &[0, 20, 45, 60, 70],
        &[0, 300, 700, 1000, 1050],
        Some(&[0, 0, 0, 3]),
    )
    .unwrap();
    let case = Case::new(layout, |l, rng| messy_topk(l, rng.next_u64()), 34);
    let inputs = case.inputs();
    let full = case.backward();
    let (tl, il) = (&case.teacher_lse, &case.indexer_lse);
    let qs = [69, 3, 20, 3, 44];
    let dqi = kl_dqi_queries(&inputs, tl, &case.qi, &case.ki, il, COEFF, &qs).unwrap();
    let row = NUM_INDEX_HEADS * INDEX_DIM;
    for (i, &q) in qs.iter().enumerate() {
        assert_eq!(
            dqi[i * row..(i + 1) * row],
            full.dqi[q * row..(q + 1) * row]
        );
    }
    for rows in [0..1050, 100..300, 999..1001, 7..7] {
        let dki = kl_dki_keys(&inputs, tl, &case.qi, &case.ki, il, COEFF, rows.clone()).unwrap();
        assert_eq!(dki, full.dki[rows.start * INDEX_DIM..rows.end * INDEX_DIM]);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    assert_eq!(pool.install(|| case.backward()), full);
}

#[test]
fn malformed_inputs_are_rejected() {
    let case = fragment_case(35);
    let inputs = case.inputs();
    let (tl, il) = (&case.teacher_lse, &case.indexer_lse);
    let err = kl_backward(&inputs, tl, &case.qi, &case.ki, &il[1..], COEFF).unwrap_err();
    assert!(matches!(
        err,
        RefError::Length {
            name: "indexer_lse",
            ..
        }
    ));
    let err = kl_loss(&inputs, &tl[1..], &case.qi, &case.ki, COEFF).unwrap_err();
    assert!(matches!(
        err,
        RefError::Length {
            name: "teacher_lse",
            ..
        }
    ));
    let err = kl_dki_keys(&inputs, tl, &case.qi, &case.ki, il, COEFF, 0..301).unwrap_err();
    assert!(matches!(
        err,
        RefError::OutOfRange {
            what: "key rows",
            ..
        }
    ));
}
