//! `msa compare`: two outputs files (say `--backend cuda` against `--backend cpu`) under MSA's
//! tolerances (or the strict set, `--tolerances strict`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args as ClapArgs;
use msa::check::{compare, CheckLine, CheckReport, Tolerances};
use msa::io::{read_outputs, Outputs};
use msa::{MsaError, Result};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The outputs under test.
    pub actual: PathBuf,
    /// The expected outputs (e.g. from `--backend cpu`).
    pub expected: PathBuf,
    /// msa (the contract's limits) or strict (tenfold tighter, what the GPU suite uses).
    #[arg(long, default_value = "msa")]
    pub tolerances: String,
}

fn f32s(x: &[half::bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

/// Rows of `[4, T, 16]` selections that differ as sets.
fn selection_rows(a: &[i32], e: &[i32]) -> CheckLine {
    let differ = a
        .chunks(16)
        .zip(e.chunks(16))
        .filter(|(x, y)| {
            let (mut x, mut y) = (x.to_vec(), y.to_vec());
            x.sort_unstable();
            y.sort_unstable();
            x != y
        })
        .count();
    CheckLine {
        tensor: "indexer_topk".into(),
        metric: "rows_differ",
        value: differ as f64,
        limit: 0.0,
        passed: differ == 0 && a.len() == e.len(),
        detail: format!("{} rows", a.len() / 16),
    }
}

/// Element counts of every tensor, for the size check before comparing.
fn lengths(o: &Outputs) -> [(&'static str, Option<usize>); 9] {
    [
        ("out", o.out.as_ref().map(Vec::len)),
        ("lse", o.lse.as_ref().map(Vec::len)),
        ("dq", o.dq.as_ref().map(Vec::len)),
        ("dk", o.dk.as_ref().map(Vec::len)),
        ("dv", o.dv.as_ref().map(Vec::len)),
        ("indexer_topk", o.indexer_topk.as_ref().map(Vec::len)),
        ("indexer_lse", o.indexer_lse.as_ref().map(Vec::len)),
        ("dqi", o.dqi.as_ref().map(Vec::len)),
        ("dki", o.dki.as_ref().map(Vec::len)),
    ]
}

pub fn run(a: &Args) -> Result<ExitCode> {
    let tol = Tolerances::named(&a.tolerances)?;
    let (x, y) = (read_outputs(&a.actual)?, read_outputs(&a.expected)?);
    // Files of different calls (another T or Tk) have no element-wise comparison; the metrics
    // below assume equal lengths, so this is an input error, not a failed check.
    for ((name, n), (_, m)) in lengths(&x).into_iter().zip(lengths(&y)) {
        if let (Some(n), Some(m)) = (n, m) {
            if n != m {
                return Err(MsaError::Invalid(format!(
                    "`{name}` has {n} elements in {} but {m} in {}: the files are outputs of different calls",
                    a.actual.display(),
                    a.expected.display()
                )));
            }
        }
    }
    let mut r = CheckReport::default();
    // A tensor the expected file has and the file under test lacks is a failure, not a skip.
    for ((name, n), (_, m)) in lengths(&x).into_iter().zip(lengths(&y)) {
        if n.is_none() && m.is_some() {
            r.push(CheckLine {
                tensor: name.into(),
                metric: "missing",
                value: 1.0,
                limit: 0.0,
                passed: false,
                detail: format!("absent from {}", a.actual.display()),
            });
        }
    }
    if let (Some(p), Some(q)) = (&x.out, &y.out) {
        r.push(compare::close(
            "out",
            &f32s(p),
            &f32s(q),
            tol.out_atol,
            tol.out_rtol,
        ));
    }
    if let (Some(p), Some(q)) = (&x.lse, &y.lse) {
        r.push(compare::close("lse", p, q, tol.lse_atol, tol.lse_rtol));
    }
    for (name, p, q) in [
        ("dq", &x.dq, &y.dq),
        ("dk", &x.dk, &y.dk),
        ("dv", &x.dv, &y.dv),
    ] {
        if let (Some(p), Some(q)) = (p, q) {
            r.push(compare::attention_grad_cosine(
                name,
                &f32s(p),
                &f32s(q),
                tol.grad_cosine,
            ));
        }
    }
    for (name, p, q) in [("dqi", &x.dqi, &y.dqi), ("dki", &x.dki, &y.dki)] {
        if let (Some(p), Some(q)) = (p, q) {
            r.push(compare::cosine(name, &f32s(p), &f32s(q), tol.grad_cosine));
        }
    }
    if let (Some(p), Some(q)) = (&x.indexer_topk, &y.indexer_topk) {
        r.push(selection_rows(p, q));
    }
    if let (Some(p), Some(q)) = (&x.indexer_lse, &y.indexer_lse) {
        r.push(compare::close(
            "indexer_lse",
            p,
            q,
            tol.indexer_lse_atol,
            tol.indexer_lse_atol,
        ));
    }
    if r.lines.is_empty() {
        return Err(MsaError::Invalid(
            "the two files share no output tensor".into(),
        ));
    }
    println!(
        "{} vs {}: {}",
        a.actual.display(),
        a.expected.display(),
        if r.passed() { "PASS" } else { "FAIL" }
    );
    print!("{}", r.table());
    Ok(if r.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
