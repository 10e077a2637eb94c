//! Which cases a command works on: one (case, rank) or many, from any manifest-format file.

use std::path::PathBuf;

use clap::Args as ClapArgs;
use msa_harness::cases::{self, CaseSpec};
use msa_harness::{HarnessError, Result};
use msa_workloads::{CpConfig, Pattern, RealCase, DEV_MANIFEST};

use crate::args::named;

/// A case id or CP rank, or every one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    All,
    One(u64),
}

fn case_id(text: &str) -> Result<Pick, String> {
    match text {
        "all" => Ok(Pick::All),
        _ => text
            .parse()
            .map(Pick::One)
            .map_err(|_| "expected a case id or `all`".to_string()),
    }
}

fn cp_rank(text: &str) -> Result<u64, String> {
    let cp_size = CpConfig::default().cp_size as u64;
    match text.parse::<u64>() {
        Ok(r) if r < cp_size => Ok(r),
        Ok(r) => Err(format!("rank {r} is out of range (CP size {cp_size})")),
        Err(_) => Err(format!("expected a rank below {cp_size}")),
    }
}

fn rank(text: &str) -> Result<Pick, String> {
    match text {
        "all" => Ok(Pick::All),
        _ => cp_rank(text).map(Pick::One),
    }
}

/// One `case:rank` pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaseRank {
    pub case_id: u64,
    pub rank: u64,
}

fn case_rank(text: &str) -> Result<CaseRank, String> {
    let (c, r) = text
        .split_once(':')
        .ok_or_else(|| "expected case:rank".to_string())?;
    let case_id = c.parse().map_err(|_| format!("`{c}` is not a case id"))?;
    Ok(CaseRank {
        case_id,
        rank: cp_rank(r)?,
    })
}

#[derive(ClapArgs, Debug, Clone)]
pub struct CaseArgs {
    /// Manifest (MSA's JSONL case format); defaults to the development set in data/cases.
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Case ids, comma separated, or `all` for every case of the manifest.
    #[arg(long, value_delimiter = ',', default_value = "434", value_parser = case_id)]
    pub case: Vec<Pick>,
    /// CP ranks (0..16), comma separated, or `all`.
    #[arg(long, value_delimiter = ',', default_value = "0", value_parser = rank)]
    pub rank: Vec<Pick>,
    /// Explicit `case:rank` pairs, comma separated (override --case/--rank).
    #[arg(long, value_delimiter = ',', value_parser = case_rank)]
    pub cases: Vec<CaseRank>,
    /// Selection patterns, comma separated; each case runs under each.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "recent16",
        value_parser = named(Pattern::all(), |p| p.to_string())
    )]
    pub pattern: Vec<Pattern>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// The selected cases and the manifest they come from.
pub struct Selection {
    pub listed: Vec<RealCase>,
    /// Every (case, rank, pattern), the patterns of one (case, rank) adjacent.
    pub specs: Vec<CaseSpec>,
}

/// Every id of `picks`, or `all()` when one of them is `all`.
fn ids(picks: &[Pick], all: impl Fn() -> Vec<u64>) -> Vec<u64> {
    let mut out = Vec::with_capacity(picks.len());
    for pick in picks {
        match pick {
            Pick::All => return all(),
            Pick::One(id) => out.push(*id),
        }
    }
    out
}

impl CaseArgs {
    /// The manifest the cases come from.
    pub fn manifest_path(&self) -> PathBuf {
        self.manifest
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEV_MANIFEST))
    }

    /// Load the manifest and list every selected case; a case it does not have is an error.
    pub fn select(&self) -> Result<Selection> {
        let manifest = self.manifest_path();
        let listed = cases::manifest(&manifest)?;
        let pairs: Vec<(u64, u64)> = if self.cases.is_empty() {
            let case_ids = ids(&self.case, || listed.iter().map(|c| c.case_id).collect());
            let ranks = ids(&self.rank, || {
                (0..CpConfig::default().cp_size as u64).collect()
            });
            case_ids
                .iter()
                .flat_map(|&c| ranks.iter().map(move |&r| (c, r)))
                .collect()
        } else {
            self.cases.iter().map(|p| (p.case_id, p.rank)).collect()
        };
        Selection::new(manifest, listed, &pairs, &self.pattern, self.seed)
    }
}

impl Selection {
    /// Every (case, rank) of `pairs` under each of `patterns`, from the cases `listed` in
    /// `manifest`; a case it does not have is an error.
    pub fn new(
        manifest: PathBuf,
        listed: Vec<RealCase>,
        pairs: &[(u64, u64)],
        patterns: &[Pattern],
        seed: u64,
    ) -> Result<Self> {
        let mut specs = Vec::with_capacity(pairs.len() * patterns.len());
        for &(case_id, rank) in pairs {
            if !listed.iter().any(|c| c.case_id == case_id) {
                return Err(HarnessError::Case {
                    id: case_id,
                    reason: format!("not in {}", manifest.display()),
                });
            }
            specs.extend(patterns.iter().map(|&pattern| CaseSpec {
                manifest: manifest.clone(),
                case_id,
                rank: rank as usize,
                pattern,
                seed,
            }));
        }
        Ok(Self { listed, specs })
    }
}
