//! The CTA walk of the backward main kernel (docs/contract.md §5.3).
//!
//! The host launches `grid_launch_bound(capacity, num_sms)` CTAs without knowing the task count;
//! the device descriptor holds the exact walk, and each CTA takes the row interval
//! [`cta_row_interval`] gives it (surplus CTAs get an empty one). Full CTAs walk `rows_per_cta`
//! rows; a short tail is spread over at most one extra CTA per SM.

use super::abi::{
    DESC_GRID_CTAS, DESC_NUM_FULL_CTAS, DESC_NUM_TASK_ROWS, DESC_ROWS_PER_CTA, DESC_TAIL_ROWS,
    DESC_WORDS,
};

/// Rows per CTA for small passes.
pub const ROWS_PER_CTA_SMALL: usize = 4;
/// Up to this many task rows the 4-row walk fills the machine better.
pub const ROWS_PER_CTA_SWITCH: usize = 2400;
/// Rows per CTA for large passes (fewer CTA-boundary dK/dV flushes).
pub const ROWS_PER_CTA_LARGE: usize = 64;
/// Tails shorter than this many rows per CTA fall back to plain `rows_per_cta` chunks.
pub const MIN_TAIL_ROWS: usize = 3;

/// Walk length for `num_rows` task rows: 4 up to 2400 rows, else 64.
pub fn rows_per_cta(num_rows: usize) -> usize {
    if num_rows <= ROWS_PER_CTA_SWITCH {
        ROWS_PER_CTA_SMALL
    } else {
        ROWS_PER_CTA_LARGE
    }
}

/// `(num_full_ctas, tail_rows, grid_ctas)` of a walk covering every row once; panics if
/// `rows_per_cta` or `num_sms` is 0.
pub fn chunk_map(num_rows: usize, rows_per_cta: usize, num_sms: usize) -> (usize, usize, usize) {
    assert!(
        rows_per_cta > 0 && num_sms > 0,
        "chunk_map needs rows_per_cta > 0 and num_sms > 0"
    );
    let num_chunks = num_rows.div_ceil(rows_per_cta);
    // A partial chunk cannot join a full wave.
    let num_full = ((num_chunks / num_sms) * num_sms).min(num_rows / rows_per_cta);
    let rows_left = num_rows - num_full * rows_per_cta;
    if rows_left == 0 {
        return (num_full, 1, num_full);
    }
    let tail_rows = rows_left.div_ceil(num_sms);
    if tail_rows < MIN_TAIL_ROWS {
        return (0, rows_per_cta, num_chunks);
    }
    (
        num_full,
        tail_rows,
        num_full + rows_left.div_ceil(tail_rows),
    )
}

/// CTAs to launch so that every task count up to `capacity` fits: full CTAs plus one tail CTA
/// per SM, in whichever walk regime is larger.
pub fn grid_launch_bound(capacity: usize, num_sms: usize) -> usize {
    (capacity.min(ROWS_PER_CTA_SWITCH) / ROWS_PER_CTA_SMALL)
        .max(capacity / ROWS_PER_CTA_LARGE)
        .saturating_add(num_sms)
}

/// One walk: the descriptor words 0..=4 of the task build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtaWalk {
    pub num_rows: usize,
    pub rows_per_cta: usize,
    pub num_full: usize,
    pub tail_rows: usize,
    pub grid: usize,
}

impl CtaWalk {
    /// The walk of `num_rows` task rows on `num_sms` SMs (`rows_per_cta` then `chunk_map`).
    pub fn new(num_rows: usize, num_sms: usize) -> Self {
        let rows_per_cta = rows_per_cta(num_rows);
        let (num_full, tail_rows, grid) = chunk_map(num_rows, rows_per_cta, num_sms);
        Self {
            num_rows,
            rows_per_cta,
            num_full,
            tail_rows,
            grid,
        }
    }

    /// Read the walk from a task-build descriptor (words 0..=4, as the main kernel does).
    pub fn from_desc(desc: &[i32; DESC_WORDS]) -> Self {
        let w = |i: usize| desc[i] as usize;
        Self {
            num_rows: w(DESC_NUM_TASK_ROWS),
            rows_per_cta: w(DESC_ROWS_PER_CTA),
            num_full: w(DESC_NUM_FULL_CTAS),
            tail_rows: w(DESC_TAIL_ROWS),
            grid: w(DESC_GRID_CTAS),
        }
    }
}

/// Task rows `[lo, hi)` of CTA `bidx`: full chunks, then tail chunks, then empty past the grid.
pub fn cta_row_interval(bidx: usize, walk: &CtaWalk) -> (usize, usize) {
    if bidx >= walk.grid {
        return (walk.num_rows, walk.num_rows);
    }
    let lo = if bidx < walk.num_full {
        bidx * walk.rows_per_cta
    } else {
        walk.num_full * walk.rows_per_cta + (bidx - walk.num_full) * walk.tail_rows
    };
    let len = if bidx < walk.num_full {
        walk.rows_per_cta
    } else {
        walk.tail_rows
    };
    (lo, (lo + len).min(walk.num_rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_examples_of_the_spec() {
        let table = [
            (0, 4, (0, 1, 0)),
            (1, 4, (0, 4, 1)),
            (600, 4, (0, 4, 150)),
            (2400, 4, (0, 4, 600)),
            (2401, 64, (0, 17, 142)),
            (10_000, 64, (148, 4, 280)),
            (56_000, 64, (740, 59, 887)),
            (100_000, 64, (1480, 36, 1627)),
        ];
        for (rows, rpc, want) in table {
            assert_eq!(rows_per_cta(rows), rpc, "{rows}");
            assert_eq!(chunk_map(rows, rpc, 148), want, "{rows}");
        }
        assert_eq!(grid_launch_bound(100_000, 148), 1710);
        assert_eq!(grid_launch_bound(0, 148), 148);
    }

    #[test]
    fn intervals_of_a_tail_walk() {
        // 10,000 rows on 148 SMs: 148 CTAs of 64 rows, then 132 tail CTAs of 4 rows.
        let w = CtaWalk::new(10_000, 148);
        assert_eq!(cta_row_interval(0, &w), (0, 64));
        assert_eq!(cta_row_interval(147, &w), (9408, 9472));
        assert_eq!(cta_row_interval(148, &w), (9472, 9476));
        assert_eq!(cta_row_interval(279, &w), (9996, 10_000));
        assert_eq!(cta_row_interval(280, &w), (10_000, 10_000));
        // A partial last tail chunk is clipped: 2401 rows in 142 CTAs of 17.
        let w = CtaWalk::new(2401, 148);
        assert_eq!(cta_row_interval(141, &w), (2397, 2401));
    }

    #[test]
    fn descriptor_round_trip() {
        let w = CtaWalk::new(56_000, 148);
        let desc = [56_000, 64, 740, 59, 887, 9, 56_000, 0];
        assert_eq!(CtaWalk::from_desc(&desc), w);
    }

    #[test]
    #[should_panic(expected = "num_sms > 0")]
    fn zero_sms_is_a_caller_bug() {
        chunk_map(10, 4, 0);
    }
}
