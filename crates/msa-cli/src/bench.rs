//! `msa bench`: device-timed medians of every GPU stage on real cases, in useful TFLOP/s under
//! the MSA FLOP model. Correctness is `msa run`'s job; this only times.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args as ClapArgs;
use msa_harness::backend::Backend;
use msa_harness::bench::{self, BenchOptions};
use msa_harness::cases::{self, CaseSpec, Work};
use msa_harness::io::CallInputs;
use msa_harness::memory::MemoryLimit;
use msa_harness::{Result, Stage};
use msa_plan::flops::FlopModel;

use crate::args::named;
use crate::json::{self, JsonLines};
use crate::select::CaseArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Cases to time; under a `--pattern` list each case's inputs are generated once.
    #[command(flatten)]
    pub cases: CaseArgs,
    /// Stages, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "prepare,forward,backward,indexer,selection_lse,kl",
        value_parser = named(Stage::BENCH, |s| s.name().to_string())
    )]
    pub stages: Vec<Stage>,
    /// Untimed calls of each stage before the timed ones.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Timed calls of each stage.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Write one JSON line per case (every timed call, medians, FLOPs) here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Replace an existing `--json` file (a regular file only, never the manifest).
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: &Args, limit: &MemoryLimit) -> Result<ExitCode> {
    let opts = BenchOptions {
        stages: a.stages.clone(),
        warmup: a.warmup,
        iters: a.iters as usize,
    };
    opts.check()?;
    let selection = a.cases.select()?;
    json::check(a.json.as_deref(), a.force, &[&a.cases.manifest_path()])?;
    let backend = Backend::cuda(false)?;
    eprintln!("backend: {}", backend.name());
    let mut json = JsonLines::create(a.json.as_deref(), a.force)?;
    // The last case built, kept while the specs only change its pattern (they are adjacent).
    let mut built: Option<(CaseSpec, CallInputs)> = None;
    for spec in &selection.specs {
        let rank =
            cases::rank_case_within(&selection.listed, spec.case_id, spec.rank, Work::Run, limit)?;
        let p = match &mut built {
            Some((last, p))
                if (last.case_id, last.rank, last.seed) == (spec.case_id, spec.rank, spec.seed) =>
            {
                p.topk_indices = cases::selection(&rank, spec.pattern, spec.seed);
                p
            }
            _ => {
                eprintln!("{}: building inputs ...", spec.name());
                let p = cases::build(&rank, spec.pattern, spec.seed);
                &mut built.insert((spec.clone(), p)).1
            }
        };
        eprintln!(
            "{}: timing {} stages x {} calls ...",
            spec.name(),
            opts.stages.len(),
            opts.warmup + opts.iters
        );
        let times = bench::run(&backend, p, &opts)?;
        let model = FlopModel::for_layout(&p.layout);
        println!(
            "{} on {}: median of {} calls after {} warm-up (T {}, Tk {})",
            spec.name(),
            backend.name(),
            opts.iters,
            opts.warmup,
            p.layout.total_q(),
            p.layout.total_k()
        );
        println!(
            "  {:<14} {:>10} {:>10} {:>10} {:>9}",
            "stage", "median ms", "min ms", "p90 ms", "TFLOP/s"
        );
        for t in &times {
            let rate = t
                .tflops(&model)
                .map_or(String::new(), |r| format!("{r:>9.1}"));
            println!(
                "  {:<14} {:>10.3} {:>10.3} {:>10.3} {rate}",
                t.stage,
                t.median(),
                t.min(),
                t.quantile(0.9)
            );
        }
        json.write(|| {
            let stages: Vec<_> = times
                .iter()
                .map(|t| {
                    serde_json::json!({
                        "stage": t.stage, "median_ms": t.median(), "min_ms": t.min(),
                        "p90_ms": t.quantile(0.9), "tflops": t.tflops(&model), "ms": t.ms,
                    })
                })
                .collect();
            serde_json::json!({
                "case": spec.name(), "backend": backend.name(), "warmup": opts.warmup,
                "iters": opts.iters, "T": p.layout.total_q(), "Tk": p.layout.total_k(),
                "flops": {"fwd": model.fwd, "bwd": model.bwd, "indexer": model.indexer, "kl": model.kl},
                "stages": stages,
            })
        })?;
    }
    Ok(ExitCode::SUCCESS)
}
