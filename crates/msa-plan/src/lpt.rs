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
//!
//! A kernel whose CTAs claim items as they free up (first item by CTA index, later ones from a
//! counter) balances itself, so its list can follow another key (the backward's query bands, for
//! L2 reuse): [`claim_order`] keeps the list in that order except a longest-first tail of the
//! shortest items, which evens out the CTAs' last claims.

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

/// `order[p]` = the item claimed at list position `p` by `grid` CTAs: the `costs` are in the
/// preferred order; a tail of the shortest items (the last in the stable longest-first order),
/// just long enough that their costs add up to `grid` times half the longest item's, goes to the
/// end, longest first, and the others keep their order. When the head runs out, the CTAs'
/// finishing times lie within the longest item, half of it behind the last on average; a tail of
/// that mass per CTA, dealt longest first, levels them. (A fixed count per CTA left short-document
/// ranks, whose tails are all short items, 1.18x the mean in `msa plan`, against the snake's
/// 1.13x; a whole longest item per CTA balanced as well as half of one but gave up L2 reuse:
/// `scripts/analysis/bwd_order_l2.py`.)
pub fn claim_order(costs: &[usize], grid: usize) -> Vec<usize> {
    let n = costs.len();
    let cost = |i: usize| costs[i].min(LPT_BINS - 1);
    let mut by_cost: Vec<usize> = (0..n).collect();
    by_cost.sort_by_key(|&i| std::cmp::Reverse(cost(i)));
    let need = grid * by_cost.first().map_or(0, |&i| cost(i)) / 2;
    let (mut head, mut mass) = (n, 0);
    while head > 0 && mass < need {
        head -= 1;
        mass += cost(by_cost[head]);
    }
    let mut in_tail = vec![false; n];
    for &i in &by_cost[head..] {
        in_tail[i] = true;
    }
    let mut order: Vec<usize> = (0..n).filter(|&i| !in_tail[i]).collect();
    order.extend_from_slice(&by_cost[head..]);
    order
}

/// The most-loaded CTA's total over the mean when `grid` CTAs claim the list in order: CTA `c`
/// takes position `c`, then each position goes to the CTA that frees first (the lower index on a
/// tie).
pub fn claimed_imbalance(costs_in_order: &[usize], grid: usize) -> f64 {
    let g = grid.min(costs_in_order.len()).max(1);
    let mut free: std::collections::BinaryHeap<std::cmp::Reverse<(usize, usize)>> =
        (0..g).map(|c| std::cmp::Reverse((0, c))).collect();
    let mut load = vec![0usize; g];
    for &cost in costs_in_order {
        let std::cmp::Reverse((at, c)) = free.pop().expect("g > 0 CTAs");
        load[c] = at + cost;
        free.push(std::cmp::Reverse((load[c], c)));
    }
    let total: usize = costs_in_order.iter().sum();
    if total == 0 {
        return 1.0;
    }
    *load.iter().max().unwrap() as f64 * g as f64 / total as f64
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
    fn claim_order_keeps_the_given_order_before_a_longest_first_tail_of_the_shortest() {
        let costs = [3, 7, 1, 7, 9, 1, 2];
        // Longest first: 4 (9), 1 3 (7), 0 (3), 6 (2), 2 5 (1). One CTA needs a tail of mass
        // 9 / 2 = 4: 5, 2, 6 (1 + 1 + 2); the head keeps 0, 1, 3, 4 in their order.
        assert_eq!(claim_order(&costs, 1), vec![0, 1, 3, 4, 6, 2, 5]);
        // Two CTAs need 9: 5, 2, 6, 0 (7 < 9) and 3; the head keeps 1 and 4.
        assert_eq!(claim_order(&costs, 2), vec![1, 4, 3, 0, 6, 2, 5]);
        assert!(claim_order(&[], 4).is_empty());
        assert_eq!(claim_order(&[0, 0, 0], 3), vec![0, 1, 2]);
        // Costs past the bins count as the top bin.
        assert_eq!(claim_order(&[500, 1, 128], 1), vec![0, 2, 1]);
    }

    #[test]
    fn claims_go_to_the_cta_that_frees_first() {
        // 2 CTAs: 0 takes 10, 1 takes 1, then 1 takes the rest as it frees first.
        assert_eq!(claimed_imbalance(&[10, 1, 1, 1, 1], 2), 10.0 * 2.0 / 14.0);
        // Short items first leave the long ones to decide the end (42 of a mean 34.5); the claim
        // order moves the short ones and one long one (mass 8 + 10 >= 2 x 10 / 2) to a tail: 40.
        let costs: Vec<usize> = [vec![1; 8], vec![10; 13]].concat();
        assert_eq!(claimed_imbalance(&costs, 4), 42.0 * 4.0 / 138.0);
        let claimed: Vec<usize> = claim_order(&costs, 2).iter().map(|&i| costs[i]).collect();
        assert_eq!(claimed, [vec![10; 13], vec![1; 8]].concat());
        assert!(claimed_imbalance(&claimed, 4) < claimed_imbalance(&costs, 4));
        assert_eq!(claimed_imbalance(&[], 3), 1.0);
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
