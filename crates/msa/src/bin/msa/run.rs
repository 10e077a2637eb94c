//! `msa run`: cases on a backend, checked with MSA's tolerances against the CPU reference (GPU
//! backend) or against an independent f64 oracle (CPU backend).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args as ClapArgs;
use msa::backend::{Backend, BackendChoice, RunOptions};
use msa::cases;
use msa::check::{against_oracle, against_reference, CheckReport, Sample, Tolerances};
use msa::{MsaError, Result};
use msa_plan::flops::{sparse_elements, FlopModel};

use crate::select::CaseArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    pub cases: CaseArgs,
    /// auto (GPU if available), cpu or cuda.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Also run the indexer forward.
    #[arg(long)]
    pub indexer: bool,
    /// Also run the KL backward.
    #[arg(long)]
    pub kl: bool,
    /// Bitwise-repeatable backward.
    #[arg(long)]
    pub deterministic: bool,
    /// auto, full, sample or none: how much of the output the check covers (auto: full when
    /// the case is small, else a sample of queries and key blocks).
    #[arg(long, default_value = "auto")]
    pub check: String,
    /// Queries in a sampled check against the reference (the CPU backend's f64 spot check
    /// always looks at 12).
    #[arg(long, default_value_t = 256)]
    pub sample_queries: usize,
    #[arg(long, default_value_t = 1.0)]
    pub loss_coeff: f32,
    /// msa (the contract's limits) or strict (tenfold tighter, what the GPU suite uses).
    #[arg(long, default_value = "msa")]
    pub tolerances: String,
    /// Write every result (checks, times, FLOPs) as JSON lines here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Sparse elements above which `--check auto` samples instead of checking everything.
const FULL_CHECK_MAX_ELEMENTS: u64 = 4_000_000;

pub fn run(a: &Args) -> Result<ExitCode> {
    if !matches!(a.check.as_str(), "auto" | "full" | "sample" | "none") {
        return Err(MsaError::Invalid(format!(
            "unknown --check `{}` (auto, full, sample, none)",
            a.check
        )));
    }
    let tol = Tolerances::named(&a.tolerances)?;
    let specs = a.cases.specs()?;
    let choice: BackendChoice = a.backend.parse()?;
    let (backend, note) = Backend::open(choice, true)?;
    if let Some(note) = note {
        eprintln!("{note}");
    }
    eprintln!("backend: {}", backend.name());
    let opts = RunOptions {
        backward: true,
        indexer: a.indexer,
        kl: a.kl,
        deterministic: a.deterministic,
        loss_coeff: a.loss_coeff,
    };
    let listed = cases::manifest(&a.cases.manifest_path())?;
    let mut json = match &a.json {
        Some(p) => Some(std::fs::File::create(p)?),
        None => None,
    };
    let mut failed = 0;
    for spec in &specs {
        let t0 = Instant::now();
        eprintln!("{}: building inputs ...", spec.name());
        let p = cases::build(
            &cases::rank_case(&listed, spec.case_id, spec.rank)?,
            spec.pattern,
            spec.seed,
        );
        eprintln!("{}: running on {} ...", spec.name(), backend.name());
        let result = backend.run(&p, &opts)?;
        let s = sparse_elements(&p.layout);
        let report = match a.check.as_str() {
            "none" => CheckReport::default(),
            mode => {
                let full = mode == "full" || (mode == "auto" && s <= FULL_CHECK_MAX_ELEMENTS);
                eprintln!(
                    "{}: checking ({}) ...",
                    spec.name(),
                    if backend.is_cpu() {
                        "f64 oracle, spot"
                    } else if full {
                        "reference, full"
                    } else {
                        "reference, sampled"
                    }
                );
                if backend.is_cpu() {
                    let sample = Sample::new(&p.layout, 12, 2, spec.seed);
                    against_oracle(&p, &result.outputs, &sample, &tol, a.loss_coeff)
                } else {
                    let sample = if full {
                        Sample::full(&p.layout)
                    } else {
                        Sample::new(&p.layout, a.sample_queries, 8, spec.seed)
                    };
                    let kl = result.kl_indexer_lse.as_deref().map(|l| (l, a.loss_coeff));
                    against_reference(&p, &result.outputs, &sample, &tol, kl)?
                }
            }
        };
        let flops = FlopModel::from_elements(s, msa_plan::flops::causal_elements(&p.layout));
        println!(
            "{} on {}: {}",
            spec.name(),
            backend.name(),
            if report.passed() { "PASS" } else { "FAIL" }
        );
        print!("{}", report.table());
        for st in &result.times {
            let work = match st.stage {
                "forward" => flops.fwd,
                "backward" => flops.bwd,
                "indexer" => flops.indexer,
                "kl_backward" => flops.kl,
                _ => 0.0,
            };
            let tflops = work / st.ms / 1e9;
            let rate = if work == 0.0 {
                String::new()
            } else if tflops >= 1.0 {
                format!("  {tflops:.1} TFLOP/s (MSA FLOP model)")
            } else {
                format!("  {:.1} GFLOP/s (MSA FLOP model)", tflops * 1e3)
            };
            println!("  time {:<14} {:>10.2} ms{rate}", st.stage, st.ms);
        }
        println!("  total {:.1} s", t0.elapsed().as_secs_f64());
        failed += !report.passed() as usize;
        if let Some(f) = json.as_mut() {
            let line = serde_json::json!({
                "case": spec.name(), "backend": backend.name(), "passed": report.passed(),
                "lines": report.lines, "times": result.times,
                "flops": {"fwd": flops.fwd, "bwd": flops.bwd, "indexer": flops.indexer, "kl": flops.kl},
            });
            writeln!(f, "{line}")?;
        }
    }
    if specs.len() > 1 {
        println!("{} of {} cases passed", specs.len() - failed, specs.len());
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
