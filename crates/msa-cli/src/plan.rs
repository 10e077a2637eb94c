//! `msa plan`: schedule statistics of cases from the host planner alone (no GPU needed).

use std::process::ExitCode;

use clap::Args as ClapArgs;
use msa_harness::cases::{self, Work};
use msa_harness::memory::MemoryLimit;
use msa_harness::Result;
use msa_plan::backward::{build_backward_tasks, MsaBackwardSchedule};
use msa_plan::csr::build_k2q_csr;
use msa_plan::flops::{causal_elements, selected_elements, sparse_elements, FlopModel};
use msa_plan::schedule::{balanced_target_q_per_cta, build_work_items, flat_schedule_capacity};
use msa_plan::topk::validate_topk;

use crate::select::CaseArgs;

#[derive(ClapArgs, Debug)]
pub struct Args {
    #[command(flatten)]
    pub cases: CaseArgs,
    /// SM count the schedules are planned for (132 on an H200).
    #[arg(long, default_value_t = 132, value_parser = clap::value_parser!(u32).range(1..=MAX_SMS))]
    pub sms: u32,
}

/// The most SMs a plan is made for: far beyond any GPU, and small enough that no schedule
/// arithmetic on it can overflow.
const MAX_SMS: i64 = 65_536;

pub fn run(a: &Args, limit: &MemoryLimit) -> Result<ExitCode> {
    let sms = a.sms as usize;
    let selection = a.cases.select()?;
    println!(
        "{:<28} {:>6} {:>7} {:>5} {:>6} {:>8} {:>6} {:>7} {:>7} {:>6} {:>5} {:>6} {:>7} {:>7}",
        "case",
        "T",
        "Tk",
        "frags",
        "rows",
        "edges",
        "target",
        "work",
        "tasks",
        "bins",
        "flags",
        "grid",
        "fwd_TF",
        "bwd_TF"
    );
    for spec in &selection.specs {
        eprintln!("planning {} ...", spec.name());
        let rank = cases::rank_case_within(
            &selection.listed,
            spec.case_id,
            spec.rank,
            Work::Plan,
            limit,
        )?;
        let layout = rank.layout();
        let topk = cases::selection(&rank, spec.pattern, spec.seed);
        validate_topk(layout, &topk)?;
        let csr = build_k2q_csr(layout, &topk)?;
        let target = balanced_target_q_per_cta(layout.total_q(), sms);
        let items = build_work_items(layout, &csr, target)?;
        let capacity = flat_schedule_capacity(layout.total_rows(), layout.total_q(), target);
        let schedule = MsaBackwardSchedule::from_plan(layout, &csr, &items, capacity)?;
        let tasks =
            build_backward_tasks(&schedule, layout.total_q(), layout.workspace_rows(), sms)?;
        let edges: usize = (0..4)
            .map(|h| csr.row_ptr[h * (layout.total_rows() + 1) + layout.total_rows()] as usize)
            .sum();
        let s = sparse_elements(layout);
        let flops = FlopModel::from_elements(s, causal_elements(layout));
        println!(
            "{:<28} {:>6} {:>7} {:>5} {:>6} {:>8} {:>6} {:>7} {:>7} {:>6} {:>5} {:>6} {:>7.3} {:>7.3}",
            spec.name(),
            layout.total_q(),
            layout.total_k(),
            layout.batch(),
            layout.total_rows(),
            edges,
            target,
            items.len(),
            tasks.num_tasks(),
            tasks.sizes.bins,
            tasks.desc[7],
            tasks.grid_launch,
            flops.fwd / 1e12,
            flops.bwd / 1e12
        );
        eprintln!(
            "  S {s} (selected {}), C {}, indexer {:.3} TFLOP, KL {:.3} TFLOP, physical blocks {}, max K {}, walk {:?}",
            selected_elements(layout, &topk)?,
            causal_elements(layout),
            flops.indexer / 1e12,
            flops.kl / 1e12,
            layout.padded_kv_blocks(),
            layout.max_seqlen_k(),
            tasks.walk()
        );
    }
    Ok(ExitCode::SUCCESS)
}
