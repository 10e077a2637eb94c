//! The closed-form element counts agree with per-query sums on random layouts.

use proptest::prelude::*;

use super::config;
use crate::flops::{causal_elements, selected_elements, sparse_elements};
use crate::testing::{layouts, recent_topk};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn closed_forms_match_per_query_sums(l in layouts(crate::testing::LayoutConfig { max_doc_len: 6000, ..config() })) {
        let positions = (0..l.total_q()).map(|q| l.query_coords(q).2 as u64);
        let (s, c) = positions.fold((0u64, 0u64), |(s, c), p| (s + (p + 1).min(1920 + p % 128 + 1), c + p + 1));
        prop_assert_eq!(sparse_elements(&l), s);
        prop_assert_eq!(causal_elements(&l), c);
        // MSA's recent pattern attends exactly S elements.
        prop_assert_eq!(selected_elements(&l, &recent_topk(&l)).unwrap(), s);
    }
}
