//! The CTA walk covers every task row exactly once, and its grid fits the launch bound.

use proptest::prelude::*;

use super::ok;
use crate::backward::walk::{
    chunk_map, cta_row_interval, grid_launch_bound, rows_per_cta, CtaWalk,
};

/// The three rules the walk is built from, so checks can run on mutated copies.
#[derive(Clone, Copy)]
pub(super) struct WalkRule {
    pub chunk_map: fn(usize, usize, usize) -> (usize, usize, usize),
    pub interval: fn(usize, &CtaWalk) -> (usize, usize),
    pub bound: fn(usize, usize) -> usize,
}

pub(super) const REAL: WalkRule = WalkRule {
    chunk_map,
    interval: cta_row_interval,
    bound: grid_launch_bound,
};

fn walk_of(rule: &WalkRule, num_rows: usize, num_sms: usize) -> CtaWalk {
    let rows_per_cta = rows_per_cta(num_rows);
    let (num_full, tail_rows, grid) = (rule.chunk_map)(num_rows, rows_per_cta, num_sms);
    CtaWalk {
        num_rows,
        rows_per_cta,
        num_full,
        tail_rows,
        grid,
    }
}

/// Launch `bound(capacity)` CTAs over a walk of `num_rows <= capacity` rows: the grid fits the
/// launch, full CTAs walk exactly `rows_per_cta` rows, tail CTAs at most `tail_rows`, and the
/// non-empty intervals tile `[0, num_rows)` exactly once.
pub(super) fn check_walk(
    rule: &WalkRule,
    num_rows: usize,
    capacity: usize,
    num_sms: usize,
) -> Result<(), String> {
    let w = walk_of(rule, num_rows, num_sms);
    let launch = (rule.bound)(capacity, num_sms);
    if w.grid > launch {
        return Err(format!(
            "{w:?}: grid exceeds the launch bound {launch} of capacity {capacity}"
        ));
    }
    let mut spans = Vec::new();
    for bidx in 0..launch {
        let (lo, hi) = (rule.interval)(bidx, &w);
        if lo > hi || hi > num_rows {
            return Err(format!("{w:?}: CTA {bidx} has interval [{lo}, {hi})"));
        }
        if bidx < w.num_full && hi - lo != w.rows_per_cta {
            return Err(format!("{w:?}: full CTA {bidx} walks [{lo}, {hi})"));
        }
        if bidx >= w.num_full && hi - lo > w.tail_rows {
            return Err(format!("{w:?}: tail CTA {bidx} walks [{lo}, {hi})"));
        }
        if lo < hi {
            spans.push((lo, hi, bidx));
        }
    }
    spans.sort_unstable();
    let mut next = 0;
    for (lo, hi, bidx) in spans {
        if lo != next {
            return Err(format!(
                "{w:?}: CTA {bidx} starts at {lo}, rows from {next} are {}",
                if lo > next { "dropped" } else { "walked twice" }
            ));
        }
        next = hi;
    }
    if next != num_rows {
        return Err(format!("{w:?}: rows [{next}, {num_rows}) are dropped"));
    }
    Ok(())
}

/// Every count up to `capacity` launches at most `grid_launch_bound(capacity)` CTAs; the bound
/// grows with the capacity, so it suffices that each count fits its own bound.
pub(super) fn check_bound(rule: &WalkRule, num_rows: usize, num_sms: usize) -> Result<(), String> {
    let w = walk_of(rule, num_rows, num_sms);
    let bound = (rule.bound)(num_rows, num_sms);
    if w.grid > bound {
        return Err(format!(
            "{w:?}: grid exceeds grid_launch_bound({num_rows}, {num_sms}) = {bound}"
        ));
    }
    Ok(())
}

const SMS: [usize; 9] = [1, 2, 3, 5, 16, 78, 132, 148, 200];

#[test]
fn walk_covers_every_small_count_exactly_once() {
    for sms in SMS {
        for rows in 0..=5000 {
            check_walk(&REAL, rows, rows, sms).unwrap();
        }
    }
}

#[test]
fn grid_fits_the_bound_for_every_count() {
    for sms in SMS {
        for rows in 0..=300_000 {
            check_bound(&REAL, rows, sms).unwrap();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn walk_covers_every_row_exactly_once(rows in 0usize..200_000, extra in 0usize..50_000, sms in 1usize..=200) {
        ok(check_walk(&REAL, rows, rows + extra, sms))?;
    }

    #[test]
    fn grid_fits_the_bound_of_any_larger_capacity(rows in 0usize..2_000_000, extra in 0usize..100_000, sms in 1usize..=200) {
        ok(check_bound(&REAL, rows, sms))?;
        let w = CtaWalk::new(rows, sms);
        prop_assert!(w.grid <= grid_launch_bound(rows + extra, sms));
    }
}
