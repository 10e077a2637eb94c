//! The checks of `msa_harness::check`: the f64 oracle against msa-ref (two independent implementations
//! of the contract), the CPU backend through both check paths, checks that must fail on
//! corrupted outputs, the comparison primitives and the sample's edge coverage.

use half::bf16;
use msa_harness::backend::{Backend, RunOptions, RunResult};
use msa_harness::check::oracle::Problem;
use msa_harness::check::{
    against_full, against_oracle, against_reference, compare, structure, CheckReport,
    FullReference, Sample, Tolerances,
};
use msa_harness::io::CallInputs;
use msa_harness::Stage;
use msa_plan::topology::{
    HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS,
};
use msa_plan::VarlenLayout;
use msa_ref::attention::{self, AttentionInputs};
use msa_ref::indexer::{self, IndexerInputs};
use msa_ref::kl;
use msa_workloads::{make_topk, Inputs, Pattern};

const Q_ROW: usize = NUM_Q_HEADS * HEAD_DIM;
const KV_ROW: usize = NUM_KV_HEADS * HEAD_DIM;

/// Four CP fragments of three documents whose lengths are not multiples of 128:
/// - fragment 0: document B (2,200 keys, 18 blocks), its last 50 queries (positions 2150..2200),
///   so the indexer ranks 16 or 17 non-local blocks and `recent16` leaves block 0 unselected;
/// - fragments 1 and 2: document A (300 keys), positions 0..100 and 200..300, sharing K;
/// - fragment 3: document C (77 keys), every query.
///
/// Packed queries: B 0..50, A 50..150 and 150..250, C 250..327; packed keys: B 0..2200,
/// A 2200..2500, C 2500..2577.
fn cp_layout() -> VarlenLayout {
    VarlenLayout::new(
        &[0, 50, 150, 250, 327],
        &[0, 2200, 2300, 2500, 2577],
        Some(&[0, 1, 1, 3]),
    )
    .unwrap()
}

fn case(pattern: Pattern, seed: u64) -> CallInputs {
    let layout = cp_layout();
    let inputs = Inputs::generate(&layout, seed);
    let topk = make_topk(&layout, pattern, seed);
    CallInputs::generated(layout, inputs, topk)
}

const LOSS_COEFF: f32 = 0.75;

fn full_opts() -> RunOptions {
    RunOptions {
        backward: true,
        indexer: true,
        kl: true,
        deterministic: false,
        loss_coeff: LOSS_COEFF,
    }
}

fn narrow(x: impl IntoIterator<Item = f64>) -> Vec<f32> {
    x.into_iter().map(|v| v as f32).collect()
}

/// Largest |a − e| / (atol + rtol·|e|) over the elements.
fn worst_ratio(actual: &[f32], expected: &[f32], atol: f64, rtol: f64) -> f64 {
    assert_eq!(actual.len(), expected.len());
    actual
        .iter()
        .zip(expected)
        .map(|(&a, &e)| (a as f64 - e as f64).abs() / (atol + rtol * (e as f64).abs()))
        .fold(0.0, f64::max)
}

fn problem(p: &CallInputs) -> Problem<'_> {
    Problem {
        layout: &p.layout,
        q: &p.q,
        k: &p.k,
        v: &p.v,
        topk: &p.topk_indices,
        dout: p.dout.as_deref(),
        index: p.index.as_ref().map(|i| (&i.qi[..], &i.ki[..])),
    }
}

/// The line of `tensor`/`metric`; panics (listing the report) when it is absent.
fn line<'r>(r: &'r CheckReport, tensor: &str, metric: &str) -> &'r msa_harness::check::CheckLine {
    r.lines
        .iter()
        .find(|l| l.tensor == tensor && l.metric == metric)
        .unwrap_or_else(|| panic!("no {tensor}/{metric} line in\n{}", r.table()))
}

/// (tensor, metric) of every failed line.
fn failures(r: &CheckReport) -> Vec<(String, &'static str)> {
    r.lines
        .iter()
        .filter(|l| !l.passed)
        .map(|l| (l.tensor.clone(), l.metric))
        .collect()
}

// ---- the oracle against msa-ref ---------------------------------------------------------------

/// First and last query of every fragment and a few inner ones.
const QUERIES: [usize; 10] = [0, 23, 49, 50, 149, 150, 200, 249, 250, 326];

#[test]
fn oracle_forward_and_indexer_agree_with_msa_ref() {
    let p = case(Pattern::Random, 3);
    let prob = problem(&p);
    let inputs = AttentionInputs {
        layout: &p.layout,
        q: &p.q,
        k: &p.k,
        v: &p.v,
        topk: &p.topk_indices,
    };
    let fwd = attention::forward_queries(&inputs, &QUERIES).unwrap();
    let (mut out, mut lse) = (Vec::new(), Vec::new());
    for &t in &QUERIES {
        for h in 0..NUM_Q_HEADS {
            let (o, l) = prob.attention_row(t, h);
            out.extend(narrow(o));
            lse.push(l as f32);
        }
    }
    // msa-ref accumulates in f32, the oracle in f64: they differ by f32 rounding only.
    assert!(worst_ratio(&fwd.out, &out, 1e-6, 1e-4) <= 1.0);
    assert!(worst_ratio(&fwd.lse, &lse, 1e-6, 0.0) <= 1.0);

    let index = p.index.as_ref().unwrap();
    let ii = IndexerInputs {
        layout: &p.layout,
        qi: &index.qi,
        ki: &index.ki,
    };
    let sel_lse = indexer::selection_lse(&ii, &p.topk_indices, &QUERIES).unwrap();
    for (i, &t) in QUERIES.iter().enumerate() {
        let (_, _, pos) = p.layout.query_coords(t);
        for g in 0..NUM_INDEX_HEADS {
            let want = narrow(prob.index_block_scores(t, g));
            let got = indexer::block_scores(&ii, g, t).unwrap();
            assert_eq!(
                want.len(),
                pos / 128 + 1,
                "query {t}: one score per visible block"
            );
            assert_eq!(got.len(), want.len(), "query {t}");
            assert!(
                worst_ratio(&got, &want, 1e-6, 0.0) <= 1.0,
                "query {t} head {g}: {got:?} vs {want:?}"
            );
            let l = prob.index_selection_lse(&p.topk_indices, t, g);
            assert!(
                (sel_lse[g * QUERIES.len() + i] as f64 - l).abs() <= 2e-6,
                "query {t} head {g}"
            );
        }
    }
}

/// Packed key rows: first/last of each document, both sides of block edges, partial blocks.
const KEYS: [usize; 9] = [0, 127, 128, 2199, 2200, 2327, 2499, 2500, 2576];

#[test]
fn oracle_backward_and_kl_agree_with_msa_ref() {
    let p = case(Pattern::Random, 4);
    let prob = problem(&p);
    let inputs = AttentionInputs {
        layout: &p.layout,
        q: &p.q,
        k: &p.k,
        v: &p.v,
        topk: &p.topk_indices,
    };
    let fwd = attention::forward(&inputs).unwrap();
    let out = fwd.out_bf16();
    let dout = p.dout.as_deref().unwrap();
    let row =
        |x: &[bf16], t: usize, h: usize| x[(t * NUM_Q_HEADS + h) * HEAD_DIM..][..HEAD_DIM].to_vec();
    let dot = |a: &[bf16], b: &[bf16]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| x.to_f64() * y.to_f64())
            .sum::<f64>()
    };

    // dq: the oracle takes delta from its f64 O, msa-ref (as the kernels) from the bf16 `out`;
    // that rounding is the whole difference (l2_rel ~2e-4).
    let dq = attention::backward_dq_queries(&inputs, dout, &out, &fwd.lse, &QUERIES).unwrap();
    let want: Vec<f32> = QUERIES
        .iter()
        .flat_map(|&t| (0..NUM_Q_HEADS).flat_map(move |h| narrow(prob.dq_row(t, h))))
        .collect();
    assert!(
        msa_ref::compare::l2_rel(&dq, &want) < 1e-3,
        "dq l2_rel {}",
        msa_ref::compare::l2_rel(&dq, &want)
    );

    // row_stats: the f64 LSE, and delta = Σ dout·O with the unrounded O.
    for &t in &QUERIES {
        for h in [0, 17, 63] {
            let (lse, delta) = prob.row_stats(t, h);
            assert!(
                (lse - fwd.lse[t * NUM_Q_HEADS + h] as f64).abs() < 1e-6,
                "lse of ({t}, {h})"
            );
            let o = &fwd.out[(t * NUM_Q_HEADS + h) * HEAD_DIM..][..HEAD_DIM];
            let want: f64 = o
                .iter()
                .zip(row(dout, t, h))
                .map(|(a, b)| *a as f64 * b.to_f64())
                .sum();
            assert!(
                (delta - want).abs() < 1e-6,
                "delta of ({t}, {h}): {delta} vs {want}"
            );
        }
    }

    // dK/dV fed the statistics msa-ref uses (its LSE, delta from the bf16 `out`): the two then
    // differ by f32 accumulation only.
    let attended = structure::attended_keys(&p.layout, &p.topk_indices);
    for g in 0..NUM_KV_HEADS {
        for &r in &KEYS {
            let (dk, dv) =
                attention::backward_dkv_keys(&inputs, dout, &out, &fwd.lse, g, r..r + 1).unwrap();
            let queries = prob.key_queries(g, r);
            assert_eq!(
                !queries.is_empty(),
                attended[r * NUM_KV_HEADS + g],
                "key {r} group {g}"
            );
            assert!(
                queries.windows(2).all(|w| w[0] < w[1]),
                "key {r} group {g}: ascending, unique"
            );
            let (wk, wv) = prob.dkv_row(g, r, &queries, |t, h| {
                (
                    fwd.lse[t * NUM_Q_HEADS + h] as f64,
                    dot(&row(&out, t, h), &row(dout, t, h)),
                )
            });
            let (ek, ev) = (
                msa_ref::compare::l2_rel(&dk, &narrow(wk)),
                msa_ref::compare::l2_rel(&dv, &narrow(wv)),
            );
            assert!(
                ek < 1e-5 && ev < 1e-5,
                "key {r} group {g}: l2_rel dk {ek:.2e} dv {ev:.2e}"
            );
            if queries.is_empty() {
                assert!(
                    dk.iter().chain(&dv).all(|&x| x == 0.0),
                    "key {r} group {g} has no query"
                );
            }
        }
    }

    // KL dQI: both round dz to bf16; a flip at a rounding boundary is the difference.
    let index = p.index.as_ref().unwrap();
    let ii = IndexerInputs {
        layout: &p.layout,
        qi: &index.qi,
        ki: &index.ki,
    };
    let all: Vec<usize> = (0..p.layout.total_q()).collect();
    let ilse = indexer::selection_lse(&ii, &p.topk_indices, &all).unwrap();
    let dqi = kl::kl_dqi_queries(
        &inputs, &fwd.lse, &index.qi, &index.ki, &ilse, LOSS_COEFF, &QUERIES,
    )
    .unwrap();
    let want: Vec<f32> = QUERIES
        .iter()
        .flat_map(|&t| {
            (0..NUM_INDEX_HEADS).flat_map(move |g| narrow(prob.kl_dqi_row(t, g, LOSS_COEFF as f64)))
        })
        .collect();
    assert!(want.iter().any(|&x| x != 0.0));
    assert!(
        msa_ref::compare::l2_rel(&dqi, &want) < 1e-3,
        "dqi l2_rel {}",
        msa_ref::compare::l2_rel(&dqi, &want)
    );
}

// ---- the CPU backend through both check paths -------------------------------------------------

/// One `recent16` run of the CP layout with backward, indexer and KL, shared by the tests below.
fn base() -> &'static (CallInputs, RunResult) {
    static BASE: std::sync::OnceLock<(CallInputs, RunResult)> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let p = case(Pattern::Recent16, 5);
        let r = Backend::Cpu.run(&p, &full_opts()).unwrap();
        (p, r)
    })
}

fn reference_report(got: &msa_harness::io::Outputs, sample: &Sample) -> CheckReport {
    let (p, r) = base();
    let kl = r.kl_indexer_lse.as_deref().map(|l| (l, LOSS_COEFF));
    against_reference(p, got, sample, &Tolerances::default(), kl).unwrap()
}

/// A hand-picked sample: the first and last query of every fragment plus query 10, and per
/// group document B's block 0 (unselected under `recent16`), its partial last block, and a
/// block of document A. The f64 oracle stays cheap on it.
fn probe_sample() -> Sample {
    Sample::of(
        vec![0, 10, 49, 50, 149, 150, 249, 250, 326],
        (0..NUM_KV_HEADS)
            .flat_map(|g| [(g, 0..128), (g, 2176..2200), (g, 2328..2456)])
            .collect(),
    )
}

fn full_report(got: &msa_harness::io::Outputs) -> CheckReport {
    reference_report(got, &Sample::full(&base().0.layout))
}

/// `n {count}` of a line's detail.
fn detail_count(l: &msa_harness::check::CheckLine) -> usize {
    let at = l
        .detail
        .find(", n ")
        .unwrap_or_else(|| panic!("no count in `{}`", l.detail))
        + 4;
    l.detail[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn cpu_backend_passes_the_reference_checks() {
    let (p, r) = base();
    let stages: Vec<Stage> = r.times.iter().map(|s| s.stage).collect();
    assert_eq!(
        stages,
        [
            Stage::Upload,
            Stage::Prepare,
            Stage::Forward,
            Stage::Tables,
            Stage::Backward,
            Stage::Indexer,
            Stage::SelectionLse,
            Stage::Kl
        ]
    );
    let o = &r.outputs;
    let (t, tk) = (p.layout.total_q(), p.layout.total_k());
    assert_eq!(o.out.as_ref().unwrap().len(), t * Q_ROW);
    assert_eq!(o.lse.as_ref().unwrap().len(), t * NUM_Q_HEADS);
    assert_eq!(o.dk.as_ref().unwrap().len(), tk * KV_ROW);
    assert_eq!(
        o.indexer_topk.as_ref().unwrap().len(),
        NUM_INDEX_HEADS * t * TOPK_BLOCKS
    );
    assert_eq!(
        o.dqi.as_ref().unwrap().len(),
        t * NUM_INDEX_HEADS * INDEX_DIM
    );
    assert_eq!(o.dki.as_ref().unwrap().len(), tk * INDEX_DIM);
    assert_eq!(
        r.kl_indexer_lse.as_ref().unwrap().len(),
        NUM_INDEX_HEADS * t
    );

    let every_line = [
        ("out", "non_finite"),
        ("out", "close_ratio"),
        ("lse", "close_ratio"),
        ("lse", "bad_rows"),
        ("dq", "non_finite"),
        ("dk", "non_finite"),
        ("dv", "non_finite"),
        ("dk", "nonzero_unselected"),
        ("dv", "nonzero_unselected"),
        ("dv", "sum_rel"),
        ("dq", "cosine"),
        ("dq", "l2_rel"),
        ("dk", "cosine"),
        ("dk", "l2_rel"),
        ("dv", "cosine"),
        ("dv", "l2_rel"),
        ("indexer_topk", "malformed_rows"),
        ("indexer_topk", "rank_shortfall"),
        ("indexer_lse", "close_ratio"),
        ("kl_indexer_lse", "close_ratio"),
        ("dqi", "non_finite"),
        ("dki", "non_finite"),
        ("dqi", "cosine"),
        ("dqi", "l2_rel"),
        ("dki", "cosine"),
        ("dki", "l2_rel"),
    ];
    let full = full_report(o);
    let sampled = reference_report(o, &Sample::new(&p.layout, 24, 3, 11));
    for report in [&full, &sampled] {
        assert!(report.passed(), "{}", report.table());
        let lines: Vec<(&str, &str)> = report
            .lines
            .iter()
            .map(|l| (l.tensor.as_str(), l.metric))
            .collect();
        assert_eq!(lines, every_line);
    }
    // The full check recomputes exactly what the CPU backend computed (`out` is stored in bf16).
    assert!(line(&full, "out", "close_ratio").value < 0.1);
    assert_eq!(line(&full, "lse", "close_ratio").value, 0.0);
    assert_eq!(line(&full, "indexer_lse", "close_ratio").value, 0.0);
    assert_eq!(line(&full, "kl_indexer_lse", "close_ratio").value, 0.0);
    // recent16 leaves block 0 of document B unselected: the zero check has keys to look at, and
    // the sampled check looks at fewer keys than the full one.
    assert!(structure::attended_keys(&p.layout, &p.topk_indices)
        .iter()
        .any(|&a| !a));
    assert!(
        detail_count(line(&sampled, "dk", "cosine")) < detail_count(line(&full, "dk", "cosine"))
    );
    assert_eq!(detail_count(line(&full, "dk", "cosine")), tk * KV_ROW);
}

#[test]
fn cpu_backend_passes_the_oracle_spot_checks() {
    let (p, r) = base();
    let kl = r.kl_indexer_lse.as_deref().map(|l| (l, LOSS_COEFF));
    let report = against_oracle(p, &r.outputs, &probe_sample(), &Tolerances::default(), kl);
    assert!(report.passed(), "{}", report.table());
    let lines: Vec<(&str, &str)> = report
        .lines
        .iter()
        .map(|l| (l.tensor.as_str(), l.metric))
        .collect();
    assert_eq!(
        lines,
        [
            ("out", "close_ratio"),
            ("lse", "close_ratio"),
            ("dq", "cosine"),
            ("dq", "l2_rel"),
            ("dk", "cosine"),
            ("dk", "l2_rel"),
            ("dv", "cosine"),
            ("dv", "l2_rel"),
            ("indexer_topk", "malformed_rows"),
            ("indexer_topk", "rank_shortfall"),
            ("indexer_lse", "close_ratio"),
            ("kl_indexer_lse", "close_ratio"),
            ("dqi", "cosine"),
            ("dqi", "l2_rel"),
            ("dki", "cosine"),
            ("dki", "l2_rel"),
        ]
    );
    // Key rows were actually compared (keys with too many queries are skipped).
    assert!(
        detail_count(line(&report, "dk", "cosine")) > 0,
        "{}",
        report.table()
    );
}

// ---- the checks fail on corrupted outputs -----------------------------------------------------

/// The probe-sample reference report of the base outputs after `corrupt`.
fn corrupted(corrupt: impl FnOnce(&mut msa_harness::io::Outputs)) -> CheckReport {
    let mut got = base().1.outputs.clone();
    corrupt(&mut got);
    reference_report(&got, &probe_sample())
}

fn add(x: &mut bf16, d: f32) {
    *x = bf16::from_f32(x.to_f32() + d);
}

#[test]
fn a_perturbed_output_element_fails_out() {
    // Query 10 is the probe sample's second query: element 1·Q_ROW + 5·128 + 7 of the gathered rows.
    let r = corrupted(|o| {
        add(
            &mut o.out.as_mut().unwrap()[10 * Q_ROW + 5 * HEAD_DIM + 7],
            0.5,
        )
    });
    assert_eq!(
        failures(&r),
        [("out".to_string(), "close_ratio")],
        "{}",
        r.table()
    );
    let l = line(&r, "out", "close_ratio");
    // |0.5| against atol + rtol·|e| = 0.03 + 0.03·|e| with |e| small.
    assert!(l.value > 15.0 && l.value < 17.0, "{}", l.value);
    let worst = Q_ROW + 5 * HEAD_DIM + 7;
    assert!(
        l.detail
            .ends_with(&format!("1 of {} over, worst at {worst}", 9 * Q_ROW)),
        "{}",
        l.detail
    );
}

#[test]
fn a_nan_gradient_fails_dq() {
    let r = corrupted(|o| o.dq.as_mut().unwrap()[49 * Q_ROW + 3] = bf16::NAN);
    assert_eq!(
        failures(&r),
        [
            ("dq".to_string(), "non_finite"),
            ("dq".to_string(), "cosine"),
            ("dq".to_string(), "l2_rel")
        ],
        "{}",
        r.table()
    );
    assert_eq!(line(&r, "dq", "non_finite").value, 1.0);
    assert!(line(&r, "dq", "cosine").detail.contains("1 non-finite"));
    // A NaN outside the sampled queries is still caught by the full-tensor finiteness check.
    let r = corrupted(|o| o.dq.as_mut().unwrap()[100 * Q_ROW] = bf16::NAN);
    assert_eq!(
        failures(&r),
        [("dq".to_string(), "non_finite")],
        "{}",
        r.table()
    );
}

#[test]
fn a_gradient_on_an_unselected_key_fails_dk() {
    let (p, _) = base();
    let attended = structure::attended_keys(&p.layout, &p.topk_indices);
    // recent16 leaves document B's block 0 (packed keys 0..128) to no query.
    let (row, g) = (5, 2);
    assert!(!attended[row * NUM_KV_HEADS + g]);
    let r = corrupted(|o| {
        o.dk.as_mut().unwrap()[(row * NUM_KV_HEADS + g) * HEAD_DIM + 9] = bf16::from_f32(0.01)
    });
    // The probe samples block 0 of document B, so the value also moves dk's relative L2 error
    // (the unselected rows' expected gradient is exactly zero).
    assert_eq!(
        failures(&r),
        [
            ("dk".to_string(), "nonzero_unselected"),
            ("dk".to_string(), "l2_rel")
        ],
        "{}",
        r.table()
    );
    assert_eq!(line(&r, "dk", "nonzero_unselected").value, 1.0);
}

#[test]
fn a_malformed_indexer_row_fails_the_selection_check() {
    let t = base().0.layout.total_q();
    // A duplicate in (head 1, query 10): the row is malformed, and the set it describes lost a
    // block, so the backend's LSE no longer matches it either.
    let r = corrupted(|o| {
        let row = &mut o.indexer_topk.as_mut().unwrap()[(t + 10) * TOPK_BLOCKS..][..TOPK_BLOCKS];
        row[0] = row[1];
    });
    assert_eq!(
        failures(&r),
        [
            ("indexer_topk".to_string(), "malformed_rows"),
            ("indexer_lse".to_string(), "close_ratio")
        ],
        "{}",
        r.table()
    );
    let l = line(&r, "indexer_topk", "malformed_rows");
    assert_eq!(l.value, 1.0);
    assert!(
        l.detail.starts_with("first bad (head 1, query 10, p 2160)"),
        "{}",
        l.detail
    );
    // Head 1 of the probe's second query: LSE index 1·9 + 1.
    assert!(line(&r, "indexer_lse", "close_ratio")
        .detail
        .ends_with("1 of 36 over, worst at 10"));

    // (head 0, query 150) at position 200 selects blocks {0, 1}; the local block 1 moved first
    // is the same set, so only the row rule fails.
    let r = corrupted(|o| {
        let row = &mut o.indexer_topk.as_mut().unwrap()[150 * TOPK_BLOCKS..][..TOPK_BLOCKS];
        assert_eq!(row[..3], [0, 1, -1]);
        row.swap(0, 1);
    });
    assert_eq!(
        failures(&r),
        [("indexer_topk".to_string(), "malformed_rows")],
        "{}",
        r.table()
    );
    assert!(line(&r, "indexer_topk", "malformed_rows")
        .detail
        .starts_with("first bad (head 0, query 150, p 200)"));
}

#[test]
fn a_poorly_ranked_indexer_block_fails_the_ranking_check() {
    let (p, _) = base();
    let t = p.layout.total_q();
    let index = p.index.as_ref().unwrap();
    let ii = IndexerInputs {
        layout: &p.layout,
        qi: &index.qi,
        ki: &index.ki,
    };
    let itopk = base().1.outputs.indexer_topk.as_ref().unwrap();
    // Among the probe's document-B queries, the unselected non-local block that scores furthest
    // below the 15th best: (gap, query, head, block).
    let mut worst = (f32::NEG_INFINITY, 0, 0, 0);
    for q in [0, 10, 49] {
        for g in 0..NUM_INDEX_HEADS {
            let scores = indexer::block_scores(&ii, g, q).unwrap();
            let local = scores.len() - 1;
            let row = &itopk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS];
            let mut nonlocal = scores[..local].to_vec();
            nonlocal.sort_by(|a, b| b.total_cmp(a));
            let kth = nonlocal[14];
            for u in (0..local).filter(|&u| !row.contains(&(u as i32))) {
                if kth - scores[u] > worst.0 {
                    worst = (kth - scores[u], q, g, u);
                }
            }
        }
    }
    let (gap, q, g, u) = worst;
    assert!(
        gap as f64 > Tolerances::default().indexer_rank_slack,
        "gap {gap}"
    );
    // Slot 0 of a document-B row holds a non-local block (16 valid entries, the local one last).
    let r = corrupted(|o| o.indexer_topk.as_mut().unwrap()[(g * t + q) * TOPK_BLOCKS] = u as i32);
    let l = line(&r, "indexer_topk", "rank_shortfall");
    assert!(!l.passed, "{}", r.table());
    assert_eq!(l.value, gap as f64);
    assert!(
        line(&r, "indexer_topk", "malformed_rows").passed,
        "the row is still well formed"
    );
}

#[test]
fn shuffled_kl_gradients_fail_dqi() {
    // Query rows in reverse order: the right values at the wrong queries.
    let r = corrupted(|o| {
        let dqi = o.dqi.as_mut().unwrap();
        let reversed: Vec<bf16> = dqi
            .chunks(NUM_INDEX_HEADS * INDEX_DIM)
            .rev()
            .flatten()
            .copied()
            .collect();
        *dqi = reversed;
    });
    assert_eq!(
        failures(&r),
        [("dqi".to_string(), "cosine"), ("dqi".to_string(), "l2_rel")],
        "{}",
        r.table()
    );
    assert!(line(&r, "dqi", "cosine").value < 0.5);
}

/// Every element of `tensor` multiplied by `factor`.
fn scale(x: &mut Option<Vec<bf16>>, factor: f32) {
    for v in x.as_mut().unwrap() {
        *v = bf16::from_f32(v.to_f32() * factor);
    }
}

#[test]
fn a_gradient_of_the_wrong_scale_fails_l2_rel_though_its_cosine_passes() {
    // What a kernel that drops or doubles a scale in dQ/dK/dV (or the KL) gives: the right
    // direction, the wrong length. The cosine stays 1; the relative L2 error sees it, under
    // MSA's set and the strict one, in the reference check and in the comparison of outputs.
    type Pick = fn(&mut msa_harness::io::Outputs) -> &mut Option<Vec<bf16>>;
    let cases: [(&str, Pick, f32); 5] = [
        ("dq", |o| &mut o.dq, 1000.0),
        ("dk", |o| &mut o.dk, 2.0),
        ("dv", |o| &mut o.dv, 0.01),
        ("dqi", |o| &mut o.dqi, 0.5),
        ("dki", |o| &mut o.dki, 1000.0),
    ];
    let (_, base_run) = base();
    for (tensor, pick, factor) in cases {
        let mut got = base_run.outputs.clone();
        scale(pick(&mut got), factor);
        for tol in [Tolerances::default(), Tolerances::strict()] {
            let (p, r) = base();
            let kl = r.kl_indexer_lse.as_deref().map(|l| (l, LOSS_COEFF));
            let reports = [
                against_reference(p, &got, &probe_sample(), &tol, kl).unwrap(),
                msa_harness::check::against_outputs(&got, &base_run.outputs, &tol).unwrap(),
            ];
            for (i, report) in reports.into_iter().enumerate() {
                let l2 = line(&report, tensor, "l2_rel");
                // The reference check's Σ dV invariant sees a scaled dv as well.
                let mut want = vec![(tensor.to_string(), "l2_rel")];
                if tensor == "dv" && i == 0 {
                    want.insert(0, ("dv".to_string(), "sum_rel"));
                }
                assert_eq!(
                    failures(&report),
                    want,
                    "{tensor} x {factor}\n{}",
                    report.table()
                );
                assert!(
                    (l2.value - (factor as f64 - 1.0).abs()).abs()
                        < 0.05 * (factor as f64 - 1.0).abs() + 1e-2,
                    "{tensor} x {factor}: l2_rel {}",
                    l2.value
                );
                assert!(line(&report, tensor, "cosine").passed, "{}", report.table());
            }
        }
    }
}

#[test]
fn a_wrong_kl_index_lse_fails_both_checks() {
    let (p, r) = base();
    let t = p.layout.total_q();
    let mut lse = r.kl_indexer_lse.clone().unwrap();
    // Head 2 of query 49, the probe sample's third query: element 2·9 + 2 of the gathered LSEs.
    lse[2 * t + 49] += 0.1;
    let kl = Some((&lse[..], LOSS_COEFF));
    let tol = Tolerances::default();
    let reference = against_reference(p, &r.outputs, &probe_sample(), &tol, kl).unwrap();
    let oracle = against_oracle(p, &r.outputs, &probe_sample(), &tol, kl);
    // The reference's dQI of that query then follows the wrong LSE: its cosine stays above
    // MSA's limit, its relative L2 error does not. The oracle recomputes the LSE for dQI (and
    // the key rows its dKI check sums over do not hold query 49).
    for (report, grads) in [(&reference, vec![("dqi", "l2_rel")]), (&oracle, vec![])] {
        let want: Vec<(String, &str)> = [("kl_indexer_lse", "close_ratio")]
            .into_iter()
            .chain(grads)
            .map(|(t, m)| (t.to_string(), m))
            .collect();
        assert_eq!(failures(report), want, "{}", report.table());
        let l = line(report, "kl_indexer_lse", "close_ratio");
        assert!(
            l.detail.ends_with("1 of 36 over, worst at 20"),
            "{}",
            l.detail
        );
    }
}

#[test]
fn the_full_tensor_invariants_catch_a_lost_contribution_and_a_wrong_empty_row() {
    let (p, r) = base();
    let l = &p.layout;
    let dout = p.dout.as_deref().unwrap();
    let good = &r.outputs;
    assert!(structure::dv_sums(l, &p.topk_indices, dout, good.dv.as_ref().unwrap()).passed);
    assert!(structure::lse_rows(l, &p.topk_indices, good.lse.as_ref().unwrap()).passed);
    // One block of dV lost (a block a kernel forgot to write back), outside the probe sample:
    // only the sum sees it (and the full check).
    let g = 1;
    let mut dv = good.dv.clone().unwrap();
    for row in 1024..1152 {
        dv[(row * NUM_KV_HEADS + g) * HEAD_DIM..][..HEAD_DIM].fill(bf16::ZERO);
    }
    let line = structure::dv_sums(l, &p.topk_indices, dout, &dv);
    assert!(!line.passed, "{line:?}");
    assert!(line.detail.contains("worst at group 1 "), "{line:?}");
    // An empty selection that still gets a finite LSE, and a set that gets -inf.
    let t = l.total_q();
    let mut topk = p.topk_indices.clone();
    topk[(2 * t + 7) * TOPK_BLOCKS..][..TOPK_BLOCKS].fill(-1); // group 2, query 7: empty now
    let line = structure::lse_rows(l, &topk, good.lse.as_ref().unwrap());
    assert_eq!((line.passed, line.value), (false, 16.0), "{line:?}");
    let mut lse = good.lse.clone().unwrap();
    lse[9 * NUM_Q_HEADS + 40] = f32::NEG_INFINITY;
    let line = structure::lse_rows(l, &p.topk_indices, &lse);
    assert_eq!((line.passed, line.value), (false, 1.0), "{line:?}");
    assert!(
        line.detail.starts_with("first at (query 9, head 40)"),
        "{line:?}"
    );
}

/// The CPU reference's complete f32 tensors of the base case, as a `FullReference`.
fn full_reference() -> FullReference {
    let (p, r) = base();
    let inputs = AttentionInputs {
        layout: &p.layout,
        q: &p.q,
        k: &p.k,
        v: &p.v,
        topk: &p.topk_indices,
    };
    let o = &r.outputs;
    let fwd = attention::forward(&inputs).unwrap();
    let g = attention::backward(
        &inputs,
        p.dout.as_deref().unwrap(),
        o.out.as_ref().unwrap(),
        o.lse.as_ref().unwrap(),
    )
    .unwrap();
    let index = p.index.as_ref().unwrap();
    let klg = kl::kl_backward(
        &inputs,
        o.lse.as_ref().unwrap(),
        &index.qi,
        &index.ki,
        r.kl_indexer_lse.as_ref().unwrap(),
        LOSS_COEFF,
    )
    .unwrap();
    FullReference {
        out: Some(fwd.out),
        lse: Some(fwd.lse),
        dq: Some(g.dq),
        dk: Some(g.dk),
        dv: Some(g.dv),
        dqi: Some(klg.dqi),
        dki: Some(klg.dki),
    }
}

#[test]
fn the_full_check_compares_every_element() {
    let (p, r) = base();
    let want = full_reference();
    let tol = Tolerances::strict();
    let report = against_full(p, &r.outputs, &want, &tol).unwrap();
    assert!(report.passed(), "{}", report.table());
    assert_eq!(
        detail_count(line(&report, "dk", "cosine")),
        p.layout.total_k() * KV_ROW
    );
    // One element far from every sampled query and key fails the full check only.
    let mut got = r.outputs.clone();
    add(&mut got.out.as_mut().unwrap()[120 * Q_ROW + 3], 0.25);
    add(&mut got.dq.as_mut().unwrap()[121 * Q_ROW + 5], 5.0);
    assert!(!probe_sample().queries.contains(&120) && !probe_sample().queries.contains(&121));
    assert!(reference_report(&got, &probe_sample()).passed());
    let report = against_full(p, &got, &want, &tol).unwrap();
    assert_eq!(
        failures(&report),
        [
            ("out".to_string(), "close_ratio"),
            ("dq".to_string(), "cosine"),
            ("dq".to_string(), "l2_rel")
        ],
        "{}",
        report.table()
    );
    // A reference tensor the outputs lack is an error, not a pass.
    let mut partial = r.outputs.clone();
    partial.dki = None;
    assert!(against_full(p, &partial, &want, &tol).is_err());
}

// ---- comparison primitives --------------------------------------------------------------------

#[test]
fn close_has_assert_close_semantics() {
    let inf = f32::INFINITY;
    let ok = compare::close(
        "x",
        &[1.0, inf, -inf, 0.0],
        &[1.0, inf, -inf, 0.0],
        0.0,
        0.0,
    );
    assert!(
        ok.passed && ok.value == 0.0,
        "equal values and equal infinities agree: {ok:?}"
    );
    assert_eq!(
        (ok.tensor.as_str(), ok.metric, ok.limit),
        ("x", "close_ratio", 1.0)
    );

    // |2.75 − 2| = 0.75 = atol + rtol·2 exactly: ratio 1 passes, anything above fails.
    let edge = compare::close("x", &[2.75], &[2.0], 0.25, 0.25);
    assert!(edge.passed && edge.value == 1.0, "{edge:?}");
    let over = compare::close("x", &[0.0, 2.0, 2.875], &[0.0, 2.0, 2.0], 0.25, 0.25);
    assert!(
        !over.passed && (over.value - 0.875 / 0.75).abs() < 1e-12,
        "{over:?}"
    );
    assert!(
        over.detail.ends_with("1 of 3 over, worst at 2"),
        "{}",
        over.detail
    );

    for (a, e) in [
        (f32::NAN, f32::NAN),
        (f32::NAN, 1.0),
        (1.0, f32::NAN),
        (inf, -inf),
        (inf, 1.0),
        (1.0, -inf),
    ] {
        let l = compare::close("x", &[0.0, a], &[0.0, e], 1.0, 1.0);
        assert!(!l.passed && l.value == f64::INFINITY, "{a} vs {e}: {l:?}");
        assert!(
            l.detail.ends_with("1 of 2 over, worst at 1"),
            "{}",
            l.detail
        );
    }
}

#[test]
fn cosine_is_strict_and_attention_grad_cosine_allows_numerical_zeros() {
    let noise = |k: usize| -> Vec<f32> {
        (0..64)
            .map(|i| ((i * k) % 7) as f32 * 1e-10 - 3e-10)
            .collect()
    };
    let (a, e) = (noise(3), noise(5));
    assert!(msa_ref::compare::cosine(&a, &e) < 0.99);
    // Rounding noise on both sides (single-key queries): meaningless for the strict cosine,
    // accepted for attention gradients.
    let strict = compare::cosine("dqi", &a, &e, 0.99);
    assert!(!strict.passed, "{strict:?}");
    let grad = compare::attention_grad_cosine("dq", &a, &e, 0.99);
    assert!(
        grad.passed && grad.detail.ends_with("both numerically zero"),
        "{grad:?}"
    );
    // The same shapes at a real gradient's scale fail both.
    let (a3, e3): (Vec<f32>, Vec<f32>) = (
        a.iter().map(|x| x * 1e6).collect(),
        e.iter().map(|x| x * 1e6).collect(),
    );
    assert!(!compare::attention_grad_cosine("dq", &a3, &e3, 0.99).passed);
    // A numerically zero result against a real expected gradient is not excused either.
    assert!(!compare::attention_grad_cosine("dq", &a, &e3, 0.99).passed);

    // Parallel tensors pass both; the limit is strict (cosine must exceed it).
    let x: Vec<f32> = (0..32).map(|i| i as f32 - 10.0).collect();
    let x2: Vec<f32> = x.iter().map(|v| 2.0 * v).collect();
    let par = compare::cosine("x", &x2, &x, 0.99);
    assert!(par.passed && (par.value - 1.0).abs() < 1e-12, "{par:?}");
    assert!(!compare::cosine("x", &x2, &x, 1.0).passed);
    // Exactly zero on both sides is the same tensor.
    assert!(compare::cosine("x", &[0.0; 4], &[0.0; 4], 0.99).passed);

    // Any non-finite element fails, excused or not.
    let mut nan = a.clone();
    nan[3] = f32::NAN;
    for l in [
        compare::cosine("x", &nan, &a, 0.99),
        compare::attention_grad_cosine("x", &nan, &a, 0.99),
    ] {
        assert!(!l.passed && l.detail.contains("1 non-finite"), "{l:?}");
    }
}

#[test]
fn exact_bitwise_and_zeros_count_differences() {
    let l = compare::exact("row_ptr", &[1, 2, 3], &[1, 2, 3]);
    assert!(l.passed && l.value == 0.0 && l.detail.is_empty());
    let l = compare::exact("row_ptr", &[1, 5, 3, 7], &[1, 2, 3, 4]);
    assert!(
        !l.passed && l.value == 2.0 && l.detail == "first at 1: 5 vs 2",
        "{l:?}"
    );
    let l = compare::exact("row_ptr", &[1, 2], &[1, 2, 3]);
    assert!(
        !l.passed && l.value == 1.0,
        "a missing element is a mismatch: {l:?}"
    );

    assert!(compare::bitwise("dq", &[1, 2, 3], &[1, 2, 3]).passed);
    // -0.0 and 0.0 compare equal as floats but not bitwise.
    let l = compare::bitwise(
        "dq",
        &[bf16::ZERO.to_bits(), 7],
        &[bf16::NEG_ZERO.to_bits(), 7],
    );
    assert!(!l.passed && l.value == 1.0, "{l:?}");
    assert!(!compare::bitwise("dq", &[1, 2], &[1, 2, 3]).passed);

    let values = [0.0, 1.0, 0.0, 2.0, -0.0];
    let l = compare::zeros("dk", &values, |i| i % 2 == 0);
    assert!(l.passed && l.metric == "nonzero_unselected", "{l:?}");
    let l = compare::zeros("dk", &values, |i| i < 2);
    assert!(!l.passed && l.value == 1.0, "{l:?}");
}

#[test]
fn attended_keys_follow_selection_and_causality() {
    // One document of 300 keys in two fragments: queries at positions 130, 131 (K 0..132) and
    // 299 (K 0..300). T = 3, Tk = 300.
    let layout = VarlenLayout::new(&[0, 2, 3], &[0, 132, 300], Some(&[0, 0])).unwrap();
    let mut topk = vec![-1i32; NUM_KV_HEADS * 3 * TOPK_BLOCKS];
    let mut set = |g: usize, q: usize, entries: &[i32]| {
        topk[(g * 3 + q) * TOPK_BLOCKS..][..entries.len()].copy_from_slice(entries);
    };
    set(0, 0, &[1]); // position 130: keys 128..=130 of block 1
    set(0, 1, &[0]); // position 131: all of block 0
    set(1, 0, &[0, 1]); // keys 0..=130
    set(1, 2, &[2]); // position 299: keys 256..300
    set(2, 2, &[2, 0]); // keys 0..128 and 256..300
                        // group 3 selects nothing; query 2 of group 0 nothing.
    let seen = structure::attended_keys(&layout, &topk);
    assert_eq!(seen.len(), 300 * NUM_KV_HEADS);
    let want = |r: usize, g: usize| match g {
        0 | 1 if r <= 130 => true,
        1 | 2 if r >= 256 => true,
        2 => r < 128,
        _ => false,
    };
    for r in 0..300 {
        for g in 0..NUM_KV_HEADS {
            assert_eq!(seen[r * NUM_KV_HEADS + g], want(r, g), "key {r} group {g}");
        }
    }
}

// ---- samples ----------------------------------------------------------------------------------

#[test]
fn sample_covers_fragment_edges_and_the_first_stored_block() {
    let l = cp_layout();
    let s = Sample::new(&l, 16, 3, 7);
    assert!(!s.is_full());
    assert!(
        s.queries.windows(2).all(|w| w[0] < w[1]),
        "sorted and unique: {:?}",
        s.queries
    );
    assert!(s.queries.len() <= 16 && s.queries.len() >= 2 * l.batch());
    for f in l.fragments() {
        assert!(
            s.queries.contains(&f.q_start),
            "first query of fragment at {}",
            f.q_start
        );
        assert!(
            s.queries.contains(&(f.q_start + f.q_len - 1)),
            "last query of fragment at {}",
            f.q_start
        );
    }
    let (start, count) = l.physical_block_keys();
    for g in 0..NUM_KV_HEADS {
        let ranges: Vec<_> = s
            .keys
            .iter()
            .filter(|(kg, _)| *kg == g)
            .map(|(_, r)| r.clone())
            .collect();
        assert!(
            ranges.len() >= 2 && ranges.len() <= 3,
            "group {g}: {ranges:?}"
        );
        // The first stored block is document B's block 0; its partial last block holds 24 keys.
        assert!(ranges.contains(&(0..128)), "group {g}: {ranges:?}");
        assert!(ranges.contains(&(2176..2200)), "group {g}: {ranges:?}");
        // Every range is exactly the stored keys of one physical block.
        for r in &ranges {
            let pb = (0..start.len())
                .find(|&pb| start[pb] == r.start as i32)
                .expect("a block start");
            assert_eq!(r.len(), count[pb] as usize);
        }
    }
    assert_eq!(s, Sample::new(&l, 16, 3, 7), "seeded");

    let full = Sample::full(&l);
    assert!(full.is_full());
    assert_eq!(full.queries, (0..l.total_q()).collect::<Vec<_>>());
    assert_eq!(
        full.keys,
        (0..NUM_KV_HEADS)
            .map(|g| (g, 0..l.total_k()))
            .collect::<Vec<_>>()
    );
}
