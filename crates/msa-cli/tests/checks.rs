//! What `msa compare` and `msa run` gate: results that are wrong must fail, and options a
//! backend cannot honour are refused, never silently ignored.

use std::path::PathBuf;
use std::process::{Command, Output};

use half::bf16;
use msa_harness::backend::{Backend, RunOptions};
use msa_harness::io::{write_outputs, CallInputs, Outputs};
use msa_plan::VarlenLayout;
use msa_workloads::{make_topk, Inputs, Pattern};

fn msa(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_msa"))
        .args(args)
        .output()
        .expect("the msa binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code `code`, else a panic showing both streams.
fn expect_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
}

/// A fresh path in the target's scratch directory.
fn tmp(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("checks-{name}"));
    let _ = std::fs::remove_file(&p);
    p
}

/// The CPU backend's outputs (attention, gradients, indexer, KL) of a small CP case.
fn outputs() -> Outputs {
    let layout = VarlenLayout::new(&[0, 40, 100], &[0, 300, 400], Some(&[0, 0])).unwrap();
    let topk = make_topk(&layout, Pattern::Random, 3);
    let p = CallInputs::generated(layout.clone(), Inputs::generate(&layout, 3), topk);
    let opts = RunOptions {
        backward: true,
        indexer: true,
        kl: true,
        deterministic: false,
        loss_coeff: 1.7,
    };
    Backend::Cpu.run(&p, &opts).unwrap().outputs
}

/// The table line of `tensor`/`metric` in a report, if any.
fn table_line<'t>(text: &'t str, tensor: &str, metric: &str) -> Option<&'t str> {
    text.lines().find(|l| {
        let mut w = l.split_whitespace();
        w.next() == Some(tensor) && w.next() == Some(metric)
    })
}

#[test]
fn compare_fails_a_gradient_of_the_wrong_scale() {
    let base = outputs();
    let expected = tmp("scale-expected.safetensors");
    write_outputs(&expected, &base, false).unwrap();
    type Pick = fn(&mut Outputs) -> &mut Option<Vec<bf16>>;
    let cases: [(&str, Pick, f32); 5] = [
        ("dq", |o| &mut o.dq, 1000.0),
        ("dk", |o| &mut o.dk, 2.0),
        ("dv", |o| &mut o.dv, 0.01),
        ("dqi", |o| &mut o.dqi, 2.0),
        ("dki", |o| &mut o.dki, 0.5),
    ];
    for (tensor, pick, factor) in cases {
        let mut bad = base.clone();
        for v in pick(&mut bad).as_mut().unwrap() {
            *v = bf16::from_f32(v.to_f32() * factor);
        }
        let actual = tmp(&format!("scale-{tensor}.safetensors"));
        write_outputs(&actual, &bad, false).unwrap();
        for tolerances in ["msa", "strict"] {
            let o = msa(&[
                "compare",
                "--tolerances",
                tolerances,
                actual.to_str().unwrap(),
                expected.to_str().unwrap(),
            ]);
            expect_exit(&o, 1);
            let text = stdout(&o);
            let failed: Vec<&str> = text
                .lines()
                .skip(1)
                .filter(|l| l.contains(" FAIL"))
                .collect();
            assert_eq!(failed.len(), 1, "{tensor} x {factor}:\n{text}");
            assert_eq!(
                Some(failed[0]),
                table_line(&text, tensor, "l2_rel"),
                "{tensor} x {factor}:\n{text}"
            );
            let cosine = table_line(&text, tensor, "cosine").expect("a cosine line");
            assert!(cosine.contains(" ok"), "the cosine still passes: {text}");
        }
    }
}
