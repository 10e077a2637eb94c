//! `msa plan`: schedule statistics of cases from the host planner alone (no GPU needed).

use std::process::ExitCode;

use clap::Args as ClapArgs;
use msa_harness::cases::{self, Work};
use msa_harness::memory::MemoryLimit;
use msa_harness::Result;
use msa_plan::backward::kv_items::{backward_grid, build_kv_items, item_tiles, kv_item_capacity};
use msa_plan::backward::{build_backward_tasks, MsaBackwardSchedule};
use msa_plan::csr::{build_k2q_csr, build_physical_csr};
use msa_plan::flops::{causal_elements, selected_elements, sparse_elements, FlopModel};
use msa_plan::lpt::{claimed_imbalance, imbalance};
use msa_plan::schedule::{balanced_target_q_per_cta, build_work_items, flat_schedule_capacity};
use msa_plan::tiles::tile_union_sizes;
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
        let (bwd, fwd) = sm90_balance(layout, &topk, sms)?;
        eprintln!(
            "  sm_90a most-loaded CTA / mean, natural order -> run order: forward {:.3} -> {:.3}, backward {:.3} -> {:.3}",
            fwd.0, fwd.1, bwd.0, bwd.1
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

/// An item's K/V load and dK/dV store in the balance estimate, in tiles of the main kernel.
const ITEM_OVERHEAD_TILES: usize = 2;

/// The sm_90a kernels' balance over their persistent grids: the most-loaded CTA's cost over the
/// mean when the CTAs stride over the work in natural order, and as the kernels run it (the
/// backward's CTAs claim its items in the claim order, the forward's in natural order:
/// `msa_plan::lpt`); (backward, forward). Costs: an item's tiles plus its K/V load and
/// dK/dV store (`ITEM_OVERHEAD_TILES`), a forward tile's union size plus 1.
fn sm90_balance(
    layout: &msa_plan::VarlenLayout,
    topk: &[i32],
    sms: usize,
) -> Result<((f64, f64), (f64, f64))> {
    let csr = build_physical_csr(layout, topk)?;
    let grid = backward_grid(kv_item_capacity(csr.blocks, csr.total_q), sms);
    let items = build_kv_items(&csr, grid);
    let run: Vec<usize> = (0..items.count)
        .map(|p| {
            item_tiles((items.items[p * 4 + 3] - items.items[p * 4 + 2]) as usize)
                + ITEM_OVERHEAD_TILES
        })
        .collect();
    let mut natural = vec![0; items.count];
    for (p, &id) in items.order.iter().enumerate() {
        natural[id as usize] = run[p];
    }
    let bwd = (imbalance(&natural, grid), claimed_imbalance(&run, grid));
    let sizes = tile_union_sizes(layout, topk);
    let fgrid = sizes.len().min(sms).max(1);
    let natural: Vec<usize> = sizes.iter().map(|&u| u + 1).collect();
    let fwd = (
        imbalance(&natural, fgrid),
        claimed_imbalance(&natural, fgrid),
    );
    Ok((bwd, fwd))
}
