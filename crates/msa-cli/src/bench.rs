//! `msa bench`: device-timed medians of every GPU stage on real cases, in useful TFLOP/s under
//! the MSA FLOP model. Correctness is `msa run`'s job; this only times.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args as ClapArgs;
use msa_harness::backend::Backend;
use msa_harness::bench::{self, BenchOptions, Environment, Suite, TimedCase, Weighting, DEV_SUITE};
use msa_harness::cases::{self, CaseSpec, Work};
use msa_harness::io::CallInputs;
use msa_harness::memory::MemoryLimit;
use msa_harness::{Result, Stage};
use msa_plan::flops::FlopModel;
use msa_workloads::RankCase;

use crate::args::named;
use crate::json::{self, JsonLines};
use crate::select::{CaseArgs, Selection};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Cases to time; under a `--pattern` list each case's inputs are generated once.
    #[command(flatten)]
    pub cases: CaseArgs,
    /// A benchmark selection file (weighted case, rank rows of a manifest beside it), or `dev`
    /// for the development benchmark (data/cases/dev_bench.json, 32 rows); replaces --manifest,
    /// --case, --rank and --cases. The summary weighs each row as the file says.
    #[arg(
        long,
        value_name = "dev|FILE",
        value_parser = suite_path,
        conflicts_with_all = ["manifest", "case", "rank", "cases"]
    )]
    pub suite: Option<PathBuf>,
    /// Stages, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "prepare,tables,forward,backward,indexer,selection_lse,kl",
        value_parser = named(Stage::BENCH, |s| s.name().to_string())
    )]
    pub stages: Vec<Stage>,
    /// Untimed calls of each stage before the timed ones.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Timed calls of each stage.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub iters: u32,
    /// Write JSON lines here: the environment, one line per case (every timed call, medians,
    /// MSA's `runtime_ms`/`useful_flops`/`useful_tflops`/`weight`), and a summary per pattern
    /// and stage (`summary_useful_tflops.weighted_aggregate`).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Replace an existing `--json` file (a regular file only, never an input).
    #[arg(long)]
    pub force: bool,
}

fn suite_path(text: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(if text == "dev" { DEV_SUITE } else { text }))
}

/// The cases to time, how each counts in the summary, and the files they are read from.
struct Plan {
    selection: Selection,
    weightings: Vec<Weighting>,
    inputs: Vec<PathBuf>,
}

fn plan(a: &Args) -> Result<Plan> {
    let Some(path) = &a.suite else {
        let selection = a.cases.select()?;
        return Ok(Plan {
            weightings: vec![Weighting::default(); selection.specs.len()],
            selection,
            inputs: vec![a.cases.manifest_path()],
        });
    };
    let suite = Suite::load(path)?;
    let manifest = suite.manifest_path(path);
    let listed = cases::manifest(&manifest)?;
    let pairs: Vec<(u64, u64)> = suite
        .cases
        .iter()
        .map(|r| (r.case_id, r.rank as u64))
        .collect();
    let selection = Selection::new(
        manifest.clone(),
        listed,
        &pairs,
        &a.cases.pattern,
        a.cases.seed,
    )?;
    let weightings = selection
        .specs
        .iter()
        .map(|spec| {
            let row = suite
                .cases
                .iter()
                .find(|r| (r.case_id, r.rank) == (spec.case_id, spec.rank))
                .expect("every spec comes from a row");
            Weighting {
                weight: row.weight,
                stratum: row.stratum.clone(),
                bench_id: Some(row.bench_id),
            }
        })
        .collect();
    Ok(Plan {
        selection,
        weightings,
        inputs: vec![path.clone(), manifest],
    })
}

pub fn run(a: &Args, limit: &MemoryLimit) -> Result<ExitCode> {
    let opts = BenchOptions {
        stages: a.stages.clone(),
        warmup: a.warmup,
        iters: a.iters as usize,
    };
    opts.check()?;
    let plan = plan(a)?;
    let inputs: Vec<&Path> = plan.inputs.iter().map(PathBuf::as_path).collect();
    json::check(a.json.as_deref(), a.force, &inputs)?;
    let backend = Backend::cuda(false)?;
    let backend_name = backend.name();
    eprintln!("backend: {backend_name}");
    let mut json = JsonLines::create(a.json.as_deref(), a.force)?;
    json.write(|| Environment::with_device(0).record())?;
    let selection = &plan.selection;
    let mut rows = Vec::new();
    let mut shares: Vec<(String, f64)> = Vec::new();
    let mut table_shares: Vec<(String, f64)> = Vec::new();
    // The last (case, rank, seed) built, kept while the specs only change its pattern (they are
    // adjacent).
    let mut built: Option<((u64, usize, u64), RankCase, CallInputs)> = None;
    for (spec, weighting) in selection.specs.iter().zip(&plan.weightings) {
        let key = (spec.case_id, spec.rank, spec.seed);
        match &mut built {
            Some((last, rank, p)) if *last == key => {
                p.topk_indices = cases::selection(rank, spec.pattern, spec.seed);
            }
            _ => {
                // The previous case goes first: the memory limit is checked for one case.
                drop(built.take());
                eprintln!("{}: building inputs ...", spec.name());
                let rank = cases::rank_case_within(
                    &selection.listed,
                    spec.case_id,
                    spec.rank,
                    Work::Run,
                    limit,
                )?;
                let p = cases::build(&rank, spec.pattern, spec.seed);
                built = Some((key, rank, p));
            }
        }
        let (_, _, p) = built.as_ref().expect("built above");
        eprintln!(
            "{}: timing {} stages x {} calls ...",
            spec.name(),
            opts.stages.len(),
            opts.warmup + opts.iters
        );
        let times = bench::run(&backend, p, &opts)?;
        print_case(spec, &backend_name, &opts, p, &times);
        let case = TimedCase {
            spec,
            weighting,
            backend: &backend_name,
            layout: &p.layout,
            times: &times,
        };
        json.write(|| case.record(&opts))?;
        rows.extend(case.rows());
        if let Some(share) = share(&times, Stage::Tables, Stage::Backward) {
            table_shares.push((spec.name(), share));
        }
        if let Some(share) = share(&times, Stage::Prepare, Stage::Forward) {
            shares.push((spec.name(), share));
        }
    }
    let summaries = bench::summarize(&rows);
    if selection.specs.len() > 1 {
        print_summary(&summaries);
        print_shares("prepare", "forward", &shares);
        print_shares("tables", "backward", &table_shares);
    }
    for s in &summaries {
        json.write(|| s.record())?;
    }
    Ok(ExitCode::SUCCESS)
}

fn print_case(
    spec: &CaseSpec,
    backend: &str,
    opts: &BenchOptions,
    p: &CallInputs,
    times: &[bench::StageTimes],
) {
    let model = FlopModel::for_layout(&p.layout);
    println!(
        "{} on {backend}: median of {} calls after {} warm-up (T {}, Tk {})",
        spec.name(),
        opts.iters,
        opts.warmup,
        p.layout.total_q(),
        p.layout.total_k()
    );
    println!(
        "  {:<14} {:>10} {:>10} {:>10} {:>9}",
        "stage", "median ms", "min ms", "p90 ms", "TFLOP/s"
    );
    for t in times {
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
    if let Some(share) = share(times, Stage::Prepare, Stage::Forward) {
        println!("  prepare = {share:.1}% of forward");
    }
    if let Some(share) = share(times, Stage::Tables, Stage::Backward) {
        println!("  tables = {share:.1}% of backward");
    }
}

/// `part`'s median as a percentage of `whole`'s, when both were timed (issue 11's target for
/// the unchecked prepare over the forward: at most 5 on every row).
fn share(times: &[bench::StageTimes], part: Stage, whole: Stage) -> Option<f64> {
    let median = |stage| times.iter().find(|t| t.stage == stage).map(|t| t.median());
    Some(100.0 * median(part)? / median(whole)?)
}

/// Every row's share of `part` in `whole` and the largest.
fn print_shares(part: &str, whole: &str, shares: &[(String, f64)]) {
    let Some((worst, max)) = shares.iter().max_by(|a, b| a.1.total_cmp(&b.1)) else {
        return;
    };
    println!("{part} as % of {whole} (medians): max {max:.1} ({worst})");
    for (name, share) in shares {
        println!("  {name:<32} {share:>6.1}");
    }
}

/// Per pattern and stage: MSA's weighted aggregate over the cases' medians.
fn print_summary(summaries: &[bench::Summary]) {
    println!("summary (weighted over the cases' medians; MSA's weighted_aggregate)");
    println!(
        "  {:<12} {:<14} {:>5} {:>16} {:>12}",
        "pattern", "stage", "rows", "weighted ms", "TFLOP/s"
    );
    for s in summaries {
        let rate = s
            .useful_tflops
            .as_ref()
            .map_or(String::new(), |t| format!("{:>12.1}", t.weighted_aggregate));
        println!(
            "  {:<12} {:<14} {:>5} {:>16.3} {rate}",
            s.pattern.to_string(),
            s.stage,
            s.rows,
            s.runtime_ms.weighted_mean
        );
    }
}
