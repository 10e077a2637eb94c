use half::bf16;
use msa_plan::topology::{BLOCK_SIZE, INDEX_DIM, NUM_INDEX_HEADS, SOFTMAX_SCALE_F64, TOPK_BLOCKS};
use msa_plan::VarlenLayout;

use super::*;
use crate::error::RefError;
use crate::testing::{bf16s, in_set, queries, random_topk, to_f64, Rng};

struct Case {
    layout: VarlenLayout,
    qi: Vec<bf16>,
    ki: Vec<bf16>,
}

impl Case {
    fn random(layout: VarlenLayout, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
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

    /// f64 scores of (query, head) over document keys `0..=p`.
    fn scores(&self, q: usize, g: usize) -> Vec<f64> {
        let (b, _, p) = self.layout.query_coords(q);
        let k_base = self.layout.fragment(b).k_base;
        let (qi, ki) = (to_f64(&self.qi), to_f64(&self.ki));
        let qrow = &qi[(q * NUM_INDEX_HEADS + g) * INDEX_DIM..][..INDEX_DIM];
        (0..=p)
            .map(|j| {
                let krow = &ki[(k_base + j) * INDEX_DIM..][..INDEX_DIM];
                SOFTMAX_SCALE_F64 * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>()
            })
            .collect()
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

fn logsumexp(x: impl Iterator<Item = f64>) -> f64 {
    let x: Vec<f64> = x.collect();
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln()
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

            // Block maxima agree with an f64 brute force over the visible tokens.
            let scores = case.scores(q, g);
            let maxima = block_scores(&inputs, g, q).unwrap();
            assert_eq!(maxima.len(), local + 1);
            for (e, &m) in maxima.iter().enumerate() {
                let want = scores[e * BLOCK_SIZE..]
                    .iter()
                    .take(BLOCK_SIZE)
                    .copied()
                    .fold(f64::NEG_INFINITY, f64::max);
                assert!((m as f64 - want).abs() < 1e-6, "block {e}: {m} vs {want}");
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
            let want = logsumexp(
                (0..=p)
                    .filter(|&j| row.contains(&((j / BLOCK_SIZE) as i32)))
                    .map(|j| scores[j]),
            );
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
    // Contract §3.1: 2304 keys, all scores tie, the last query picks [0..14, 17].
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

    // An arbitrary selection (invalid entries, duplicates, empty sets) against f64.
    let topk = random_topk(&case.layout, &mut Rng::new(23));
    let lse = selection_lse(&inputs, &topk, &qs).unwrap();
    for (i, &q) in qs.iter().enumerate() {
        let (_, _, p) = case.layout.query_coords(q);
        for g in 0..NUM_INDEX_HEADS {
            let scores = case.scores(q, g);
            let set: Vec<f64> = (0..=p)
                .filter(|&j| in_set(&topk, t, g, q, p, j))
                .map(|j| scores[j])
                .collect();
            let got = lse[g * n + i];
            if set.is_empty() {
                assert_eq!(got, f32::NEG_INFINITY);
            } else {
                assert!((got as f64 - logsumexp(set.into_iter())).abs() < 2e-6);
            }
        }
    }
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
