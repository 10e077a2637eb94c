//! Every development case (a real CP16 rank of each pack) under every verification pattern: the
//! whole call (prepare, forward, backward, indexer, KL with loss coefficient 1.7) on the GPU,
//! checked three ways:
//! - against the naive fp32 GPU reference (`CudaMsa::reference_*`) on EVERY element of O, LSE,
//!   dQ, dK, dV, dQI and dKI (`check::against_full`), with the full-tensor checks that need no
//!   reference (no poisoned element left, exact zeros for keys nobody selected, LSE rows finite
//!   unless the set is empty, Σ dV of a group equal to its Σ dO);
//! - against the CPU reference on a sample of queries and key blocks (`against_reference`),
//!   which also checks the indexer's selection rules, ranking and LSE;
//! - on MSA's input protocol and on peaked inputs (docs/contract.md §7.3).
//!
//! `MSA_REAL_CASES=a..b` limits the sweep to manifest entries a..b (to split it across runs);
//! `MSA_REAL_INPUTS` picks the input modes (`msa`, `peaked`, default both; peaked runs use the
//! patterns of [`PEAKED_PATTERNS`] unless `MSA_REAL_PEAKED_PATTERNS=all`); `MSA_REAL_FULL=0`
//! skips the GPU-reference comparison (the sampled check stays).

use std::time::Instant;

use msa_harness::backend::{gpu_reference, Backend, RunOptions};
use msa_harness::cases;
use msa_harness::check::{against_full, against_reference, CheckReport, Sample, Tolerances};
use msa_workloads::{InputMode, Pattern, DEV_MANIFEST};

use crate::harness;

/// Queries and key blocks per group in each sampled check.
const SAMPLE_QUERIES: usize = 48;
const SAMPLE_BLOCKS: usize = 2;

/// The patterns peaked inputs run under by default: MSA's own and a scattered one.
const PEAKED_PATTERNS: [Pattern; 2] = [Pattern::Recent16, Pattern::Random];

fn modes() -> Vec<InputMode> {
    let spec = std::env::var("MSA_REAL_INPUTS").unwrap_or_else(|_| "msa,peaked".into());
    spec.split(',')
        .map(|m| match m.trim() {
            "msa" => InputMode::Msa,
            "peaked" => InputMode::Peaked,
            other => panic!("MSA_REAL_INPUTS: unknown input mode `{other}` (msa, peaked)"),
        })
        .collect()
}

/// The patterns of one input mode. Peaked inputs plant their keys for the selection, so the
/// `indexer` pattern (the GPU indexer's selection of the same inputs) has no peaked form.
fn patterns(mode: InputMode) -> Vec<Pattern> {
    let all = std::env::var("MSA_REAL_PEAKED_PATTERNS").is_ok_and(|v| v == "all");
    match mode {
        InputMode::Peaked if !all => PEAKED_PATTERNS.to_vec(),
        InputMode::Peaked => Pattern::verification_set()
            .into_iter()
            .filter(|&p| p != Pattern::Indexer)
            .collect(),
        InputMode::Msa => Pattern::verification_set().to_vec(),
    }
}

#[test]
fn real_cases_every_pattern() {
    let device = harness::device();
    let cuda = Backend::Cuda(harness::open_device());
    let full = std::env::var("MSA_REAL_FULL").map_or(true, |v| v != "0");
    let listed = cases::manifest(DEV_MANIFEST.as_ref()).expect("dev manifest");
    let tol = Tolerances::strict();
    let opts = RunOptions {
        backward: true,
        indexer: true,
        kl: true,
        deterministic: false,
        loss_coeff: harness::LOSS_COEFF,
    };
    let mut failures = Vec::new();
    let mut runs = 0;
    for case in &listed[harness::env_range("MSA_REAL_CASES", listed.len())] {
        let rank = (case.case_id % 16) as usize;
        let rc = cases::rank_case(&listed, case.case_id, rank).expect("rank case");
        for mode in modes() {
            let t = Instant::now();
            let mut p = cases::build_in(&rc, Pattern::Recent16, 0, mode);
            let mut build_s = t.elapsed().as_secs_f64();
            for pattern in patterns(mode) {
                if mode == InputMode::Peaked && pattern != Pattern::Recent16 {
                    let t = Instant::now();
                    p = cases::build_in(&rc, pattern, 0, mode);
                    build_s = t.elapsed().as_secs_f64();
                }
                // The indexer pattern takes its selection from the GPU indexer itself (MSA's own
                // flow); the indexer's rules, ranking and LSE are checked with the rest. Peaked
                // inputs plant their keys for the selection, so they are built per pattern.
                match (pattern, mode) {
                    (Pattern::Indexer, _) => p.topk_indices = harness::gpu_indexer_selection(&p),
                    (_, InputMode::Msa) => p.topk_indices = cases::selection(&rc, pattern, 0),
                    (_, InputMode::Peaked) => {}
                }
                let name = match mode {
                    InputMode::Msa => format!("case{}/r{rank}/{pattern}", case.case_id),
                    _ => format!("case{}/r{rank}/{pattern}/{mode}", case.case_id),
                };
                let t = Instant::now();
                let result = cuda
                    .run(&p, &opts)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                let run_s = t.elapsed().as_secs_f64();
                let t = Instant::now();
                let sample = Sample::new(&p.layout, SAMPLE_QUERIES, SAMPLE_BLOCKS, case.case_id);
                let kl = result
                    .kl_indexer_lse
                    .as_deref()
                    .map(|l| (l, harness::LOSS_COEFF));
                let mut report =
                    against_reference(&p, &result.outputs, &sample, &tol, kl).expect("reference");
                let sampled_s = t.elapsed().as_secs_f64();
                let (mut reference_s, mut full_s) = (0.0, 0.0);
                if full {
                    let t = Instant::now();
                    let want = gpu_reference(device, &p, &result.outputs, kl)
                        .unwrap_or_else(|e| panic!("{name}: GPU reference: {e}"));
                    reference_s = t.elapsed().as_secs_f64();
                    let t = Instant::now();
                    let all = against_full(&p, &result.outputs, &want, &tol).expect("full check");
                    full_s = t.elapsed().as_secs_f64();
                    report.extend(prefixed("full", all));
                }
                // Where the sweep's wall time goes (host seconds per phase), to size its runs.
                let host_s = serde_json::json!({
                    "build": build_s, "run": run_s, "sampled_check": sampled_s,
                    "gpu_reference": reference_s, "full_check": full_s,
                });
                build_s = 0.0;
                eprintln!("[real_cases] {name}: host seconds {host_s}");
                let times: Vec<_> = result
                    .times
                    .iter()
                    .map(|t| serde_json::json!({"stage": t.stage, "ms": t.ms}))
                    .collect();
                if !report.passed() {
                    failures.push(name.clone());
                }
                runs += 1;
                let extra = serde_json::json!({
                    "times": times, "T": p.layout.total_q(), "Tk": p.layout.total_k(),
                    "fragments": p.layout.batch(), "inputs": mode.name(),
                    "coverage": if full { "full+sampled" } else { "sampled" },
                    "sampled_queries": sample.queries.len(), "host_s": host_s,
                });
                harness::record_soft("real_cases", &name, &report, extra);
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed: {failures:?}",
        failures.len()
    );
}

/// `report` with every tensor name prefixed (`full/out`), so the full-tensor lines stand apart
/// from the sampled ones.
fn prefixed(prefix: &str, mut report: CheckReport) -> CheckReport {
    for l in &mut report.lines {
        l.tensor = format!("{prefix}/{}", l.tensor);
    }
    report
}
