//! `msa run`: cases on a backend, checked with MSA's tolerances against the CPU reference (GPU
//! backend) or against an independent f64 oracle (CPU backend); `check::plan_for` decides.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args as ClapArgs;
use msa_harness::backend::RunOptions;
use msa_harness::cases::{self, Work};
use msa_harness::check::{plan_for, CheckReport};
use msa_harness::memory::MemoryLimit;
use msa_harness::Result;
use msa_plan::flops::FlopModel;
use msa_workloads::InputMode;

use crate::args::{BackendArg, CheckArg, InputsArg, TolerancesArg};
use crate::json::{self, JsonLines};
use crate::run_cp::CpTransport;
use crate::select::CaseArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    pub cases: CaseArgs,
    /// Where the call runs.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Also run the indexer forward.
    #[arg(long)]
    pub indexer: bool,
    /// Also run the selection LSE and the KL backward.
    #[arg(long)]
    pub kl: bool,
    /// Bitwise-repeatable backward.
    #[arg(long)]
    pub deterministic: bool,
    /// How much of the outputs a GPU run's reference check covers. The CPU backend is the
    /// reference: it gets the f64 oracle's check on a sample (`auto`, `sample`), and `full` is
    /// refused for it.
    #[arg(long, value_enum, default_value_t = CheckArg::Auto)]
    pub check: CheckArg,
    /// Queries in a sampled check: against the reference on the GPU (default 256), against the
    /// f64 oracle on the CPU (default 12).
    #[arg(long)]
    pub sample_queries: Option<usize>,
    #[arg(long, default_value_t = 1.0)]
    pub loss_coeff: f32,
    /// The limits of every check.
    #[arg(long, value_enum, default_value_t = TolerancesArg::Msa)]
    pub tolerances: TolerancesArg,
    /// How inputs are drawn, comma separated; each case runs under each.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "msa")]
    pub inputs: Vec<InputsArg>,
    /// Write every result (checks, times, FLOPs) as JSON lines here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Replace an existing `--json` file (a regular file only, never the manifest).
    #[arg(long)]
    pub force: bool,
    /// Context parallelism over N ranks: each selected pack whole (`--rank` is not used) split
    /// into 1,024-token chunks dealt to N ranks by MSA's dispatch; every rank runs its local
    /// call with K/V (and KI) all-gathered and its key gradients reduce-scattered (summed in
    /// f32, rounded once), and the assembled outputs are checked against the single call over
    /// the whole pack on the same backend (`--tolerances`), with the communication timed
    /// beside the kernels. The pack's tokens must split into N·1,024-token units.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub cp: Option<u16>,
    /// How the CP ranks communicate (with `--cp`).
    #[arg(long, value_enum, default_value_t = CpTransport::Auto, requires = "cp")]
    pub cp_transport: CpTransport,
    /// Keep the first N tokens of each pack (with `--cp`; a multiple of cp·1,024), e.g. for the
    /// CPU reference, which takes minutes per 196,608-token pack.
    #[arg(long, value_name = "N", requires = "cp")]
    pub pack_tokens: Option<usize>,
}

/// `  12.3 TFLOP/s (MSA FLOP model)` for `flops` done in `ms`, or GFLOP/s below a TFLOP/s.
fn rate(flops: f64, ms: f64) -> String {
    let tflops = flops / ms / 1e9;
    if tflops >= 1.0 {
        format!("  {tflops:.1} TFLOP/s (MSA FLOP model)")
    } else {
        format!("  {:.1} GFLOP/s (MSA FLOP model)", tflops * 1e3)
    }
}

pub fn run(a: &Args, limit: &MemoryLimit) -> Result<ExitCode> {
    if let Some(cp) = a.cp {
        return crate::run_cp::run(a, cp as usize, limit);
    }
    let tol = a.tolerances.tolerances();
    json::check(a.json.as_deref(), a.force, &[&a.cases.manifest_path()])?;
    let selection = a.cases.select()?;
    let backend = a.backend.open(true)?;
    eprintln!("backend: {}", backend.name());
    let opts = RunOptions {
        backward: true,
        indexer: a.indexer,
        kl: a.kl,
        deterministic: a.deterministic,
        loss_coeff: a.loss_coeff,
    };
    let mut json = JsonLines::create(a.json.as_deref(), a.force)?;
    let runs: Vec<_> = selection
        .specs
        .iter()
        .flat_map(|spec| a.inputs.iter().map(move |inputs| (spec, inputs.mode())))
        .collect();
    let mut failed = 0;
    for &(spec, mode) in &runs {
        let t0 = Instant::now();
        // MSA's protocol keeps the case's plain name; other inputs are named after it.
        let name = match mode {
            InputMode::Msa => spec.name(),
            _ => format!("{}/{mode}", spec.name()),
        };
        eprintln!("{name}: building inputs ...");
        let rank =
            cases::rank_case_within(&selection.listed, spec.case_id, spec.rank, Work::Run, limit)?;
        let p = cases::build_in(&rank, spec.pattern, spec.seed, mode);
        // Planned before the run: a check the backend cannot have fails before any work.
        let plan = a
            .check
            .coverage()
            .map(|coverage| plan_for(&backend, &p.layout, coverage, a.sample_queries, spec.seed))
            .transpose()?;
        eprintln!("{name}: running on {} ...", backend.name());
        let result = backend.run(&p, &opts)?;
        let report = match plan {
            None => CheckReport::default(),
            Some(plan) => {
                eprintln!("{name}: checking ({}) ...", plan.describe());
                plan.check(&p, &result, &tol, a.loss_coeff)?
            }
        };
        let flops = FlopModel::for_layout(&p.layout);
        println!(
            "{name} on {}: {}",
            backend.name(),
            if report.passed() { "PASS" } else { "FAIL" }
        );
        print!("{}", report.table());
        for st in &result.times {
            let rate = st
                .stage
                .flops(&flops)
                .map_or(String::new(), |f| rate(f, st.ms));
            println!("  time {:<14} {:>10.2} ms{rate}", st.stage, st.ms);
        }
        println!("  total {:.1} s", t0.elapsed().as_secs_f64());
        failed += !report.passed() as usize;
        json.write(|| {
            serde_json::json!({
                "case": name, "inputs": mode.name(), "backend": backend.name(), "passed": report.passed(),
                "lines": report.lines, "times": result.times,
                "flops": {"fwd": flops.fwd, "bwd": flops.bwd, "indexer": flops.indexer, "kl": flops.kl},
            })
        })?;
    }
    if runs.len() > 1 {
        println!("{} of {} cases passed", runs.len() - failed, runs.len());
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
