//! Work lists of the persistent sm_90a kernels whose CTAs claim items as they free up (first
//! item by CTA index, later ones from a counter): such a kernel balances itself, so its list can
//! follow another key (the backward's query bands, for L2 reuse; the forward's natural order).
//! [`claim_order`] keeps the list in that order except a longest-first tail of the shortest
//! items, which evens out the CTAs' last claims; the device builds the same list
//! (`kernels/src/common/lpt_order.cuh`) word for word with a stable counting sort over
//! [`LPT_BINS`] cost values. [`claimed_imbalance`] and [`imbalance`] are what `msa plan` prints.

/// Distinct costs the order separates; larger costs share the last bin (abi.h `MSA_LPT_BINS`).
pub const LPT_BINS: usize = 129;

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
    fn claims_balance_a_skewed_list_that_striding_does_not() {
        // Every third item long: striding over 3 CTAs puts all of them on CTA 0; claims in the
        // same order end within one long item of each other.
        let costs: Vec<usize> = (0..300).map(|i| if i % 3 == 0 { 100 } else { 5 }).collect();
        assert!(imbalance(&costs, 3) > 2.0);
        let claimed = claimed_imbalance(&costs, 3);
        assert!(claimed < 1.02, "{claimed}");
    }
}
