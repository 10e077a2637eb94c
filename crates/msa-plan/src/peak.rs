//! Where peaked test inputs plant their maximum-score key (docs/contract.md §7.3).
//!
//! MSA's input protocol (q, k ~ N(0, 0.2²)) gives scores with a standard deviation of about 0.04:
//! every softmax is nearly uniform, so a kernel that forgets the online-softmax rescale, reads
//! the wrong group or the wrong block still lands within the tolerances. Peaked inputs draw
//! q and k with std [`PEAKED_STD`] (scores of std ≈ 2.25) and add [`PEAK_WEIGHT`]·k[r*] to the
//! queries of each (query, group), which lifts the score of one key r* by about 12.7 (the other
//! scores then have a std of about 2.5): r* is the maximum-score key of about 97% of the
//! (query, head) rows of a 2,048-key set and carries most of their probability mass. r* sits in the
//! *latest selected block below the query's own block* (the own block when nothing else is
//! selected), so a kernel that walks the blocks in ascending order meets the maximum late, and one
//! that starts at the diagonal block (FlashAttention's order) meets it second: either way the
//! running maximum jumps and the accumulator must be rescaled.

use crate::layout::VarlenLayout;
use crate::topology::{BLOCK_SIZE, TOPK_BLOCKS};

/// Std of q, k, qi and ki in peaked inputs (v and dout keep MSA's scales).
pub const PEAKED_STD: f64 = 1.5;

/// The planted key's share: each query row of group g gets `PEAK_WEIGHT · k[r*, g]` added (the
/// index query `PEAK_WEIGHT · ki[r*]`), a score lift of `PEAK_WEIGHT · ‖k‖² / √128 ≈ 12.7`.
pub const PEAK_WEIGHT: f64 = 0.5;

/// The packed key row planted for (packed query `t`, group `g`) under `topk` (`[4, T, 16]`): a
/// key of the latest valid selected block below the query's own block, else of the own block
/// (visible keys only); `pick` chooses the key inside the block (`pick mod` its visible keys).
/// `None` when the query's token set is empty.
pub fn peak_key(
    layout: &VarlenLayout,
    topk: &[i32],
    t: usize,
    g: usize,
    pick: u64,
) -> Option<usize> {
    let (b, _, p) = layout.query_coords(t);
    let f = layout.fragment(b);
    let own = p / BLOCK_SIZE;
    let row = &topk[(g * layout.total_q() + t) * TOPK_BLOCKS..][..TOPK_BLOCKS];
    let valid = |e: &i32| *e >= 0 && (*e as usize) <= own;
    let earlier = row
        .iter()
        .filter(|e| valid(e) && (**e as usize) < own)
        .max();
    let block = match earlier {
        Some(&e) => e as usize,
        None if row.iter().any(valid) => own,
        None => return None,
    };
    let first = block * BLOCK_SIZE;
    let visible = (p + 1 - first).min(BLOCK_SIZE);
    Some(f.k_base + first + (pick % visible as u64) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_is_in_the_latest_earlier_block_or_the_own_block() {
        // One document of 1,000 keys; queries at positions 990 (own block 7) and 5 (block 0).
        let l = VarlenLayout::new(&[0, 1, 2], &[0, 991, 1000], Some(&[0, 0])).unwrap();
        let t = l.total_q();
        assert_eq!(t, 2);
        let mut topk = vec![-1; 4 * t * TOPK_BLOCKS];
        topk[..4].copy_from_slice(&[7, 2, 5, 9]); // query 0, group 0: 9 is past the document
        topk[(t + 1) * TOPK_BLOCKS..][..2].copy_from_slice(&[7, 3]); // query 1, group 1: local
        let key = peak_key(&l, &topk, 0, 0, 1000).unwrap();
        assert_eq!((key / 128, key % 128), (5, 1000 % 128));
        assert_eq!(peak_key(&l, &topk, 0, 1, 3), None, "empty set");
        // Query 1 sits at 999 in block 7; block 3 is earlier, 7 its own.
        assert_eq!(peak_key(&l, &topk, 1, 1, 0), Some(384));
        // Only the own block: a visible key of it (position 990 sees keys 896..=990).
        topk[..4].copy_from_slice(&[7, -1, -1, -1]);
        for pick in 0..300 {
            let key = peak_key(&l, &topk, 0, 0, pick).unwrap();
            assert!((896..=990).contains(&key), "{key}");
        }
    }
}
