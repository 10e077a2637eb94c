//! A case of the training benchmark as the CLI and the GPU suite build it: one CP16 rank of a
//! real pack from a manifest, a selection pattern and a seed, fully reproducible.

use std::path::{Path, PathBuf};

use msa_plan::topology::BLOCK_SIZE;
use msa_workloads::{
    case_seed, load_manifest, make_topk_in, CpConfig, InputMode, Inputs, Pattern, RankCase,
    RankSplit, RealCase,
};

use crate::error::{HarnessError, Result};
use crate::io::CallInputs;
use crate::memory::{CallShape, MemoryLimit};

/// (manifest, case id, CP rank, pattern, seed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseSpec {
    pub manifest: PathBuf,
    pub case_id: u64,
    pub rank: usize,
    pub pattern: Pattern,
    pub seed: u64,
}

impl CaseSpec {
    /// A short name for logs: `case434/r0/recent16/s0`.
    pub fn name(&self) -> String {
        format!(
            "case{}/r{}/{}/s{}",
            self.case_id, self.rank, self.pattern, self.seed
        )
    }
}

/// The manifest's cases, loaded once per path by the caller.
pub fn manifest(path: &Path) -> Result<Vec<RealCase>> {
    Ok(load_manifest(path)?)
}

/// Rank `rank` of case `case_id` under the CP16 split, its layout not yet built.
fn rank_split(cases: &[RealCase], case_id: u64, rank: usize) -> Result<RankSplit> {
    let case = cases
        .iter()
        .find(|c| c.case_id == case_id)
        .ok_or_else(|| HarnessError::Case {
            id: case_id,
            reason: format!("not in the manifest ({} cases)", cases.len()),
        })?;
    let cfg = CpConfig::default();
    if rank >= cfg.cp_size {
        return Err(HarnessError::Case {
            id: case_id,
            reason: format!("rank {rank} is out of range (CP size {})", cfg.cp_size),
        });
    }
    Ok(case.rank_split(&cfg, rank)?)
}

/// The CP16 rank `rank` of case `case_id` (only that rank is split out).
pub fn rank_case(cases: &[RealCase], case_id: u64, rank: usize) -> Result<RankCase> {
    Ok(rank_split(cases, case_id, rank)?.into_case()?)
}

/// What a command does with a case, for its memory estimate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// The host planner alone (`msa plan`).
    Plan,
    /// Inputs, every stage and the check (`msa run`, `msa bench`).
    Run,
}

/// [`rank_case`], refused before its layout or inputs are built when [`Work`] on it would need
/// more memory than `limit`.
pub fn rank_case_within(
    cases: &[RealCase],
    case_id: u64,
    rank: usize,
    work: Work,
    limit: &MemoryLimit,
) -> Result<RankCase> {
    let split = rank_split(cases, case_id, rank)?;
    // The layout's padded workspace (`VarlenLayout::workspace_rows`).
    let workspace_blocks = (split.total_k() + (split.batch() + 1) * BLOCK_SIZE - 1) / BLOCK_SIZE;
    let shape = CallShape {
        queries: split.total_q() as u64,
        workspace_keys: (workspace_blocks * BLOCK_SIZE) as u64,
        rows: split.total_rows() as u64,
    };
    let need = match work {
        Work::Plan => shape.plan_bytes(),
        Work::Run => shape.run_bytes(),
    };
    limit.check(need, || format!("case {case_id} rank {rank} ({shape})"))?;
    Ok(split.into_case()?)
}

/// Inputs (seeded by `case_seed(case, rank, seed)`, MSA's protocol) and the pattern's selection
/// of one rank.
pub fn build(rank: &RankCase, pattern: Pattern, seed: u64) -> CallInputs {
    build_in(rank, pattern, seed, InputMode::Msa)
}

/// [`build`] with inputs drawn under `mode`; peaked inputs plant their maximum-score keys for
/// the pattern's selection, so a case of another pattern must be built again (not swapped).
pub fn build_in(rank: &RankCase, pattern: Pattern, seed: u64, mode: InputMode) -> CallInputs {
    let layout = rank.layout().clone();
    let s = case_seed(rank.case_id(), rank.rank(), seed);
    let topk = make_topk_in(&layout, pattern, s, mode);
    let mut inputs = Inputs::generate_in(&layout, s, mode);
    if mode == InputMode::Peaked {
        inputs.plant_peaks(&layout, &topk, s);
    }
    CallInputs::generated(layout, inputs, topk)
}

/// The pattern's selection of [`build`]: swapping it into a case built under MSA's protocol
/// gives what `build` would give for that pattern, without generating the inputs again.
pub fn selection(rank: &RankCase, pattern: Pattern, seed: u64) -> Vec<i32> {
    let s = case_seed(rank.case_id(), rank.rank(), seed);
    make_topk_in(rank.layout(), pattern, s, InputMode::Msa)
}
