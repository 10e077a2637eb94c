//! Context parallelism on the CPU reference: every rank's local call, with the collectives
//! simulated in one process (all-gather = concatenation, reduce-scatter = f32 sum then split),
//! assembles to the single call over the whole pack. Per-query outputs (out, lse, dq, the
//! indexer's selection and LSE, dqi) are bit for bit the single call's; key gradients (dk, dv,
//! dki) are sums over the ranks whose queries read the key, so they equal the single call's f32
//! sums up to the order of summation (checked against an fp32 bound, and exact where one rank
//! reads the key) and are rounded to bf16 once.

use half::bf16;
use msa_harness::backend::{run, CpuReference, RunOptions};
use msa_harness::cp::{pack_call, run_sequential, KeyGrads, RankInputs};
use msa_harness::io::{CallInputs, Outputs};
use msa_ref::attention::{self, AttentionInputs};
use msa_ref::compare::to_bf16;
use msa_ref::indexer::{self, IndexerInputs};
use msa_ref::kl;
use msa_workloads::{
    load_manifest, truncate_pack, CpConfig, CpPlan, InputMode, Pattern, DEV_MANIFEST,
};

const OPTS: RunOptions = RunOptions {
    backward: true,
    indexer: true,
    kl: true,
    deterministic: false,
    loss_coeff: 1.0,
};

fn bits(x: &[bf16]) -> Vec<u16> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// The single call over the whole pack on the CPU reference, as `backend::run` makes it, with
/// the key gradients (dk, dv, dki) also unrounded.
fn single_call(p: &CallInputs) -> (Outputs, KeyGrads) {
    let inputs = AttentionInputs {
        layout: &p.layout,
        q: &p.q,
        k: &p.k,
        v: &p.v,
        topk: &p.topk_indices,
    };
    let fwd = attention::forward(&inputs).unwrap();
    let out = fwd.out_bf16();
    let g = attention::backward(&inputs, p.dout.as_ref().unwrap(), &out, &fwd.lse).unwrap();
    let index = p.index.as_ref().unwrap();
    let ii = IndexerInputs {
        layout: &p.layout,
        qi: &index.qi,
        ki: &index.ki,
    };
    let itop = indexer::forward(&ii).unwrap();
    let all: Vec<usize> = (0..p.layout.total_q()).collect();
    let sel = indexer::selection_lse(&ii, &p.topk_indices, &all).unwrap();
    let kl = kl::kl_backward(&inputs, &fwd.lse, &index.qi, &index.ki, &sel, 1.0).unwrap();
    let o = Outputs {
        out: Some(out),
        lse: Some(fwd.lse),
        dq: Some(to_bf16(&g.dq)),
        dk: Some(to_bf16(&g.dk)),
        dv: Some(to_bf16(&g.dv)),
        indexer_topk: Some(itop.topk),
        indexer_lse: Some(itop.lse),
        dqi: Some(to_bf16(&kl.dqi)),
        dki: Some(to_bf16(&kl.dki)),
    };
    let k = KeyGrads {
        dk: Some(g.dk),
        dv: Some(g.dv),
        dki: Some(kl.dki),
    };
    (o, k)
}

#[test]
fn the_single_call_here_is_the_cpu_backends() {
    let case = &load_manifest(DEV_MANIFEST).unwrap()[19];
    let cu = truncate_pack(&case.cu_seqlens, 1024).unwrap();
    let plan = CpPlan::new(
        case.case_id,
        &cu,
        CpConfig {
            cp_size: 1,
            chunk_size: 1024,
        },
    )
    .unwrap();
    let p = pack_call(&plan, case.case_id, Pattern::Random, 3, InputMode::Msa).unwrap();
    assert_eq!(
        single_call(&p).0,
        run(&CpuReference, &p, &OPTS).unwrap().outputs
    );
}

/// `actual` equals `expected` up to the order of an f32 sum: within 2⁻¹⁸ of the tensor's
/// largest magnitude (a few hundred ulps of it: the sums have at most a few thousand terms of
/// similar size, and only a handful of ranks' partial sums are reassociated).
fn assert_f32_sum_close(name: &str, actual: &[f32], expected: &[f32]) {
    assert_eq!(actual.len(), expected.len(), "{name}");
    let max = expected.iter().fold(0f32, |m, x| m.max(x.abs()));
    let bound = max * 2f32.powi(-18);
    let (mut worst, mut exact) = (0f32, 0usize);
    for (a, e) in actual.iter().zip(expected) {
        worst = worst.max((a - e).abs());
        exact += (a == e) as usize;
    }
    assert!(
        worst <= bound,
        "{name}: largest difference {worst:e} above {bound:e} (max |x| {max:e})"
    );
    assert!(exact > 0, "{name}: no element equal");
}

/// The bf16 key gradients: each the rounding of its f32 sum, and equal to the single call's
/// except where the two f32 sums round differently (rounding is monotone, so then the two bf16
/// values are at most the sums' difference plus one bf16 ulp apart), in a few elements.
fn assert_rounded_once(
    name: &str,
    actual: &[bf16],
    sums: &[f32],
    single: &[bf16],
    single_sums: &[f32],
) {
    let mut differ = 0;
    for (i, (((a, s), e), s1)) in actual
        .iter()
        .zip(sums)
        .zip(single)
        .zip(single_sums)
        .enumerate()
    {
        assert_eq!(a.to_bits(), bf16::from_f32(*s).to_bits(), "{name}[{i}]");
        if a.to_bits() != e.to_bits() {
            differ += 1;
            let (a, e) = (a.to_f32(), e.to_f32());
            let ulp = a.abs().max(e.abs()) * 2f32.powi(-7);
            assert!(
                (a - e).abs() <= (s - s1).abs() + ulp,
                "{name}[{i}]: {a:e} vs {e:e}"
            );
        }
    }
    assert!(
        differ * 1000 <= actual.len(),
        "{name}: {differ} of {} elements differ",
        actual.len()
    );
}

fn check(case_index: usize, tokens: usize, cp_size: usize, chunk_size: usize, pattern: Pattern) {
    let case = &load_manifest(DEV_MANIFEST).unwrap()[case_index];
    let cu = truncate_pack(&case.cu_seqlens, tokens).unwrap();
    let cfg = CpConfig {
        cp_size,
        chunk_size,
    };
    let plan = CpPlan::new(case.case_id, &cu, cfg).unwrap();
    let p = pack_call(&plan, case.case_id, pattern, 7, InputMode::Msa).unwrap();
    let what = format!(
        "case {} ({tokens} tokens, {} documents), cp {cp_size}, chunks of {chunk_size}, {pattern}",
        case.case_id,
        cu.len() - 1
    );

    let (single, single_sums) = single_call(&p);
    let ranks = RankInputs::split(&plan, &p).unwrap();
    let cp = run_sequential(&CpuReference, &plan, &ranks, &OPTS).unwrap();
    let (o, s) = (&cp.outputs, &single);

    for (name, a, e) in [
        ("out", &o.out, &s.out),
        ("dq", &o.dq, &s.dq),
        ("dqi", &o.dqi, &s.dqi),
    ] {
        assert_eq!(
            bits(a.as_ref().unwrap()),
            bits(e.as_ref().unwrap()),
            "{what}: {name}"
        );
    }
    for (name, a, e) in [
        ("lse", &o.lse, &s.lse),
        ("indexer_lse", &o.indexer_lse, &s.indexer_lse),
    ] {
        let to_bits = |x: &Option<Vec<f32>>| {
            x.as_ref()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<_>>()
        };
        assert_eq!(to_bits(a), to_bits(e), "{what}: {name}");
    }
    assert_eq!(o.indexer_topk, s.indexer_topk, "{what}: indexer_topk");

    let (k, e) = (&cp.key_sums, &single_sums);
    for (name, sums, single_sums, rounded, single_rounded) in [
        ("dk", &k.dk, &e.dk, &o.dk, &s.dk),
        ("dv", &k.dv, &e.dv, &o.dv, &s.dv),
        ("dki", &k.dki, &e.dki, &o.dki, &s.dki),
    ] {
        let sums = sums.as_ref().unwrap();
        assert_f32_sum_close(
            &format!("{what}: {name}"),
            sums,
            single_sums.as_ref().unwrap(),
        );
        assert_rounded_once(
            &format!("{what}: {name}"),
            rounded.as_ref().unwrap(),
            sums,
            single_rounded.as_ref().unwrap(),
            single_sums.as_ref().unwrap(),
        );
    }
    let per_rank: Vec<usize> = cp.rank_times.iter().map(Vec::len).collect();
    assert!(
        per_rank.iter().all(|&n| n == per_rank[0]),
        "{what}: every rank runs the same stages"
    );
}

// Real packs cut to their first tokens, chosen with many documents so that the CPU reference
// stays fast (the single call and the CP run of each take seconds); every 196,608-token pack
// takes the CPU reference minutes, so whole packs are left to the GPU (`msa run --cp`).

#[test]
fn cp2_of_a_real_pack_equals_the_single_call() {
    // Case 605: 134 documents in 4,096 tokens.
    check(19, 4096, 2, 1024, Pattern::Recent16);
}

#[test]
fn cp4_of_a_real_pack_equals_the_single_call() {
    check(19, 4096, 4, 1024, Pattern::Random);
}

#[test]
fn cp4_of_small_chunks_crossing_documents_equals_the_single_call() {
    // Case 434: 15 documents of up to 343 tokens; 256-token chunks, so documents cross chunks
    // and ranks and most keys are read by several ranks, their gradients reduced.
    check(9, 4096, 4, 256, Pattern::Spread);
}

#[test]
fn cp2_of_a_long_document_equals_the_single_call() {
    // Case 938: documents of up to 938 tokens in 2,048; 256-token chunks over two ranks.
    check(32, 2048, 2, 256, Pattern::Random);
}
