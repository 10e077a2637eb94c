//! Every development case (a real CP16 rank of each pack) under every verification pattern:
//! the whole call (prepare, forward, backward, indexer, KL) on the GPU against the CPU
//! reference on a sample of queries and key blocks, plus full-tensor checks that need no
//! reference (no poisoned element left, exact zeros for keys nobody selected, selection rules).
//!
//! `MSA_REAL_CASES=a..b` limits the sweep to manifest entries a..b (to split it across runs).

use msa_harness::backend::{Backend, RunOptions};
use msa_harness::cases;
use msa_harness::check::{against_reference, Sample, Tolerances};
use msa_workloads::{Pattern, DEV_MANIFEST};

use crate::harness;

/// Queries and key blocks per group in each sampled check.
const SAMPLE_QUERIES: usize = 48;
const SAMPLE_BLOCKS: usize = 2;

fn range(len: usize) -> std::ops::Range<usize> {
    let Ok(spec) = std::env::var("MSA_REAL_CASES") else {
        return 0..len;
    };
    let (a, b) = spec.split_once("..").expect("MSA_REAL_CASES=a..b");
    a.parse().unwrap()..b.parse::<usize>().unwrap().min(len)
}

#[test]
fn real_cases_every_pattern() {
    let cuda = Backend::Cuda(harness::open_device());
    let listed = cases::manifest(DEV_MANIFEST.as_ref()).expect("dev manifest");
    let tol = Tolerances::strict();
    let opts = RunOptions {
        backward: true,
        indexer: true,
        kl: true,
        deterministic: false,
        loss_coeff: 1.0,
    };
    let mut failures = Vec::new();
    let mut runs = 0;
    for case in &listed[range(listed.len())] {
        let rank = (case.case_id % 16) as usize;
        let rc = cases::rank_case(&listed, case.case_id, rank).expect("rank case");
        let mut p = cases::build(&rc, Pattern::Recent16, 0);
        for pattern in Pattern::verification_set() {
            // The indexer pattern takes its selection from the GPU indexer itself (MSA's own
            // flow); the indexer's rules, ranking and LSE are checked with the rest.
            p.topk_indices = match pattern {
                Pattern::Indexer => harness::gpu_indexer_selection(&p),
                _ => cases::selection(&rc, pattern, 0),
            };
            let name = format!("case{}/r{rank}/{pattern}", case.case_id);
            let result = cuda
                .run(&p, &opts)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            let sample = Sample::new(&p.layout, SAMPLE_QUERIES, SAMPLE_BLOCKS, case.case_id);
            let kl = result.kl_indexer_lse.as_deref().map(|l| (l, 1.0));
            let report =
                against_reference(&p, &result.outputs, &sample, &tol, kl).expect("reference");
            let times: Vec<_> = result
                .times
                .iter()
                .map(|t| serde_json::json!({"stage": t.stage, "ms": t.ms}))
                .collect();
            if !report.passed() {
                failures.push(name.clone());
            }
            runs += 1;
            let extra = serde_json::json!({"times": times, "T": p.layout.total_q(), "Tk": p.layout.total_k(), "fragments": p.layout.batch()});
            harness::record_soft("real_cases", &name, &report, extra);
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed: {failures:?}",
        failures.len()
    );
}
