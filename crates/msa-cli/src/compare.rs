//! `msa compare`: two outputs files (say `--backend cuda` against `--backend cpu`) under MSA's
//! tolerances (or the strict set, `--tolerances strict`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args as ClapArgs;
use msa_harness::check::against_outputs;
use msa_harness::io::read_outputs_within;
use msa_harness::memory::MemoryLimit;
use msa_harness::Result;

use crate::args::TolerancesArg;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// The outputs under test.
    pub actual: PathBuf,
    /// The expected outputs (e.g. from `--backend cpu`).
    pub expected: PathBuf,
    /// The limits of every check.
    #[arg(long, value_enum, default_value_t = TolerancesArg::Msa)]
    pub tolerances: TolerancesArg,
}

pub fn run(a: &Args, limit: &MemoryLimit) -> Result<ExitCode> {
    let x = read_outputs_within(&a.actual, limit)?;
    let y = read_outputs_within(&a.expected, limit)?;
    let r = against_outputs(&x, &y, &a.tolerances.tolerances())?;
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
