//! The run order of the persistent sm_90a kernels on random cost lists: a permutation, largest
//! first with ties in id order once the snake is unwound, and every CTA within one item of every
//! other when the costs fit the bins.

use proptest::prelude::*;

use crate::lpt::{lpt_order, snake_position, LPT_BINS};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn order_is_a_stable_longest_first_permutation(
        costs in prop::collection::vec(0usize..300, 0..1500),
        grid in 1usize..200,
    ) {
        let n = costs.len();
        let order = lpt_order(&costs, grid);
        let mut seen = vec![false; n];
        for &i in &order {
            prop_assert!(i < n && !seen[i], "item {} twice or out of range", i);
            seen[i] = true;
        }
        // Unwound from the snake, the list is sorted by clamped cost, descending, ties by id.
        let key = |i: usize| (std::cmp::Reverse(costs[i].min(LPT_BINS - 1)), i);
        let sorted: Vec<usize> = (0..n).map(|j| order[snake_position(j, n, grid)]).collect();
        prop_assert!(sorted.windows(2).all(|w| key(w[0]) < key(w[1])));
    }

    #[test]
    fn every_cta_is_within_one_item_of_every_other(
        costs in prop::collection::vec(0usize..LPT_BINS, 1..1500),
        grid in 1usize..200,
    ) {
        let order = lpt_order(&costs, grid);
        let g = grid.min(costs.len());
        let mut load = vec![0usize; g];
        for (p, &i) in order.iter().enumerate() {
            load[p % grid] += costs[i];
        }
        let (lo, hi) = (load.iter().min().unwrap(), load.iter().max().unwrap());
        prop_assert!(hi - lo <= *costs.iter().max().unwrap(), "loads {:?}", load);
    }
}
