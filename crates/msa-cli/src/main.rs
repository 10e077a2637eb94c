//! `msa`: the command-line front door of msa-rs. Exit codes: 0 pass, 1 a check failed, 2 an
//! error (bad arguments included).

mod args;
mod attention;
mod bench;
mod compare;
mod info;
mod json;
mod plan;
mod run;
mod select;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "msa",
    version,
    about = "MiniMax Sparse Attention (MSA v1) training kernels: plan, run and check"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What is built (features, kernel architectures) and what the device probe sees.
    Info,
    /// Schedule statistics of cases: rows, edges, work items, tasks, bins, grid, FLOPs.
    Plan(plan::Args),
    /// Forward + backward (+ indexer + KL) of cases on a backend, checked with MSA's (or strict) tolerances.
    Run(run::Args),
    /// Attention (and gradients when `dout` is present, indexer when `qi`/`ki` are) of the
    /// tensors in a safetensors file.
    Attention(attention::Args),
    /// Compare two outputs files (e.g. cuda against cpu) under MSA's (or strict) tolerances.
    Compare(compare::Args),
    /// Device-timed medians of every GPU stage on cases, in useful TFLOP/s (MSA FLOP model).
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info => Ok(info::run()),
        Command::Plan(a) => plan::run(&a),
        Command::Run(a) => run::run(&a),
        Command::Attention(a) => attention::run(&a),
        Command::Compare(a) => compare::run(&a),
        Command::Bench(a) => bench::run(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
