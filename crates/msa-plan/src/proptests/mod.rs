//! Property tests over random layouts (documents, CP fragments, odd lengths, single tokens) and
//! random valid selections. Each property is a plain `check_*` function returning the first
//! violation, so the same check runs against the real rule and, in `mutations`, against
//! deliberately broken rules to show the properties can fail.

mod csr;
mod flops;
mod layout_device;
mod lpt;
mod mutations;
mod packed;
mod prepare_device;
mod tasks;
mod topk;
mod walk;
mod work;

use crate::testing::LayoutConfig;

/// Layouts for the planner properties: up to 4 documents of up to 4,500 tokens (35 blocks:
/// selections of 16 out of more than 16 visible blocks, so rows are really sparse), 3 fragments
/// each.
fn config() -> LayoutConfig {
    LayoutConfig {
        max_documents: 4,
        max_doc_len: 4500,
        ..LayoutConfig::default()
    }
}

#[test]
fn the_planner_properties_see_documents_longer_than_16_blocks() {
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config {
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = crate::testing::layouts_with_topk(config());
    let (mut long, mut sparse) = (0, 0);
    for _ in 0..200 {
        let (l, topk) = strategy.new_tree(&mut runner).unwrap().current();
        long += usize::from(l.max_blocks() > 16);
        // A query that sees more than 16 blocks and selects some but not all of them.
        let t = l.total_q();
        sparse += usize::from((0..t).any(|q| {
            let own = l.query_coords(q).2 / crate::topology::BLOCK_SIZE;
            let row = &topk[q * crate::topology::TOPK_BLOCKS..][..crate::topology::TOPK_BLOCKS];
            own >= 16 && row.iter().filter(|&&e| e >= 0).count() > 1
        }));
    }
    assert!(
        long >= 60,
        "{long} of 200 layouts have a document over 16 blocks"
    );
    assert!(
        sparse >= 40,
        "{sparse} of 200 layouts select sparsely from over 16 blocks"
    );
}

/// Turn a failed check into a test failure.
fn ok(r: Result<(), String>) -> Result<(), proptest::test_runner::TestCaseError> {
    r.map_err(proptest::test_runner::TestCaseError::fail)
}
