//! The claim order of the persistent sm_90a kernels on random cost lists: a permutation whose
//! tail is the shortest items longest first, just long enough, and claims never worse than one
//! item over the mean.

use proptest::prelude::*;

use crate::lpt::{claim_order, claimed_imbalance, LPT_BINS};

/// Whether `order` lists each of `0..n` exactly once.
fn is_permutation(order: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    order.len() == n
        && order
            .iter()
            .all(|&i| i < n && !std::mem::replace(&mut seen[i], true))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn claim_order_is_the_given_order_then_a_just_long_enough_tail(
        costs in prop::collection::vec(0usize..300, 0..1500),
        grid in 1usize..200,
    ) {
        let n = costs.len();
        let order = claim_order(&costs, grid);
        prop_assert!(is_permutation(&order, n), "not a permutation of 0..{}: {:?}", n, order);
        let c = |i: usize| costs[i].min(LPT_BINS - 1);
        // The spec: the stable longest-first order's shortest suffix whose costs reach grid x
        // the longest cost / 2 (all of it when none does) goes last in that order, the rest
        // first in id order.
        let mut by_cost: Vec<usize> = (0..n).collect();
        by_cost.sort_by_key(|&i| (std::cmp::Reverse(c(i)), i));
        let need = grid * by_cost.first().map_or(0, |&i| c(i)) / 2;
        let tail = (0..=n)
            .find(|&m| by_cost[n - m..].iter().map(|&i| c(i)).sum::<usize>() >= need)
            .unwrap_or(n);
        let mut head: Vec<usize> = by_cost[..n - tail].to_vec();
        head.sort();
        prop_assert_eq!(&order[..n - tail], &head[..]);
        prop_assert_eq!(&order[n - tail..], &by_cost[n - tail..]);
        if tail > 0 && tail < n {
            prop_assert!(head.iter().all(|&i| c(i) >= c(order[n - tail])));
        }
    }

    #[test]
    fn claims_end_within_one_item_of_the_mean(
        costs in prop::collection::vec(1usize..LPT_BINS, 1..1500),
        grid in 1usize..200,
    ) {
        // Greedy list scheduling: the last CTA to finish started its last item no later than
        // the mean, so it ends within the longest item of it.
        let g = grid.min(costs.len());
        let total: usize = costs.iter().sum();
        let max = *costs.iter().max().unwrap();
        let worst = claimed_imbalance(&costs, grid) * total as f64 / g as f64;
        prop_assert!(worst <= total as f64 / g as f64 + max as f64 + 1e-9, "{} {}", worst, total);
    }

    #[test]
    fn the_devices_bin_walk_finds_the_same_tail(
        costs in prop::collection::vec(0usize..300, 0..1500),
        grid in 1usize..200,
    ) {
        // common/lpt_order.cuh claim_order: from the counting sort's bin ends (bin b holds cost
        // LPT_BINS - 1 - b), whole bins from the cheapest while their mass stays short of the
        // need, then ceil((need - mass) / c) of the next bin's last items.
        let n = costs.len();
        let mut count = [0usize; LPT_BINS];
        for &x in &costs {
            count[LPT_BINS - 1 - x.min(LPT_BINS - 1)] += 1;
        }
        let end: Vec<usize> = count.iter().scan(0, |acc, &k| { *acc += k; Some(*acc) }).collect();
        let top = (0..LPT_BINS).find(|&b| end[b] > 0);
        let need = top.map_or(0, |b| grid * (LPT_BINS - 1 - b) / 2);
        let (mut head, mut mass) = (n, 0usize);
        let mut b = LPT_BINS;
        while b > 0 && mass < need {
            b -= 1;
            let begin = if b > 0 { end[b - 1] } else { 0 };
            let c = LPT_BINS - 1 - b;
            let bin_mass = c * (end[b] - begin);
            if mass + bin_mass < need {
                mass += bin_mass;
                head = begin;
            } else {
                head = end[b] - (need - mass).div_ceil(c);
                mass = need;
            }
        }
        // The same head as the spec's shortest suffix, and so the same list.
        let c = |i: usize| costs[i].min(LPT_BINS - 1);
        let mut by_cost: Vec<usize> = (0..n).collect();
        by_cost.sort_by_key(|&i| (std::cmp::Reverse(c(i)), i));
        let spec_tail = (0..=n)
            .find(|&m| by_cost[n - m..].iter().map(|&i| c(i)).sum::<usize>() >= need)
            .unwrap_or(n);
        prop_assert_eq!(head, n - spec_tail);
        let order = claim_order(&costs, grid);
        prop_assert_eq!(&order[head..], &by_cost[head..]);
        prop_assert!(order[..head].windows(2).all(|w| w[0] < w[1]));
    }
}
