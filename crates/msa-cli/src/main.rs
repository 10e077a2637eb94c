//! `msa`: the command-line front door of msa-rs. Exit codes: 0 pass, 1 a check failed, 2 an
//! error (bad arguments included).

mod args;
mod attention;
mod bench;
mod compare;
mod info;
mod json;
#[cfg(feature = "msa")]
mod nccl_lib;
mod plan;
mod run;
mod run_cp;
mod select;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use msa_harness::memory::MemoryLimit;

#[derive(Parser)]
#[command(
    name = "msa",
    version,
    about = "MiniMax Sparse Attention (MSA v1) training kernels: plan, run and check"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Most memory a command plans to hold, in bytes or with a K, M, G or T suffix (binary);
    /// cases and files that would need more are refused before anything is built. Default: 3/4
    /// of what this process may use (available memory, cgroup limit, `ulimit -v`).
    #[arg(
        long,
        global = true,
        env = "MSA_MEMORY_LIMIT",
        value_name = "BYTES",
        value_parser = args::bytes
    )]
    memory_limit: Option<u64>,
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
    let limit = cli
        .memory_limit
        .map_or_else(MemoryLimit::host, MemoryLimit::given);
    let result = match cli.command {
        Command::Info => Ok(info::run()),
        Command::Plan(a) => plan::run(&a, &limit),
        Command::Run(a) => run::run(&a, &limit),
        Command::Attention(a) => attention::run(&a, &limit),
        Command::Compare(a) => compare::run(&a, &limit),
        Command::Bench(a) => bench::run(&a, &limit),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
