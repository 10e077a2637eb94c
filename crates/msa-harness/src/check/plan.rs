//! Which check a run gets: the CPU backend *is* the reference, so it is spot-checked against the
//! independent f64 oracle; the GPU is checked against the reference, in full on small cases and
//! on a sample of queries and key blocks on large ones.

use msa_plan::flops::sparse_elements;
use msa_plan::VarlenLayout;

use super::{against_oracle, against_reference, CheckReport, Sample, Tolerances};
use crate::backend::{Backend, RunResult};
use crate::error::Result;
use crate::io::CallInputs;

/// How much of a call's outputs a reference check covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Every output element when the case has at most [`FULL_CHECK_MAX_ELEMENTS`] sparse
    /// elements, else a sample.
    Auto,
    Full,
    Sample,
}

/// Sparse elements above which [`Coverage::Auto`] samples: the reference then takes tens of
/// seconds per case on a CI host.
pub const FULL_CHECK_MAX_ELEMENTS: u64 = 4_000_000;

/// Queries and key blocks per group that the f64 oracle spot-checks.
const ORACLE_QUERIES: usize = 12;
const ORACLE_BLOCKS: usize = 2;
/// Key blocks per group of a sampled reference check.
const REFERENCE_BLOCKS: usize = 8;

/// A check of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckPlan {
    /// [`against_oracle`] on a small sample.
    Oracle(Sample),
    /// [`against_reference`], in full or on a sample.
    Reference(Sample),
}

/// The check of a run of `backend` on `layout`. A sampled reference check looks at
/// `sample_queries` queries; `seed` picks the sample.
pub fn plan_for(
    backend: &Backend,
    layout: &VarlenLayout,
    coverage: Coverage,
    sample_queries: usize,
    seed: u64,
) -> CheckPlan {
    if backend.is_cpu() {
        CheckPlan::Oracle(Sample::new(layout, ORACLE_QUERIES, ORACLE_BLOCKS, seed))
    } else {
        reference_plan(layout, coverage, sample_queries, seed)
    }
}

fn reference_plan(
    layout: &VarlenLayout,
    coverage: Coverage,
    sample_queries: usize,
    seed: u64,
) -> CheckPlan {
    let full = match coverage {
        Coverage::Full => true,
        Coverage::Sample => false,
        Coverage::Auto => sparse_elements(layout) <= FULL_CHECK_MAX_ELEMENTS,
    };
    CheckPlan::Reference(if full {
        Sample::full(layout)
    } else {
        Sample::new(layout, sample_queries, REFERENCE_BLOCKS, seed)
    })
}

impl CheckPlan {
    /// What the check compares with, for logs.
    pub fn describe(&self) -> &'static str {
        match self {
            CheckPlan::Oracle(_) => "f64 oracle, spot",
            CheckPlan::Reference(s) if s.is_full() => "reference, full",
            CheckPlan::Reference(_) => "reference, sampled",
        }
    }

    /// Check `run`, the result of a call of `p` with loss coefficient `loss_coeff`.
    pub fn check(
        &self,
        p: &CallInputs,
        run: &RunResult,
        tol: &Tolerances,
        loss_coeff: f32,
    ) -> Result<CheckReport> {
        let kl = run.kl_indexer_lse.as_deref().map(|l| (l, loss_coeff));
        Ok(match self {
            CheckPlan::Oracle(sample) => against_oracle(p, &run.outputs, sample, tol, kl),
            CheckPlan::Reference(sample) => against_reference(p, &run.outputs, sample, tol, kl)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_gets_the_oracle_whatever_the_coverage() {
        let layout = VarlenLayout::documents(&[0, 300]).unwrap();
        for coverage in [Coverage::Auto, Coverage::Full, Coverage::Sample] {
            let plan = plan_for(&Backend::Cpu, &layout, coverage, 64, 1);
            assert_eq!(plan, CheckPlan::Oracle(Sample::new(&layout, 12, 2, 1)));
            assert_eq!(plan.describe(), "f64 oracle, spot");
        }
    }

    #[test]
    fn auto_checks_small_cases_in_full_and_samples_large_ones() {
        let small = VarlenLayout::documents(&[0, 300]).unwrap();
        let large = VarlenLayout::documents(&[0, 40_000]).unwrap();
        assert!(sparse_elements(&large) > FULL_CHECK_MAX_ELEMENTS);
        let auto_small = reference_plan(&small, Coverage::Auto, 64, 1);
        assert_eq!(auto_small, CheckPlan::Reference(Sample::full(&small)));
        assert_eq!(auto_small.describe(), "reference, full");
        let auto_large = reference_plan(&large, Coverage::Auto, 64, 1);
        assert_eq!(
            auto_large,
            CheckPlan::Reference(Sample::new(&large, 64, 8, 1))
        );
        assert_eq!(auto_large.describe(), "reference, sampled");
        assert_eq!(
            reference_plan(&large, Coverage::Full, 64, 1),
            CheckPlan::Reference(Sample::full(&large))
        );
        assert_eq!(
            reference_plan(&small, Coverage::Sample, 64, 1),
            CheckPlan::Reference(Sample::new(&small, 64, 8, 1))
        );
    }
}
