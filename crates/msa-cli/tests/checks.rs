//! What `msa compare` and `msa run` gate: results that are wrong must fail, and options a
//! backend cannot honour are refused, never silently ignored.

use std::path::PathBuf;
use std::process::Output;

use half::bf16;
use msa_harness::backend::{Backend, RunOptions};
use msa_harness::io::{write_outputs, CallInputs, Outputs};
use msa_plan::VarlenLayout;
use msa_workloads::{make_topk, Inputs, Pattern};

mod common;
use common::{expect_exit, manifest_line, msa, stderr, stdout, tmp};

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

/// A manifest of one pack of 16·1,024 tokens in documents of a few hundred tokens (none a
/// multiple of 128): each CP16 rank holds 1,024 queries in fragments, cheap on the CPU.
fn small_manifest() -> PathBuf {
    let path = tmp("small.jsonl");
    const TOTAL: i32 = 16 * 1024;
    let mut cu = vec![0];
    for len in [421, 650, 333, 517, 250, 700, 389].into_iter().cycle() {
        let end = cu.last().unwrap() + len;
        if end >= TOTAL - 100 {
            break;
        }
        cu.push(end);
    }
    cu.push(TOTAL);
    std::fs::write(&path, manifest_line(5, &cu) + "\n").unwrap();
    path
}

fn cpu_run(manifest: &std::path::Path, extra: &[&str]) -> Output {
    let base = [
        "run",
        "--manifest",
        manifest.to_str().unwrap(),
        "--case",
        "5",
        "--rank",
        "1",
        "--backend",
        "cpu",
    ];
    msa(&[&base[..], extra].concat())
}

/// `n {count}` of a table line's detail.
fn count(line: &str) -> usize {
    let at = line
        .find(", n ")
        .unwrap_or_else(|| panic!("no count in `{line}`"))
        + 4;
    line[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_cpu_backend_refuses_a_full_check_and_samples_as_many_queries_as_asked() {
    let manifest = small_manifest();
    // A full check would compare the reference with itself: refused before any work.
    let o = cpu_run(&manifest, &["--check", "full"]);
    expect_exit(&o, 2);
    let err = stderr(&o);
    assert!(
        err.contains("error: check coverage: a full check compares every element with the CPU reference, which is the backend under test"),
        "{err}"
    );
    assert!(
        !err.contains("running on cpu"),
        "refused before the run: {err}"
    );
    assert!(!stdout(&o).contains("PASS"));

    // --sample-queries sets how many queries the oracle checks (12 by default).
    for (extra, queries) in [(&[][..], 12), (&["--sample-queries", "20"][..], 20)] {
        let o = cpu_run(&manifest, extra);
        expect_exit(&o, 0);
        let text = stdout(&o);
        let dq = table_line(&text, "dq", "cosine").expect("a dq line");
        assert_eq!(count(dq), queries * 64 * 128, "{text}");
    }
}

#[test]
fn the_cpu_backend_checks_dki_against_the_oracle() {
    let manifest = small_manifest();
    let o = cpu_run(&manifest, &["--kl", "--loss-coeff", "1.7"]);
    expect_exit(&o, 0);
    let text = stdout(&o);
    for metric in ["cosine", "l2_rel"] {
        let line = table_line(&text, "dki", metric)
            .unwrap_or_else(|| panic!("no dki {metric} in\n{text}"));
        assert!(line.contains(" ok"), "{text}");
        assert!(count(line) >= 128, "key rows were compared: {text}");
    }
}

#[test]
fn run_takes_peaked_inputs_beside_msas_protocol() {
    let manifest = small_manifest();
    let o = cpu_run(
        &manifest,
        &["--inputs", "msa,peaked", "--pattern", "random"],
    );
    expect_exit(&o, 0);
    let text = stdout(&o);
    let verdicts: Vec<&str> = text.lines().filter(|l| l.contains(" on cpu: ")).collect();
    assert_eq!(
        verdicts,
        [
            "case5/r1/random/s0 on cpu: PASS",
            "case5/r1/random/s0/peaked on cpu: PASS"
        ],
        "{text}"
    );
    assert!(text.contains("2 of 2 cases passed"), "{text}");
    let o = msa(&["run", "-h"]);
    assert!(
        stdout(&o).contains("[possible values: msa, peaked]"),
        "{}",
        stdout(&o)
    );
    let o = cpu_run(&manifest, &["--inputs", "flat"]);
    expect_exit(&o, 2);
}

#[test]
fn run_cp_assembles_the_ranks_into_the_single_call_on_the_cpu() {
    // Case 605 cut to 2,048 tokens (many short documents: seconds on the CPU reference).
    let o = msa(&[
        "run",
        "--backend",
        "cpu",
        "--case",
        "605",
        "--cp",
        "2",
        "--pack-tokens",
        "2048",
        "--tolerances",
        "strict",
    ]);
    expect_exit(&o, 0);
    let text = stdout(&o);
    assert!(
        text.contains("case605/cp2/recent16/s0/2048tok on cpu (cp 2, sequential) against the single call: PASS"),
        "{text}"
    );
    for line in [
        "bitwise equal: out 100.000%",
        "comm all_gather (copies)",
        "cp local calls",
    ] {
        assert!(text.contains(line), "`{line}` in {text}");
    }
}

#[test]
fn run_cp_refuses_what_it_cannot_run_before_any_work() {
    let o = msa(&[
        "run",
        "--backend",
        "cpu",
        "--cp",
        "2",
        "--cp-transport",
        "nccl",
    ]);
    expect_exit(&o, 2);
    assert!(
        stderr(&o).contains("the NCCL transport runs on the GPU backend"),
        "{}",
        stderr(&o)
    );
    let o = msa(&[
        "run",
        "--backend",
        "cpu",
        "--cp",
        "2",
        "--pack-tokens",
        "3000",
    ]);
    expect_exit(&o, 2);
    assert!(
        stderr(&o)
            .contains("3000 tokens do not split into chunks of 1024 dealt evenly over 2 ranks"),
        "{}",
        stderr(&o)
    );
    let o = msa(&["run", "--backend", "cpu", "--pack-tokens", "2048"]);
    expect_exit(&o, 2);
    assert!(stderr(&o).contains("--cp"), "{}", stderr(&o));
}
