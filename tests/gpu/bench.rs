//! `msa_harness::bench` on the device: every stage is timed with its own events, the times are
//! positive and finite, and a stage whose inputs are absent is refused by name.

use msa_harness::backend::Backend;
use msa_harness::bench::{self, BenchOptions};
use msa_harness::io::CallInputs;
use msa_harness::Stage;
use msa_plan::VarlenLayout;
use msa_workloads::{make_topk, Inputs, Pattern};

use crate::harness;

fn case(cu: &[i32]) -> CallInputs {
    let layout = VarlenLayout::documents(cu).expect("layout");
    let topk = make_topk(&layout, Pattern::Random, 7);
    CallInputs::generated(layout.clone(), Inputs::generate(&layout, 7), topk)
}

#[test]
fn bench_times_every_stage() {
    let cuda = Backend::Cuda(harness::open_device());
    let p = case(&[0, 1000, 5000]);
    let opts = BenchOptions {
        stages: Stage::BENCH.to_vec(),
        warmup: 1,
        iters: 3,
    };
    let times = bench::run(&cuda, &p, &opts).expect("bench");
    assert_eq!(
        times.iter().map(|t| t.stage).collect::<Vec<_>>(),
        Stage::BENCH.to_vec()
    );
    for t in &times {
        assert_eq!(t.ms.len(), 3, "{}", t.stage);
        assert!(
            t.ms.iter().all(|&ms| ms.is_finite() && ms > 0.0),
            "{}: {:?}",
            t.stage,
            t.ms
        );
    }

    let mut forward_only = p.clone();
    forward_only.dout = None;
    let opts = BenchOptions {
        stages: vec![Stage::Forward, Stage::Backward],
        ..opts
    };
    let e = bench::run(&cuda, &forward_only, &opts)
        .unwrap_err()
        .to_string();
    assert_eq!(e, "stage `backward` needs dout in the inputs");
}
