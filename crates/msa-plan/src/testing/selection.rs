//! Random valid top-k selections and MSA's "recent" pattern.

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

/// MSA's test pattern (`make_torch_topk`): the `min(own+1, 16)` most recent blocks in ascending
/// order, the local block last, then `-1`; the same for every head.
pub fn recent_topk(layout: &VarlenLayout) -> Vec<i32> {
    fill(
        layout,
        |_, p| {
            let own = p / BLOCK_SIZE;
            let lo = (own + 1).saturating_sub(TOPK_BLOCKS);
            (lo..=own).map(|b| b as i32).collect()
        },
        |slots, blocks| slots[..blocks.len()].copy_from_slice(blocks),
    )
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
    use crate::topk::validate_topk;

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

    proptest! {
        #[test]
        fn random_selections_are_valid((l, t) in layouts_with_topk(LayoutConfig::default())) {
            prop_assert_eq!(validate_topk(&l, &t), Ok(()));
        }
    }
}
