use half::bf16;
use msa_plan::topology::{BLOCK_SIZE, INDEX_DIM, NUM_INDEX_HEADS, TOPK_BLOCKS};
use msa_plan::VarlenLayout;

use super::*;
use crate::error::RefError;
use crate::testing::{bf16s, in_set, queries};
use msa_oracle::Problem;
use msa_plan::testing::{messy_topk, SplitMix64};

struct Case {
    layout: VarlenLayout,
    qi: Vec<bf16>,
    ki: Vec<bf16>,
}

impl Case {
    fn random(layout: VarlenLayout, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let qi = bf16s(
            &mut rng,
            layout.total_q() * NUM_INDEX_HEADS * INDEX_DIM,
            0.2,
        );
        let ki = bf16s(&mut rng, layout.total_k() * INDEX_DIM, 0.2);
        Self { layout, qi, ki }
    }

    fn inputs(&self) -> IndexerInputs<'_> {
        IndexerInputs {
            layout: &self.layout,
            qi: &self.qi,
            ki: &self.ki,
        }
    }

    /// The f64 oracle of the index tensors (the attention tensors are unused: empty).
    fn oracle<'a>(&'a self, topk: &'a [i32]) -> Problem<'a> {
        Problem {
            layout: &self.layout,
            q: &[],
            k: &[],
            v: &[],
            topk,
            dout: None,
            index: Some((&self.qi, &self.ki)),
        }
    }
}

/// Two fragments of a document with more than 16 blocks, a short document and a
/// single-token document.
fn layout() -> VarlenLayout {
    VarlenLayout::new(
        &[0, 8, 24, 30, 31],
        &[0, 2300, 4200, 4300, 4301],
        Some(&[0, 0, 2, 3]),
    )
    .unwrap()
}

#[test]
fn selections_satisfy_the_contract_invariants_and_ranking() {
    let case = Case::random(layout(), 21);
    let inputs = case.inputs();
    let out = forward(&inputs).unwrap();
    let t = case.layout.total_q();
    for &(q, p, _) in &queries(&case.layout) {
        let local = p / BLOCK_SIZE;
        for g in 0..NUM_INDEX_HEADS {
            let row = &out.topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS];
            let count = (local + 1).min(TOPK_BLOCKS);
            assert!(
                row[count..].iter().all(|&e| e == -1),
                "q {q} g {g}: {row:?}"
            );
            assert_eq!(row[count - 1], local as i32);
            let chosen: Vec<usize> = row[..count - 1].iter().map(|&e| e as usize).collect();
            let mut unique = chosen.clone();
            unique.sort_unstable();
            unique.dedup();
            assert_eq!(unique.len(), chosen.len(), "duplicates in {row:?}");
            assert!(chosen.iter().all(|&e| e < local));

            // Block maxima agree with the f64 oracle over the visible tokens.
            let oracle = case.oracle(&out.topk);
            let want = oracle.index_block_scores(q, g);
            let maxima = block_scores(&inputs, g, q).unwrap();
            assert_eq!(maxima.len(), local + 1);
            assert_eq!(want.len(), local + 1);
            for (e, (&m, w)) in maxima.iter().zip(&want).enumerate() {
                assert!((m as f64 - w).abs() < 1e-6, "block {e}: {m} vs {w}");
            }
            // Ranking: (score desc, id asc) among non-local blocks, in slot order.
            let key = |e: usize| (std::cmp::Reverse(ordered(maxima[e])), e);
            for w in chosen.windows(2) {
                assert!(key(w[0]) < key(w[1]), "slot order {row:?}");
            }
            for e in (0..local).filter(|e| !chosen.contains(e)) {
                assert!(
                    chosen.iter().all(|&c| key(c) < key(e)),
                    "unselected block {e} outranks {row:?}"
                );
            }
            // LSE of the selected visible tokens.
            let want = oracle.index_selection_lse(&out.topk, q, g);
            let got = out.lse[g * t + q] as f64;
            assert!(
                (got - want).abs() < 2e-6,
                "lse q {q} g {g}: {got} vs {want}"
            );
        }
    }
}

/// A total order of f32 scores as an integer (no NaN here).
fn ordered(x: f32) -> i64 {
    let b = (x + 0.0).to_bits() as i32;
    (if b < 0 { !(b & i32::MAX) } else { b }) as i64
}

#[test]
fn all_zero_inputs_pick_the_lowest_ids() {
    // docs/contract.md §3.1: 2304 keys, all scores tie, the last query picks [0..14, 17].
    let layout = VarlenLayout::new(&[0, 2], &[0, 2304], None).unwrap();
    let zero = bf16::from_f32(0.0);
    let case = Case {
        qi: vec![zero; 2 * NUM_INDEX_HEADS * INDEX_DIM],
        ki: vec![zero; 2304 * INDEX_DIM],
        layout,
    };
    let out = forward(&case.inputs()).unwrap();
    let want: Vec<i32> = (0..15).chain([17]).collect();
    for g in 0..NUM_INDEX_HEADS {
        assert_eq!(
            out.topk[(g * 2 + 1) * TOPK_BLOCKS..][..TOPK_BLOCKS],
            want[..]
        );
        // 15 full blocks plus the whole local block: ln(2048) of equal scores.
        assert!((out.lse[g * 2 + 1] as f64 - 2048f64.ln()).abs() < 1e-6);
    }
}

#[test]
fn subsets_and_given_selections_match() {
    let case = Case::random(layout(), 22);
    let inputs = case.inputs();
    let full = forward(&inputs).unwrap();
    let t = case.layout.total_q();
    let qs = [30, 9, 0, 23, 9, 24];
    let sub = forward_queries(&inputs, &qs).unwrap();
    let n = qs.len();
    for (i, &q) in qs.iter().enumerate() {
        for g in 0..NUM_INDEX_HEADS {
            let (a, b) = ((g * n + i) * TOPK_BLOCKS, (g * t + q) * TOPK_BLOCKS);
            assert_eq!(sub.topk[a..a + TOPK_BLOCKS], full.topk[b..b + TOPK_BLOCKS]);
            assert_eq!(sub.lse[g * n + i], full.lse[g * t + q]);
        }
    }
    let all: Vec<usize> = (0..t).collect();
    assert_eq!(selection_lse(&inputs, &full.topk, &all).unwrap(), full.lse);

    // An arbitrary selection (invalid entries, duplicates, empty sets) against the f64 oracle.
    let topk = messy_topk(&case.layout, 23);
    let lse = selection_lse(&inputs, &topk, &qs).unwrap();
    let oracle = case.oracle(&topk);
    let mut empty = 0;
    for (i, &q) in qs.iter().enumerate() {
        let (_, _, p) = case.layout.query_coords(q);
        for g in 0..NUM_INDEX_HEADS {
            let want = oracle.index_selection_lse(&topk, q, g);
            let got = lse[g * n + i];
            let none = !(0..=p).any(|j| in_set(&topk, t, g, q, p, j));
            assert_eq!(want == f64::NEG_INFINITY, none);
            if none {
                empty += 1;
                assert_eq!(got, f32::NEG_INFINITY);
            } else {
                assert!(
                    (got as f64 - want).abs() < 2e-6,
                    "q {q} g {g}: {got} vs {want}"
                );
            }
        }
    }
    assert!(
        empty < qs.len() * NUM_INDEX_HEADS,
        "some sets are not empty"
    );
}

#[test]
fn malformed_inputs_are_rejected() {
    let case = Case::random(VarlenLayout::documents(&[0, 10]).unwrap(), 24);
    let mut inputs = case.inputs();
    assert!(matches!(
        block_scores(&inputs, 4, 0),
        Err(RefError::OutOfRange {
            what: "index head",
            ..
        })
    ));
    assert!(matches!(
        forward_queries(&inputs, &[10]),
        Err(RefError::OutOfRange { what: "query", .. })
    ));
    assert!(matches!(
        selection_lse(&inputs, &[0; 16], &[0]),
        Err(RefError::Length { name: "topk", .. })
    ));
    inputs.ki = &case.ki[..5];
    assert!(matches!(
        forward(&inputs),
        Err(RefError::Length { name: "ki", .. })
    ));
}
