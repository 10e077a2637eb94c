//! Property tests over random layouts (documents, CP fragments, odd lengths, single tokens) and
//! random valid selections. Each property is a plain `check_*` function returning the first
//! violation, so the same check runs against the real rule and, in `mutations`, against
//! deliberately broken rules to show the properties can fail.

mod csr;
mod flops;
mod layout_device;
mod mutations;
mod packed;
mod tasks;
mod topk;
mod walk;
mod work;

use crate::testing::LayoutConfig;

/// Layouts for the planner properties: up to 5 documents of up to 1200 tokens, 3 fragments each.
fn config() -> LayoutConfig {
    LayoutConfig::default()
}

/// Turn a failed check into a test failure.
fn ok(r: Result<(), String>) -> Result<(), proptest::test_runner::TestCaseError> {
    r.map_err(proptest::test_runner::TestCaseError::fail)
}
