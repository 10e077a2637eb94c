//! Longest-first static schedules for persistent kernels whose `G` CTAs stride over a work list
//! (position `p` runs on CTA `p % G`). Listing the work in its natural order (head-major, blocks
//! ascending) left the most-loaded CTA 1.2–1.6× the mean on the development ranks' backward
//! items; this order brings it to ~1.01 (`msa plan` prints both). The device builds the same order
//! (`kernels/src/common/lpt_order.cuh`) word for word.
//!
//! The rule: sort the items by cost, largest first, ties in index order (a stable counting sort
//! over [`LPT_BINS`] cost values), then deal the sorted list to the CTAs in a snake (round `r`
//! goes to CTAs `0..G` when `r` is even and `G-1..0` when odd; a last partial round of `m` items
//! is reversed within its `m`), so each CTA's total is close to the mean.

/// Distinct costs the order separates; larger costs share the last bin (abi.h `MSA_LPT_BINS`).
pub const LPT_BINS: usize = 129;

/// List position of the `j`-th largest of `n` items on `grid` CTAs.
pub fn snake_position(j: usize, n: usize, grid: usize) -> usize {
    let (r, c) = (j / grid, j % grid);
    let start = r * grid;
    let m = grid.min(n - start);
    start + if r % 2 == 1 { m - 1 - c } else { c }
}

/// `order[p]` = the item run at list position `p`, for items of the given costs on `grid` CTAs.
pub fn lpt_order(costs: &[usize], grid: usize) -> Vec<usize> {
    assert!(grid > 0, "at least one CTA");
    let n = costs.len();
    let mut by_cost: Vec<usize> = (0..n).collect();
    by_cost.sort_by_key(|&i| std::cmp::Reverse(costs[i].min(LPT_BINS - 1)));
    let mut order = vec![0; n];
    for (j, &i) in by_cost.iter().enumerate() {
        order[snake_position(j, n, grid)] = i;
    }
    order
}

/// The most-loaded CTA's total over the mean when position `p` runs on CTA `p % grid`.
pub fn imbalance(costs_in_order: &[usize], grid: usize) -> f64 {
    let g = grid.min(costs_in_order.len()).max(1);
    let mut load = vec![0usize; g];
    for (p, &c) in costs_in_order.iter().enumerate() {
        load[p % g] += c;
    }
    let total: usize = load.iter().sum();
    if total == 0 {
        return 1.0;
    }
    *load.iter().max().unwrap() as f64 * g as f64 / total as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_positions_are_a_permutation_for_every_partial_round() {
        for grid in [1, 2, 5, 132] {
            for n in 0..3 * grid + 2 {
                let mut seen = vec![false; n];
                for j in 0..n {
                    let p = snake_position(j, n, grid);
                    assert!(!seen[p], "n {n} grid {grid}: {p} twice");
                    seen[p] = true;
                }
            }
        }
        // Round 1 of 3 CTAs runs backwards, round 2 forwards; a last partial odd round of 2 is
        // reversed within itself.
        let pos: Vec<usize> = (0..8).map(|j| snake_position(j, 8, 3)).collect();
        assert_eq!(pos, vec![0, 1, 2, 5, 4, 3, 6, 7]);
        let pos: Vec<usize> = (0..5).map(|j| snake_position(j, 5, 3)).collect();
        assert_eq!(pos, vec![0, 1, 2, 4, 3]);
    }

    #[test]
    fn order_is_longest_first_stable_and_dealt_in_a_snake() {
        let costs = [3, 7, 7, 1, 500, 3, 2];
        let order = lpt_order(&costs, 3);
        // Sorted: 500 (the top bin) id 4, 7 ids 1 2, 3 ids 0 5, 2 id 6, 1 id 3.
        // Positions: j 0..2 -> 0 1 2, j 3..5 -> 5 4 3, j 6 -> 6.
        assert_eq!(order, vec![4, 1, 2, 6, 5, 0, 3]);
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..costs.len()).collect::<Vec<_>>());
    }

    #[test]
    fn order_balances_a_skewed_list_that_striding_does_not() {
        // Every third item long: striding over 3 CTAs puts all of them on CTA 0.
        let costs: Vec<usize> = (0..300).map(|i| if i % 3 == 0 { 100 } else { 5 }).collect();
        let grid = 3;
        assert!(imbalance(&costs, grid) > 2.0);
        let order = lpt_order(&costs, grid);
        let ordered: Vec<usize> = order.iter().map(|&i| costs[i]).collect();
        assert!(
            imbalance(&ordered, grid) < 1.02,
            "{}",
            imbalance(&ordered, grid)
        );
    }
}
