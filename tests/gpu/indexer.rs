//! The indexer family on the device against the CPU reference.
//!
//! The forward (docs/contract.md §7.1, "indexer"): the selection is well formed
//! (`structure::indexer_selection`), every selected non-local block scores at least the
//! reference's 15th best minus MSA's slack, the LSE matches the reference LSE of the device's own
//! selection, and a second call is bitwise equal. On all-zero inputs every score ties, so the
//! selection must equal the reference's exactly (ties to the smaller id). Layouts: the suite's
//! edge layouts (fragments, documents that are not multiples of 128, single tokens, T below one
//! block) and real dev cases at full scale.
//!
//! The selection LSE (the KL backward's `indexer_lse`, docs/contract.md §3.2): equal to
//! `msa_ref::indexer::selection_lse` of the same selection on the edge layouts, `-inf` for empty
//! token sets, and a second call is bitwise equal.

use half::bf16;
use msa::cuda::CudaMsa;
use msa_harness::check::{compare, structure, CheckLine, CheckReport, Sample, Tolerances};
use msa_plan::topology::{INDEX_DIM, NUM_INDEX_HEADS, TOPK_BLOCKS};
use msa_plan::VarlenLayout;
use msa_ref::indexer::{self, block_scores, selection_lse, IndexerInputs};
use msa_workloads::{case_seed, parse_manifest, RankCase, Tensor};
use serde_json::json;

use crate::harness;
use crate::prepare::{device_layout, exact, fetch};

/// Selections of each edge layout the selection LSE is checked on: MSA's pattern, random rows with
/// holes and the sink-heavy verification pattern; plus MSA's pattern with rows emptied
/// ([`with_empty_rows`]), whose LSE is `-inf`.
const SELECTION_LSE_SELECTIONS: [&str; 3] = ["recent", "random_holes", "b0p99"];

/// `topk` with every (head, query) row whose `head + query` is a multiple of 5 emptied (-1).
fn with_empty_rows(layout: &VarlenLayout, mut topk: Vec<i32>) -> Vec<i32> {
    let t = layout.total_q();
    for g in 0..NUM_INDEX_HEADS {
        for q in (0..t).filter(|q| (g + q) % 5 == 0) {
            topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS].fill(-1);
        }
    }
    topk
}

/// The dev manifest, compiled in (as the harness) so the suite binary runs anywhere.
pub const DEV_MANIFEST_TEXT: &str = include_str!("../../data/cases/cp16_192k_dev.jsonl");

/// CP16 rank `rank` of dev case `case_id`.
pub fn dev_rank_case(case_id: u64, rank: usize) -> RankCase {
    let cases = parse_manifest(DEV_MANIFEST_TEXT).expect("the embedded dev manifest parses");
    msa_harness::cases::rank_case(&cases, case_id, rank)
        .unwrap_or_else(|e| panic!("dev case {case_id} rank {rank}: {e}"))
}

/// `(topk [4, T, 16], lse [4, T])` of one device call.
fn run(msa: &CudaMsa, layout: &VarlenLayout, qi: &[bf16], ki: &[bf16]) -> (Vec<i32>, Vec<f32>) {
    let dl = device_layout(msa, layout);
    let qi = msa.upload(qi).expect("upload qi");
    let ki = msa.upload(ki).expect("upload ki");
    let (topk, lse) = msa
        .indexer_forward(&dl, &qi, &ki)
        .unwrap_or_else(|e| panic!("indexer_forward: {e}"));
    let t = layout.total_q();
    let mut topk = fetch(msa, "indexer_topk", &topk);
    let mut lse = fetch(msa, "indexer_lse", &lse);
    // An empty tensor comes back as the facade's one-element buffer.
    topk.truncate(NUM_INDEX_HEADS * t * TOPK_BLOCKS);
    lse.truncate(NUM_INDEX_HEADS * t);
    (topk, lse)
}

fn bits(x: &[f32]) -> Vec<i32> {
    x.iter().map(|v| v.to_bits() as i32).collect()
}

/// Worst shortfall of a selected non-local block below the reference's 15th best non-local score
/// (the k-th best when fewer blocks are eligible), over `queries` and every head. The reference
/// scores one query per call, so the queries are spread over the host's cores.
fn rank_shortfall(ii: &IndexerInputs<'_>, topk: &[i32], queries: &[usize]) -> f64 {
    let t = ii.layout.total_q();
    let query_shortfall = |q: usize| {
        let mut worst = 0f64;
        for g in 0..NUM_INDEX_HEADS {
            let scores = block_scores(ii, g, q).expect("reference block scores");
            let local = scores.len() - 1;
            let mut nonlocal = scores[..local].to_vec();
            nonlocal.sort_by(|a, b| b.total_cmp(a));
            let Some(&kth) = nonlocal.get(nonlocal.len().min(TOPK_BLOCKS - 1).saturating_sub(1))
            else {
                continue;
            };
            for &e in &topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS] {
                if e >= 0 && (e as usize) < local {
                    worst = worst.max((kth - scores[e as usize]) as f64);
                }
            }
        }
        worst
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = queries.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = queries
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&q| query_shortfall(q))
                        .fold(0f64, f64::max)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("rank check worker"))
            .fold(0f64, f64::max)
    })
}

/// Every check of one layout; `queries` are the ones the reference ranks and LSEs are taken
/// for (all of them for small layouts, a sample at full scale).
fn check(
    msa: &CudaMsa,
    layout: &VarlenLayout,
    qi: &[bf16],
    ki: &[bf16],
    queries: &[usize],
) -> CheckReport {
    let tol = Tolerances::strict();
    let t = layout.total_q();
    let (topk, lse) = run(msa, layout, qi, ki);
    let (topk2, lse2) = run(msa, layout, qi, ki);
    let ii = IndexerInputs { layout, qi, ki };
    let mut r = CheckReport::default();
    r.push(structure::indexer_selection(layout, &topk));
    r.push(structure::finite("indexer_lse", &lse));
    let shortfall = rank_shortfall(&ii, &topk, queries);
    r.push(CheckLine {
        tensor: "indexer_topk".into(),
        metric: "rank_shortfall",
        value: shortfall,
        limit: tol.indexer_rank_slack,
        passed: shortfall <= tol.indexer_rank_slack,
        detail: format!(
            "15th-best reference score minus the worst selected one, {} queries",
            queries.len()
        ),
    });
    let want = selection_lse(&ii, &topk, queries).expect("reference selection LSE");
    let got: Vec<f32> = (0..NUM_INDEX_HEADS)
        .flat_map(|g| queries.iter().map(move |&q| g * t + q))
        .map(|i| lse[i])
        .collect();
    r.push(compare::close(
        "indexer_lse",
        &got,
        &want,
        tol.indexer_lse_atol,
        tol.indexer_lse_atol,
    ));
    r.push(exact(
        "indexer_topk/repeat",
        &topk2,
        &topk,
        &[NUM_INDEX_HEADS, t, TOPK_BLOCKS],
    ));
    r.push(exact(
        "indexer_lse/repeat_bits",
        &bits(&lse2),
        &bits(&lse),
        &[NUM_INDEX_HEADS, t],
    ));
    r
}

fn seeded(layout: &VarlenLayout, seed: u64) -> (Vec<bf16>, Vec<bf16>) {
    (
        Tensor::Qi.generate(layout, seed),
        Tensor::Ki.generate(layout, seed),
    )
}

#[test]
fn indexer_matches_the_reference_on_edge_layouts() {
    let msa = harness::device();
    for (i, (name, layout)) in harness::edge_layouts().into_iter().enumerate() {
        let (qi, ki) = seeded(&layout, 0x1DE7_0000 + i as u64);
        let all: Vec<usize> = (0..layout.total_q()).collect();
        let report = check(msa, &layout, &qi, &ki, &all);
        harness::record(
            "indexer_edge_layouts",
            &name,
            &report,
            json!({ "total_q": layout.total_q(), "max_blocks": layout.max_blocks() }),
        );
    }
}

#[test]
fn indexer_ties_pick_the_smallest_ids() {
    // docs/contract.md §3.1: with all-zero inputs every block scores 0 and the ties go to the
    // smaller id; 2304 keys (18 blocks, the last one's queries pick [0..14, 17]), plus fragments.
    let msa = harness::device();
    let layouts = [
        (
            "zeros_2304",
            VarlenLayout::new(&[0, 300], &[0, 2304], None).unwrap(),
        ),
        (
            "zeros_fragments",
            VarlenLayout::new(&[0, 40, 100, 101], &[0, 2100, 4000, 4001], Some(&[0, 0, 2]))
                .unwrap(),
        ),
    ];
    for (name, layout) in layouts {
        let qi = vec![bf16::ZERO; layout.total_q() * NUM_INDEX_HEADS * INDEX_DIM];
        let ki = vec![bf16::ZERO; layout.total_k() * INDEX_DIM];
        let (topk, lse) = run(msa, &layout, &qi, &ki);
        let want = indexer::forward(&IndexerInputs {
            layout: &layout,
            qi: &qi,
            ki: &ki,
        })
        .expect("reference indexer");
        let t = layout.total_q();
        let mut r = CheckReport::default();
        r.push(exact(
            "indexer_topk",
            &topk,
            &want.topk,
            &[NUM_INDEX_HEADS, t, TOPK_BLOCKS],
        ));
        r.push(compare::close("indexer_lse", &lse, &want.lse, 1e-5, 1e-5));
        harness::record("indexer_ties", name, &r, json!({ "total_q": t }));
    }
}

#[test]
fn indexer_matches_the_reference_on_dev_cases() {
    let msa = harness::device();
    // A rank of many short documents and a few long ones, and a rank of one 196K-token document
    // (12 fragments, ~1,500 key blocks). Structure and determinism are checked on every query;
    // ranks and LSEs (the reference scores a query at O(p) cost) on a sample that includes the
    // first and last query of fragments.
    for (case_id, rank, sample) in [(741u64, 0usize, 512usize), (151, 11, 16)] {
        let rc = dev_rank_case(case_id, rank);
        let layout = rc.layout();
        let (qi, ki) = seeded(layout, case_seed(case_id, rank, 0));
        let queries = Sample::new(layout, sample, 1, 0x1DE7).queries;
        let report = check(msa, layout, &qi, &ki, &queries);
        harness::record(
            "indexer_dev_cases",
            &format!("case{case_id}/r{rank}"),
            &report,
            json!({
                "total_q": layout.total_q(), "batch": layout.batch(),
                "max_blocks": layout.max_blocks(), "checked_queries": queries.len(),
            }),
        );
    }
}

#[test]
fn selection_lse_matches_the_reference_on_edge_layouts() {
    let msa = harness::device();
    let tol = Tolerances::strict();
    for (i, group) in harness::edge_selection_groups().enumerate() {
        let layout = &group.layout;
        let t = layout.total_q();
        let (qi, ki) = seeded(layout, 0x5E1_0000 + i as u64);
        let ii = IndexerInputs {
            layout,
            qi: &qi,
            ki: &ki,
        };
        let dl = device_layout(msa, layout);
        let (dqi, dki) = (
            msa.upload(&qi).expect("upload qi"),
            msa.upload(&ki).expect("upload ki"),
        );
        let mut selections: Vec<(String, Vec<i32>)> = group
            .selections
            .iter()
            .filter(|(name, _)| SELECTION_LSE_SELECTIONS.contains(&name.as_str()))
            .cloned()
            .collect();
        let emptied = with_empty_rows(layout, msa_plan::testing::recent_topk(layout));
        selections.push(("empty_rows".into(), emptied));
        let all: Vec<usize> = (0..t).collect();
        let mut report = CheckReport::default();
        for (name, topk) in &selections {
            let meta = msa
                .prepare(&dl, msa.upload(topk).expect("upload topk"))
                .unwrap_or_else(|e| panic!("{name}: prepare: {e}"));
            let runs: Vec<Vec<f32>> = (0..2)
                .map(|_| {
                    let lse = msa
                        .selection_lse(&meta, &dqi, &dki)
                        .unwrap_or_else(|e| panic!("{name}: selection_lse: {e}"));
                    let mut lse = fetch(msa, "selection_lse", &lse);
                    // An empty tensor comes back as the facade's one-element buffer.
                    lse.truncate(NUM_INDEX_HEADS * t);
                    lse
                })
                .collect();
            let want = selection_lse(&ii, topk, &all).expect("reference selection LSE");
            report.push(compare::close(
                &format!("{name}/selection_lse"),
                &runs[0],
                &want,
                tol.indexer_lse_atol,
                tol.indexer_lse_atol,
            ));
            report.push(exact(
                &format!("{name}/selection_lse/repeat_bits"),
                &bits(&runs[1]),
                &bits(&runs[0]),
                &[NUM_INDEX_HEADS, t],
            ));
        }
        harness::record(
            "selection_lse_edge_layouts",
            &group.name,
            &report,
            json!({ "total_q": t, "max_blocks": layout.max_blocks() }),
        );
    }
}
