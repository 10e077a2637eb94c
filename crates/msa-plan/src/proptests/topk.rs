//! Validation accepts every valid selection and names exactly the injected fault.

use proptest::prelude::*;

use super::config;
use crate::testing::{layouts_with_topk, SplitMix64};
use crate::topk::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn one_injected_fault_is_reported_where_it_is((l, mut t) in layouts_with_topk(config()), seed in any::<u64>()) {
        prop_assert_eq!(topk_error_word(&l, &t), Ok([0; 4]));
        let mut r = SplitMix64::new(seed);
        let (head, query, slot) = (r.below(4), r.below(l.total_q()), r.below(16));
        let (b, _, p) = l.query_coords(query);
        let (own, nb) = (p / 128, l.fragment(b).num_blocks);
        let base = (head * l.total_q() + query) * 16;
        let entries = t[base..base + 16].to_vec();
        let present = entries.iter().position(|&v| v >= 0).filter(|&s| s != slot);
        let (value, code, at) = match (r.below(4), present) {
            (0, _) => (-2 - r.below(1000) as i32, TOPK_NEGATIVE, slot),
            (1, _) if own + 1 < nb => ((own + 1 + r.below(nb - own - 1)) as i32, TOPK_NON_CAUSAL, slot),
            (2, Some(s)) => (entries[s], TOPK_DUPLICATE, s.max(slot)),
            _ => ((nb + r.below(100)) as i32, TOPK_OUT_OF_RANGE, slot),
        };
        t[base + slot] = value;
        let offender = t[base + at];
        prop_assert_eq!(topk_error_word(&l, &t), Ok([code, head as i32, query as i32, at as i32]));
        match validate_topk(&l, &t) {
            Err(crate::PlanError::TopK { head: h, query: q, slot: s, value: v, .. }) => {
                prop_assert_eq!((h, q, s, v), (head, query, at, offender));
            }
            other => prop_assert!(false, "expected a TopK error, got {:?}", other),
        }
    }
}
