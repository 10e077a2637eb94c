//! Which check a run gets: the CPU backend *is* the reference, so it is spot-checked against the
//! independent f64 oracle (on as many queries as asked; a full check of the reference against
//! itself means nothing and is refused); the GPU is checked against the reference, in full on
//! small cases and on a sample of queries and key blocks on large ones.

use msa_plan::flops::sparse_elements;
use msa_plan::VarlenLayout;

use super::{against_oracle, against_reference, CheckReport, Sample, Tolerances};
use crate::backend::{Backend, RunResult};
use crate::error::{HarnessError, Result};
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

/// Queries and key blocks per group that the f64 oracle spot-checks unless asked for more.
pub const ORACLE_QUERIES: usize = 12;
const ORACLE_BLOCKS: usize = 2;
/// Key blocks per group of a sampled reference check.
const REFERENCE_BLOCKS: usize = 8;
/// Queries of a sampled reference check unless asked otherwise.
pub const REFERENCE_QUERIES: usize = 256;

/// A check of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckPlan {
    /// [`against_oracle`] on a small sample.
    Oracle(Sample),
    /// [`against_reference`], in full or on a sample.
    Reference(Sample),
}

/// The check of a run of `backend` on `layout`. A sampled check looks at `sample_queries`
/// queries ([`ORACLE_QUERIES`] for the CPU backend's oracle check and [`REFERENCE_QUERIES`] for
/// a GPU's sampled reference check when `None`); `seed` picks the sample.
///
/// The CPU backend is the reference itself: [`Coverage::Full`] would compare it with itself, and
/// the oracle is too slow for every query of a real case, so it is an error
/// ([`HarnessError::CheckCoverage`]), never silently a sample.
pub fn plan_for(
    backend: &Backend,
    layout: &VarlenLayout,
    coverage: Coverage,
    sample_queries: Option<usize>,
    seed: u64,
) -> Result<CheckPlan> {
    if backend.is_cpu() {
        if coverage == Coverage::Full {
            return Err(HarnessError::CheckCoverage(
                "a full check compares every element with the CPU reference, which is the \
                 backend under test; the CPU backend is checked against the independent f64 \
                 oracle on a sample (`--check sample --sample-queries N` checks N queries)",
            ));
        }
        let queries = sample_queries.unwrap_or(ORACLE_QUERIES);
        Ok(CheckPlan::Oracle(Sample::new(
            layout,
            queries,
            ORACLE_BLOCKS,
            seed,
        )))
    } else {
        let queries = sample_queries.unwrap_or(REFERENCE_QUERIES);
        Ok(reference_plan(layout, coverage, queries, seed))
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
    fn the_cpu_gets_the_oracle_on_as_many_queries_as_asked() {
        let layout = VarlenLayout::documents(&[0, 3000]).unwrap();
        for coverage in [Coverage::Auto, Coverage::Sample] {
            let plan = plan_for(&Backend::Cpu, &layout, coverage, None, 1).unwrap();
            assert_eq!(plan, CheckPlan::Oracle(Sample::new(&layout, 12, 2, 1)));
            assert_eq!(plan.describe(), "f64 oracle, spot");
            let plan = plan_for(&Backend::Cpu, &layout, coverage, Some(40), 1).unwrap();
            let CheckPlan::Oracle(sample) = &plan else {
                panic!("{plan:?}")
            };
            assert_eq!(sample.queries.len(), 40);
            assert_eq!(sample, &Sample::new(&layout, 40, 2, 1));
        }
        let err = plan_for(&Backend::Cpu, &layout, Coverage::Full, None, 1).unwrap_err();
        assert!(
            err.to_string()
                .contains("the CPU reference, which is the backend under test"),
            "{err}"
        );
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
