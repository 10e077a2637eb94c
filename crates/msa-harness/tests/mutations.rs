//! Simulated wrong kernels must fail the checks at MSA's tolerances on peaked inputs.
//!
//! A forward written the way a query-outer flash kernel is (blocks in ascending order, an online
//! softmax with a running maximum, f32) is correct as written and passes; each mutation is a bug
//! such a kernel can have: it forgets to rescale the accumulator when the running maximum
//! grows, applies the softmax scale twice, reads the next KV group (head h reads group
//! h/16 + 1), or reads block e + 1 for a selected block e. On MSA's input protocol (q, k ~
//! N(0, 0.2²): nearly uniform softmax) some of these pass the output check; on peaked inputs
//! (docs/contract.md §7.3) every one fails it.

use half::bf16;
use msa_harness::check::{against_reference, CheckReport, Sample, Tolerances};
use msa_harness::io::{CallInputs, Outputs};
use msa_plan::topology::{
    BLOCK_SIZE, HEADS_PER_GROUP, HEAD_DIM, NUM_KV_HEADS, NUM_Q_HEADS, SOFTMAX_SCALE, TOPK_BLOCKS,
};
use msa_plan::VarlenLayout;
use msa_workloads::{make_topk, InputMode, Inputs, Pattern};
use rayon::prelude::*;

/// The bugs the simulated kernel can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutation {
    None,
    /// The accumulator and the denominator are not multiplied by exp(m_old − m_new).
    NoRescale,
    /// Scores are scaled by 2/√128.
    DoubleScale,
    /// Head h reads K/V of group (h/16 + 1) mod 4.
    WrongGroup,
    /// A selected block e is read as block e + 1 (when the document has one).
    NextBlock,
}

/// The simulated forward: `(out [T, 64, 128] bf16, lse [T, 64])`.
fn forward(p: &CallInputs, bug: Mutation) -> (Vec<bf16>, Vec<f32>) {
    let l = &p.layout;
    let t = l.total_q();
    let f32s = |x: &[bf16]| -> Vec<f32> { x.iter().map(|v| v.to_f32()).collect() };
    let (q, k, v) = (f32s(&p.q), f32s(&p.k), f32s(&p.v));
    let rows: Vec<(Vec<f32>, f32)> = (0..t * NUM_Q_HEADS)
        .into_par_iter()
        .map(|i| {
            let (qt, h) = (i / NUM_Q_HEADS, i % NUM_Q_HEADS);
            let (b, _, pos) = l.query_coords(qt);
            let frag = l.fragment(b);
            let g = h / HEADS_PER_GROUP;
            let kv_group = match bug {
                Mutation::WrongGroup => (g + 1) % NUM_KV_HEADS,
                _ => g,
            };
            let scale = match bug {
                Mutation::DoubleScale => 2.0 * SOFTMAX_SCALE,
                _ => SOFTMAX_SCALE,
            };
            let mut blocks: Vec<usize> = p.topk_indices[(g * t + qt) * TOPK_BLOCKS..]
                [..TOPK_BLOCKS]
                .iter()
                .filter(|&&e| e >= 0 && (e as usize) <= pos / BLOCK_SIZE)
                .map(|&e| e as usize)
                .collect();
            blocks.sort_unstable();
            blocks.dedup();
            let qrow = &q[(qt * NUM_Q_HEADS + h) * HEAD_DIM..][..HEAD_DIM];
            let (mut m, mut den, mut acc) = (f32::NEG_INFINITY, 0f32, vec![0f32; HEAD_DIM]);
            for e in blocks {
                let e = match bug {
                    Mutation::NextBlock if e + 1 < frag.num_blocks => e + 1,
                    _ => e,
                };
                let keys: Vec<usize> = (e * BLOCK_SIZE..((e + 1) * BLOCK_SIZE).min(frag.k_len))
                    .filter(|&j| j <= pos)
                    .map(|j| frag.k_base + j)
                    .collect();
                let s: Vec<f32> = keys
                    .iter()
                    .map(|&r| {
                        let krow = &k[(r * NUM_KV_HEADS + kv_group) * HEAD_DIM..][..HEAD_DIM];
                        scale * qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f32>()
                    })
                    .collect();
                let m_new = s.iter().copied().fold(m, f32::max);
                if m_new == f32::NEG_INFINITY {
                    continue;
                }
                if bug != Mutation::NoRescale {
                    let alpha = (m - m_new).exp();
                    den *= alpha;
                    acc.iter_mut().for_each(|a| *a *= alpha);
                }
                for (&r, &sj) in keys.iter().zip(&s) {
                    let w = (sj - m_new).exp();
                    den += w;
                    let vrow = &v[(r * NUM_KV_HEADS + kv_group) * HEAD_DIM..][..HEAD_DIM];
                    acc.iter_mut().zip(vrow).for_each(|(a, x)| *a += w * x);
                }
                m = m_new;
            }
            if den == 0.0 {
                return (vec![0f32; HEAD_DIM], f32::NEG_INFINITY);
            }
            (acc.iter().map(|a| a / den).collect(), m + den.ln())
        })
        .collect();
    let out = rows
        .iter()
        .flat_map(|(o, _)| o.iter().map(|&x| bf16::from_f32(x)))
        .collect();
    (out, rows.iter().map(|(_, lse)| *lse).collect())
}

/// Three CP fragments: the last 12 queries of a 2,600-key and of a 3,000-key prefix of one
/// document (21 and 24 blocks: selections are really sparse), and 8 queries of a 100-token
/// document.
fn layout() -> VarlenLayout {
    VarlenLayout::new(&[0, 12, 24, 32], &[0, 2600, 3000, 3100], Some(&[0, 0, 2])).unwrap()
}

fn case(pattern: Pattern, mode: InputMode) -> CallInputs {
    let layout = layout();
    let seed = 0x3117;
    let topk = make_topk(&layout, pattern, seed);
    let mut inputs = Inputs::generate_in(&layout, seed, mode);
    if mode == InputMode::Peaked {
        inputs.plant_peaks(&layout, &topk, seed);
    }
    CallInputs::generated(layout, inputs, topk)
}

fn check(p: &CallInputs, bug: Mutation) -> CheckReport {
    let (out, lse) = forward(p, bug);
    let got = Outputs {
        out: Some(out),
        lse: Some(lse),
        ..Outputs::default()
    };
    let full = Sample::full(&p.layout);
    against_reference(p, &got, &full, &Tolerances::default(), None).unwrap()
}

fn passed(r: &CheckReport, tensor: &str) -> bool {
    r.lines
        .iter()
        .filter(|l| l.tensor == tensor)
        .all(|l| l.passed)
}

#[test]
fn every_simulated_bug_fails_the_output_check_on_peaked_inputs() {
    for pattern in [Pattern::Recent16, Pattern::Random] {
        let msa = case(pattern, InputMode::Msa);
        let peaked = case(pattern, InputMode::Peaked);
        // The simulated kernel itself is right.
        for p in [&msa, &peaked] {
            let r = check(p, Mutation::None);
            assert!(r.passed(), "{pattern}: correct kernel\n{}", r.table());
        }
        for bug in [
            Mutation::NoRescale,
            Mutation::DoubleScale,
            Mutation::WrongGroup,
            Mutation::NextBlock,
        ] {
            let r = check(&peaked, bug);
            assert!(
                !passed(&r, "out"),
                "{pattern}: {bug:?} passes the output check on peaked inputs\n{}",
                r.table()
            );
        }
        // Why peaked inputs are needed: on MSA's protocol a kernel that forgets the rescale, or
        // doubles the scale, writes an output within MSA's tolerance on every element (only the
        // LSE gives them away).
        for bug in [Mutation::NoRescale, Mutation::DoubleScale] {
            let r = check(&msa, bug);
            assert!(
                passed(&r, "out") && !passed(&r, "lse"),
                "{pattern}: {bug:?} on MSA inputs\n{}",
                r.table()
            );
        }
    }
}
