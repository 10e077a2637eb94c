//! The naive fp32 GPU reference (`CudaMsa::reference_*`, the oracle of the real-case sweep's
//! full-tensor checks) judged by the CPU reference (`msa-ref`): in full on the edge layouts, under
//! valid selections and selections full of entries the contract ignores (negative, future, past
//! the document, repeated), on MSA's inputs and on peaked ones; and on a sample of queries and
//! key blocks of a real rank. Both sides compute in fp32, so the limits are fp32-tight
//! ([`fp32`]), a hundredfold below what the bf16 kernels are held to.

use half::bf16;
use msa::cuda::{CudaMsa, DeviceLayout, KlInputs};
use msa_harness::check::{compare, CheckReport, Sample, Tolerances};
use msa_plan::testing::messy_topk;
use msa_plan::topology::{HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS};
use msa_plan::VarlenLayout;
use msa_ref::attention::{self, AttentionInputs};
use msa_ref::indexer::{selection_lse, IndexerInputs};
use msa_ref::kl;
use msa_workloads::{case_seed, make_topk, InputMode, Inputs, Pattern};
use serde_json::json;

use crate::harness::{self, LOSS_COEFF};
use crate::indexer::dev_rank_case;
use crate::prepare::fetch;

/// Limits for two fp32 computations of the same sums in different orders. The KL's dz is
/// rounded to bf16 on both sides, so a value at a rounding edge may land one bf16 step apart:
/// its gradients get a looser relative L2 limit ([`fp32_kl`]).
fn fp32() -> Tolerances {
    Tolerances {
        out_atol: 1e-5,
        out_rtol: 1e-4,
        lse_atol: 1e-5,
        lse_rtol: 1e-5,
        grad_cosine: 0.99999,
        grad_l2_rel: 1e-4,
        ..Tolerances::strict()
    }
}

fn fp32_kl() -> Tolerances {
    Tolerances {
        grad_cosine: 0.9999,
        grad_l2_rel: 2e-3,
        ..fp32()
    }
}

/// Host inputs of one reference comparison.
struct Case {
    layout: VarlenLayout,
    inputs: Inputs,
    topk: Vec<i32>,
}

impl Case {
    fn new(layout: &VarlenLayout, topk: Vec<i32>, seed: u64, mode: InputMode) -> Self {
        let mut inputs = Inputs::generate_in(layout, seed, mode);
        if mode == InputMode::Peaked {
            inputs.plant_peaks(layout, &topk, seed);
        }
        Self {
            layout: layout.clone(),
            inputs,
            topk,
        }
    }

    fn attention(&self) -> AttentionInputs<'_> {
        AttentionInputs {
            layout: &self.layout,
            q: &self.inputs.q,
            k: &self.inputs.k,
            v: &self.inputs.v,
            topk: &self.topk,
        }
    }

    fn index(&self) -> IndexerInputs<'_> {
        IndexerInputs {
            layout: &self.layout,
            qi: &self.inputs.qi,
            ki: &self.inputs.ki,
        }
    }
}

/// The GPU reference's fp32 outputs, given the forward (`out` bf16, `lse`) and the index LSE
/// the backward and the KL take.
struct Gpu {
    out: Vec<f32>,
    lse: Vec<f32>,
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    dqi: Vec<f32>,
    dki: Vec<f32>,
}

/// Runs every GPU reference on `case`; the backward takes `out`/`lse`, the KL `lse` as the
/// teacher's and `indexer_lse` as the student's.
fn gpu(msa: &CudaMsa, case: &Case, out: &[bf16], lse: &[f32], indexer_lse: &[f32]) -> Gpu {
    let layout = DeviceLayout::new(msa, case.layout.clone()).expect("device layout");
    let up = |x: &[bf16]| msa.upload(x).expect("upload");
    let i = &case.inputs;
    let (q, k, v, dout) = (up(&i.q), up(&i.k), up(&i.v), up(&i.dout));
    let (qi, ki, out) = (up(&i.qi), up(&i.ki), up(out));
    let topk = msa.upload(&case.topk).expect("upload topk");
    let lse_d = msa.upload(lse).expect("upload lse");
    let ilse = msa.upload(indexer_lse).expect("upload indexer_lse");
    let fwd = msa
        .reference_forward(&layout, &q, &k, &v, &topk)
        .expect("reference forward");
    let g = msa
        .reference_backward(&layout, &q, &k, &v, &topk, &dout, &out, &lse_d)
        .expect("reference backward");
    let inputs = KlInputs {
        q: &q,
        k: &k,
        teacher_lse: &lse_d,
        qi: &qi,
        ki: &ki,
        indexer_lse: &ilse,
    };
    let (dqi, dki) = msa
        .reference_kl_backward(&layout, &inputs, &topk, LOSS_COEFF)
        .expect("reference KL");
    let (t, tk) = (case.layout.total_q(), case.layout.total_k());
    let get = |name: &str, x: &cudarc::driver::CudaSlice<f32>, n: usize| {
        let mut v = fetch(msa, name, x);
        v.truncate(n);
        v
    };
    Gpu {
        out: get("out", &fwd.out, t * NUM_Q_HEADS * HEAD_DIM),
        lse: get("lse", &fwd.lse, t * NUM_Q_HEADS),
        dq: get("dq", &g.dq, t * NUM_Q_HEADS * HEAD_DIM),
        dk: get("dk", &g.dk, tk * NUM_KV_HEADS * HEAD_DIM),
        dv: get("dv", &g.dv, tk * NUM_KV_HEADS * HEAD_DIM),
        dqi: get("dqi", &dqi, t * NUM_INDEX_HEADS * INDEX_DIM),
        dki: get("dki", &dki, tk * INDEX_DIM),
    }
}

/// Every line comparing the GPU reference with the CPU reference's `want` (both complete) on a
/// layout of `total_q` queries.
fn compare_all(got: &Gpu, want: &Gpu, prefix: &str, total_q: usize) -> CheckReport {
    let (tol, kl_tol) = (fp32(), fp32_kl());
    let name = |s: &str| format!("{prefix}/{s}");
    let mut r = CheckReport::default();
    r.push(compare::close(
        &name("out"),
        &got.out,
        &want.out,
        tol.out_atol,
        tol.out_rtol,
    ));
    r.push(compare::close(
        &name("lse"),
        &got.lse,
        &want.lse,
        tol.lse_atol,
        tol.lse_rtol,
    ));
    for (n, a, b) in [
        ("dq", &got.dq, &want.dq),
        ("dk", &got.dk, &want.dk),
        ("dv", &got.dv, &want.dv),
    ] {
        r.push_all(compare::attention_gradient(&name(n), a, b, &tol));
    }
    for (n, a, b) in [("dqi", &got.dqi, &want.dqi), ("dki", &got.dki, &want.dki)] {
        // Single-key layouts have dz = 0: both sides are rounding noise (compare::kl_gradient).
        let scale = compare::kl_grad_scale(LOSS_COEFF, total_q);
        r.push_all(compare::kl_gradient(&name(n), a, b, &kl_tol, scale));
    }
    r
}

/// Sparse elements above which an edge layout is not compared in full (the CPU reference's
/// time); such layouts are recorded as skipped.
const EDGE_SPARSE_BUDGET: u64 = 1_500_000;

#[test]
fn gpu_reference_matches_the_cpu_reference_on_edge_layouts() {
    let msa = harness::device();
    let mut skipped = Vec::new();
    for (i, (name, layout)) in harness::edge_layouts().into_iter().enumerate() {
        let sparse = msa_plan::sparse_elements(&layout);
        if sparse > EDGE_SPARSE_BUDGET {
            harness::record_skip(
                "reference_edge_layouts",
                &name,
                &format!("{sparse} sparse elements, above the CPU budget of {EDGE_SPARSE_BUDGET}"),
            );
            skipped.push(name);
            continue;
        }
        let seed = 0x7EF_0000 + i as u64;
        let selections = [
            ("recent", msa_plan::testing::recent_topk(&layout)),
            ("messy", messy_topk(&layout, seed)),
            ("b0p99", make_topk(&layout, Pattern::B0p99, seed)),
        ];
        let mut report = CheckReport::default();
        for (sel, topk) in selections {
            for mode in InputMode::ALL {
                let case = Case::new(&layout, topk.clone(), seed, mode);
                let fwd = attention::forward(&case.attention()).expect("CPU forward");
                let out = fwd.out_bf16();
                let grads =
                    attention::backward(&case.attention(), &case.inputs.dout, &out, &fwd.lse)
                        .expect("CPU backward");
                let all: Vec<usize> = (0..layout.total_q()).collect();
                let ilse = selection_lse(&case.index(), &case.topk, &all).expect("CPU LSE");
                let klg = kl::kl_backward(
                    &case.attention(),
                    &fwd.lse,
                    &case.inputs.qi,
                    &case.inputs.ki,
                    &ilse,
                    LOSS_COEFF,
                )
                .expect("CPU KL");
                let want = Gpu {
                    out: fwd.out.clone(),
                    lse: fwd.lse.clone(),
                    dq: grads.dq,
                    dk: grads.dk,
                    dv: grads.dv,
                    dqi: klg.dqi,
                    dki: klg.dki,
                };
                let got = gpu(msa, &case, &out, &fwd.lse, &ilse);
                report.extend(compare_all(
                    &got,
                    &want,
                    &format!("{sel}/{mode}"),
                    layout.total_q(),
                ));
            }
        }
        harness::record(
            "reference_edge_layouts",
            &name,
            &report,
            json!({ "total_q": layout.total_q(), "sparse_elements": sparse, "coverage": "full" }),
        );
    }
    println!("reference_edge_layouts: skipped {skipped:?}");
}

#[test]
fn gpu_reference_matches_the_cpu_reference_on_a_sampled_dev_case() {
    // Case 741, rank 0 (12,288 queries, documents of up to 6,679 tokens): the GPU reference in
    // full, the CPU reference on 64 queries and 4 key blocks per group. The backward and the KL
    // take the GPU reference's own forward (out rounded to bf16), so both sides see the same.
    let msa = harness::device();
    let (case_id, rank) = (741u64, 0usize);
    let rc = dev_rank_case(case_id, rank);
    let layout = rc.layout();
    let seed = case_seed(case_id, rank, 0);
    let sample = Sample::new(layout, 64, 4, 0x7EF);
    let qs = &sample.queries;
    let (tol, kl_tol) = (fp32(), fp32_kl());
    let mut report = CheckReport::default();
    for pattern in [Pattern::Recent16, Pattern::Random] {
        for mode in InputMode::ALL {
            let case = Case::new(layout, make_topk(layout, pattern, seed), seed, mode);
            let prefix = format!("{pattern}/{mode}");
            let name = |s: &str| format!("{prefix}/{s}");
            let ai = case.attention();
            // The GPU forward first: its output feeds both backward computations.
            let first = gpu_forward(msa, &case);
            let out_bf16: Vec<bf16> = first.0.iter().map(|&x| bf16::from_f32(x)).collect();
            let lse = first.1;
            let sub = attention::forward_queries(&ai, qs).expect("CPU forward");
            report.push(compare::close(
                &name("out"),
                &rows(&first.0, NUM_Q_HEADS * HEAD_DIM, qs),
                &sub.out,
                tol.out_atol,
                tol.out_rtol,
            ));
            report.push(compare::close(
                &name("lse"),
                &rows(&lse, NUM_Q_HEADS, qs),
                &sub.lse,
                tol.lse_atol,
                tol.lse_rtol,
            ));
            let all: Vec<usize> = (0..layout.total_q()).collect();
            let ilse = selection_lse(&case.index(), &case.topk, &all).expect("CPU LSE");
            let g = gpu(msa, &case, &out_bf16, &lse, &ilse);
            let dout = &case.inputs.dout;
            let dq = attention::backward_dq_queries(&ai, dout, &out_bf16, &lse, qs).expect("dq");
            report.push_all(compare::attention_gradient(
                &name("dq"),
                &rows(&g.dq, NUM_Q_HEADS * HEAD_DIM, qs),
                &dq,
                &tol,
            ));
            let (mut dk, mut dv, mut gk, mut gv) = (vec![], vec![], vec![], vec![]);
            for (grp, keys) in &sample.keys {
                let (a, b) =
                    attention::backward_dkv_keys(&ai, dout, &out_bf16, &lse, *grp, keys.clone())
                        .expect("dk dv");
                dk.extend(a);
                dv.extend(b);
                for r in keys.clone() {
                    let at = (r * NUM_KV_HEADS + grp) * HEAD_DIM;
                    gk.extend_from_slice(&g.dk[at..at + HEAD_DIM]);
                    gv.extend_from_slice(&g.dv[at..at + HEAD_DIM]);
                }
            }
            report.push_all(compare::attention_gradient(&name("dk"), &gk, &dk, &tol));
            report.push_all(compare::attention_gradient(&name("dv"), &gv, &dv, &tol));
            let (qi, ki) = (&case.inputs.qi, &case.inputs.ki);
            let dqi = kl::kl_dqi_queries(&ai, &lse, qi, ki, &ilse, LOSS_COEFF, qs).expect("dqi");
            report.push_all(compare::gradient(
                &name("dqi"),
                &rows(&g.dqi, NUM_INDEX_HEADS * INDEX_DIM, qs),
                &dqi,
                &kl_tol,
            ));
            let (mut want, mut got) = (vec![], vec![]);
            for (_, keys) in sample.keys.iter().filter(|(grp, _)| *grp == 0) {
                want.extend(
                    kl::kl_dki_keys(&ai, &lse, qi, ki, &ilse, LOSS_COEFF, keys.clone())
                        .expect("dki"),
                );
                got.extend_from_slice(&g.dki[keys.start * INDEX_DIM..keys.end * INDEX_DIM]);
            }
            report.push_all(compare::gradient(&name("dki"), &got, &want, &kl_tol));
        }
    }
    harness::record(
        "reference_dev_case",
        &format!("case{case_id}/r{rank}"),
        &report,
        json!({ "total_q": layout.total_q(), "coverage": "sampled", "sampled_queries": qs.len() }),
    );
}

/// The GPU reference forward alone: `(out, lse)` in fp32.
fn gpu_forward(msa: &CudaMsa, case: &Case) -> (Vec<f32>, Vec<f32>) {
    let layout = DeviceLayout::new(msa, case.layout.clone()).expect("device layout");
    let up = |x: &[bf16]| msa.upload(x).expect("upload");
    let i = &case.inputs;
    let topk = msa.upload(&case.topk).expect("upload topk");
    let fwd = msa
        .reference_forward(&layout, &up(&i.q), &up(&i.k), &up(&i.v), &topk)
        .expect("reference forward");
    let t = case.layout.total_q();
    let mut out = fetch(msa, "out", &fwd.out);
    let mut lse = fetch(msa, "lse", &fwd.lse);
    out.truncate(t * NUM_Q_HEADS * HEAD_DIM);
    lse.truncate(t * NUM_Q_HEADS);
    (out, lse)
}

/// Rows `idx` of a row-major fp32 tensor with `width` elements per row.
fn rows(x: &[f32], width: usize, idx: &[usize]) -> Vec<f32> {
    idx.iter()
        .flat_map(|&r| x[r * width..(r + 1) * width].iter().copied())
        .collect()
}
