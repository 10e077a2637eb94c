//! Random top-k selections: valid ones ([`random_topk`]) and ones padded with every entry the
//! contract ignores ([`messy_topk`]). MSA's "recent" pattern is [`crate::topk::recent_topk`]
//! (re-exported here), the one copy the workloads' `recent16` uses too.

use proptest::prelude::*;

use super::layouts::{layouts, LayoutConfig};
use super::rng::SplitMix64;
use crate::layout::VarlenLayout;
use crate::topology::{BLOCK_SIZE, NUM_INDEX_HEADS, TOPK_BLOCKS};

/// Fill `[4, T, 16]` by calling `pick(head, query position)` for the valid blocks of each
/// (head, query) and `place` for their slots.
fn fill(
    layout: &VarlenLayout,
    mut pick: impl FnMut(usize, usize) -> Vec<i32>,
    mut place: impl FnMut(&mut [i32], &[i32]),
) -> Vec<i32> {
    let t = layout.total_q();
    let mut topk = vec![-1; NUM_INDEX_HEADS * t * TOPK_BLOCKS];
    for h in 0..NUM_INDEX_HEADS {
        for f in layout.fragments() {
            for i in 0..f.q_len {
                let base = (h * t + f.q_start + i) * TOPK_BLOCKS;
                let blocks = pick(h, f.position(i));
                place(&mut topk[base..base + TOPK_BLOCKS], &blocks);
            }
        }
    }
    topk
}

/// A valid random selection: per (head, query) up to `min(16, own+1)` unique blocks `<= own`
/// (the full count half the time, the local block usually among them), in random slots, `-1`
/// elsewhere. Deterministic in `seed`.
pub fn random_topk(layout: &VarlenLayout, seed: u64) -> Vec<i32> {
    let rng = std::cell::RefCell::new(SplitMix64::new(seed));
    fill(
        layout,
        |_, p| {
            let mut r = rng.borrow_mut();
            let own = p / BLOCK_SIZE;
            let most = TOPK_BLOCKS.min(own + 1);
            let k = if r.chance(1, 2) {
                most
            } else {
                r.below(most + 1)
            };
            let mut blocks = Vec::with_capacity(k);
            if k > 0 && r.chance(4, 5) {
                blocks.push(own as i32);
            }
            while blocks.len() < k {
                let b = r.below(own + 1) as i32;
                if !blocks.contains(&b) {
                    blocks.push(b);
                }
            }
            blocks
        },
        |slots, blocks| {
            let mut r = rng.borrow_mut();
            let mut order: Vec<usize> = (0..TOPK_BLOCKS).collect();
            for i in (1..TOPK_BLOCKS).rev() {
                order.swap(i, r.below(i + 1));
            }
            for (&slot, &b) in order.iter().zip(blocks) {
                slots[slot] = b;
            }
        },
    )
}

/// Random selections in shuffled slots, padded with entries the contract ignores (-1, other
/// negatives, ids past the document, future blocks, duplicates of listed blocks): the local
/// block is sometimes left out and about one row in ten selects nothing valid. Not valid for
/// `prepare` (its validation rejects all but -1); for references, which must ignore them.
/// Deterministic in `seed`.
pub fn messy_topk(layout: &VarlenLayout, seed: u64) -> Vec<i32> {
    let mut rng = SplitMix64::new(seed);
    let t = layout.total_q();
    let mut topk = vec![-1i32; NUM_INDEX_HEADS * t * TOPK_BLOCKS];
    for g in 0..NUM_INDEX_HEADS {
        for f in layout.fragments() {
            for i in 0..f.q_len {
                let local = f.position(i) / BLOCK_SIZE;
                let mut row: Vec<i32> = Vec::new();
                if rng.below(10) != 0 {
                    let mut pool: Vec<i32> = (0..=local as i32).collect();
                    let count = 1 + rng.below(pool.len().min(TOPK_BLOCKS - 2));
                    if rng.below(4) != 0 {
                        row.push(local as i32);
                        pool.pop();
                    }
                    while row.len() < count && !pool.is_empty() {
                        row.push(pool.swap_remove(rng.below(pool.len())));
                    }
                }
                while row.len() < TOPK_BLOCKS {
                    let junk = match rng.below(5) {
                        0 => -1,
                        1 => -1 - rng.below(5) as i32,
                        2 => (f.num_blocks + rng.below(3)) as i32,
                        3 if local + 1 < f.num_blocks => {
                            (local + 1 + rng.below(f.num_blocks - local - 1)) as i32
                        }
                        _ if !row.is_empty() => row[rng.below(row.len())],
                        _ => -1,
                    };
                    row.push(junk);
                }
                for i in (1..row.len()).rev() {
                    row.swap(i, rng.below(i + 1));
                }
                topk[(g * t + f.q_start + i) * TOPK_BLOCKS..][..TOPK_BLOCKS].copy_from_slice(&row);
            }
        }
    }
    topk
}

/// Random layouts paired with a random valid selection for them.
pub fn layouts_with_topk(cfg: LayoutConfig) -> impl Strategy<Value = (VarlenLayout, Vec<i32>)> {
    (layouts(cfg), any::<u64>()).prop_map(|(layout, seed)| {
        let topk = random_topk(&layout, seed);
        (layout, topk)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topk::{recent_topk, validate_topk};

    #[test]
    fn recent_pattern_of_a_long_document() {
        let l = VarlenLayout::documents(&[0, 2200]).unwrap();
        let t = recent_topk(&l);
        assert_eq!(
            &t[..16],
            &[0, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1]
        );
        let last: Vec<i32> = (2..=17).collect();
        assert_eq!(&t[2199 * 16..2200 * 16], &last[..]);
        assert_eq!(validate_topk(&l, &t), Ok(()));
    }

    #[test]
    fn messy_selections_hold_every_ignored_entry() {
        let l = VarlenLayout::new(&[0, 40, 300], &[0, 300, 2600], Some(&[0, 0])).unwrap();
        let topk = messy_topk(&l, 5);
        assert_eq!(topk, messy_topk(&l, 5));
        let t = l.total_q();
        let (mut negative, mut past, mut future, mut duplicate, mut empty) = (0, 0, 0, 0, 0);
        for g in 0..NUM_INDEX_HEADS {
            for q in 0..t {
                let (b, _, p) = l.query_coords(q);
                let n = l.fragment(b).num_blocks as i32;
                let row = &topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS];
                let local = (p / BLOCK_SIZE) as i32;
                negative += row.iter().filter(|&&e| e < -1).count();
                past += row.iter().filter(|&&e| e >= n).count();
                future += row.iter().filter(|&&e| e > local && e < n).count();
                let valid: Vec<i32> = row
                    .iter()
                    .copied()
                    .filter(|e| (0..=local).contains(e))
                    .collect();
                let mut unique = valid.clone();
                unique.sort_unstable();
                unique.dedup();
                duplicate += usize::from(unique.len() < valid.len());
                empty += usize::from(valid.is_empty());
            }
        }
        for (what, n) in [
            ("negatives", negative),
            ("ids past the document", past),
            ("future blocks", future),
            ("rows with duplicates", duplicate),
            ("empty rows", empty),
        ] {
            assert!(n >= 10, "{n} {what}");
        }
        assert!(validate_topk(&l, &topk).is_err());
    }

    proptest! {
        #[test]
        fn random_selections_are_valid((l, t) in layouts_with_topk(LayoutConfig::default())) {
            prop_assert_eq!(validate_topk(&l, &t), Ok(()));
        }
    }
}
