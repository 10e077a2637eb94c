//! Which cases a command works on: one (case, rank) or many, from any manifest-format file.

use std::path::PathBuf;

use clap::Args as ClapArgs;
use msa::cases::{self, CaseSpec};
use msa::{MsaError, Result};
use msa_workloads::{CpConfig, DEV_MANIFEST};

#[derive(ClapArgs, Debug, Clone)]
pub struct CaseArgs {
    /// Manifest (MSA's JSONL case format); defaults to the development set in data/cases.
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Case id, or `all` for every case of the manifest.
    #[arg(long, default_value = "434")]
    pub case: String,
    /// CP rank (0..16), a comma list, or `all`.
    #[arg(long, default_value = "0")]
    pub rank: String,
    /// Explicit `case:rank` pairs, comma separated (overrides --case/--rank).
    #[arg(long)]
    pub cases: Option<String>,
    /// Selection pattern, or a comma list (each case runs under each): recent16, indexer,
    /// b0p99, random, spread, pool-N, hot15_tail1, hot8_tail8.
    #[arg(long, default_value = "recent16")]
    pub pattern: String,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

fn parse_list(what: &str, text: &str, all: impl Fn() -> Vec<u64>) -> Result<Vec<u64>> {
    if text == "all" {
        return Ok(all());
    }
    text.split(',')
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .map_err(|_| MsaError::Invalid(format!("{what}: `{s}` is not a number")))
        })
        .collect()
}

impl CaseArgs {
    pub fn manifest_path(&self) -> PathBuf {
        self.manifest
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEV_MANIFEST))
    }

    /// Every (case, rank, pattern) spec selected, the patterns of one (case, rank) adjacent.
    pub fn specs(&self) -> Result<Vec<CaseSpec>> {
        let manifest = self.manifest_path();
        let listed = cases::manifest(&manifest)?;
        let patterns = self
            .pattern
            .split(',')
            .map(|p| cases::pattern(p.trim()))
            .collect::<Result<Vec<_>>>()?;
        let ranks = CpConfig::default().cp_size as u64;
        let pairs: Vec<(u64, u64)> = match &self.cases {
            Some(list) => list
                .split(',')
                .map(|p| {
                    let (c, r) = p.split_once(':').ok_or_else(|| {
                        MsaError::Invalid(format!("--cases: `{p}` is not case:rank"))
                    })?;
                    let num = |s: &str| {
                        s.trim()
                            .parse::<u64>()
                            .map_err(|_| MsaError::Invalid(format!("--cases: `{p}`")))
                    };
                    Ok((num(c)?, num(r)?))
                })
                .collect::<Result<_>>()?,
            None => {
                let case_ids = parse_list("--case", &self.case, || {
                    listed.iter().map(|c| c.case_id).collect()
                })?;
                let rank_ids = parse_list("--rank", &self.rank, || (0..ranks).collect())?;
                case_ids
                    .iter()
                    .flat_map(|&c| rank_ids.iter().map(move |&r| (c, r)))
                    .collect()
            }
        };
        pairs
            .into_iter()
            .flat_map(|pair| patterns.iter().map(move |&pattern| (pair, pattern)))
            .map(|((case_id, rank), pattern)| {
                if !listed.iter().any(|c| c.case_id == case_id) {
                    return Err(MsaError::Invalid(format!(
                        "case {case_id} is not in {}",
                        manifest.display()
                    )));
                }
                if rank >= ranks {
                    return Err(MsaError::Invalid(format!(
                        "rank {rank} is out of range (CP size {ranks})"
                    )));
                }
                Ok(CaseSpec {
                    manifest: manifest.clone(),
                    case_id,
                    rank: rank as usize,
                    pattern,
                    seed: self.seed,
                })
            })
            .collect()
    }
}
