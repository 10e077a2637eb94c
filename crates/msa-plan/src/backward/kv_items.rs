//! Work items of the sm_90a KV-outer backward (kernels/src/attention/backward_sm90.cuh): each row
//! of the physical CSR (one (head, physical block) pair) cut into items of at most
//! [`KV_ITEM_QUERIES`] consecutive entries; item ids count them in head-major, block-ascending
//! order. A row cut into several items gets a slot of the fp32 dK/dV accumulator (slots numbered
//! in the same order; the deterministic mode gives each of its items a part of its own instead,
//! numbered in id order, and sums a row's parts in that order); a row that fits one item is
//! written in bf16 by that item. The main kernel's CTAs claim the items as they free up (the first
//! by CTA index, then from a counter), so the list needs no static balance and follows the L2:
//! items by [`item_band`] (head, then where the first query lies), so the items in flight together
//! gather the same queries' Q and dO and add into the same dQ rows, except a tail of the shortest,
//! longest first, whose tiles add up to the grid times half the longest item's
//! ([`crate::lpt::claim_order`]), which evens out the last claims. (Until session 12 the CTAs strode over a longest-first snake
//! whose cost ties the bands broke: spread's long items then ran far from their queries'
//! neighbours.) The device item build
//! (`backward_items_kernel`) computes the same tables word for word.

use crate::csr::PhysicalCsr;
use crate::lpt::claim_order;
use crate::topology::{NUM_KV_HEADS, TOPK_BLOCKS};

/// CSR entries (queries) per tile of the main kernel (abi.h `MSA_KV_TILE_QUERIES`).
pub const TILE_QUERIES: usize = 4;

/// Persistent CTAs of the main kernel (`backward_grid`): one per SM, at most one per item slot.
pub fn backward_grid(item_capacity: usize, sms: usize) -> usize {
    item_capacity.min(sms)
}

/// Most CSR entries (selecting queries) one item takes: 128 tiles of 4 queries (abi.h
/// `MSA_KV_ITEM_QUERIES`).
pub const KV_ITEM_QUERIES: usize = 512;

/// The item tables of one physical CSR (int32, the device ABI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvItems {
    /// `[capacity, 4]`: `(head, physical block, first entry, end entry)` per list position (the
    /// claim order); rows past `count` are 0.
    pub items: Vec<i32>,
    /// Items in use.
    pub count: usize,
    /// CTAs the run order's tail is made for.
    pub grid: usize,
    /// `[count]`: the item id at each list position.
    pub order: Vec<i32>,
    /// `[4, P]`: the dK/dV accumulator slot of a row split over items, else -1.
    pub split_slot: Vec<i32>,
    /// Slots in use.
    pub slots: usize,
    /// `[4, P]`: the first dK/dV part of a row split over items (the deterministic mode: its items
    /// hold parts `first..first + items`), else -1.
    pub split_part: Vec<i32>,
    /// Parts in use.
    pub parts: usize,
}

/// Rows of `items` for P physical blocks and T queries: every row gives at most
/// `len / KV_ITEM_QUERIES + 1` items and the rows hold at most `4·T·16` entries.
pub fn kv_item_capacity(blocks: usize, total_q: usize) -> usize {
    NUM_KV_HEADS * blocks + (NUM_KV_HEADS * total_q * TOPK_BLOCKS).div_ceil(KV_ITEM_QUERIES)
}

/// Accumulator slots needed at most: a split row holds more than `KV_ITEM_QUERIES` entries.
pub fn kv_slot_capacity(total_q: usize) -> usize {
    NUM_KV_HEADS * total_q * TOPK_BLOCKS / (KV_ITEM_QUERIES + 1)
}

/// Parts needed at most in the deterministic mode: a split row of `len > KV_ITEM_QUERIES` entries
/// has `ceil(len / KV_ITEM_QUERIES) < len / (KV_ITEM_QUERIES / 2)` items.
pub fn kv_part_capacity(total_q: usize) -> usize {
    NUM_KV_HEADS * total_q * TOPK_BLOCKS / (KV_ITEM_QUERIES / 2)
}

/// Bands of a head's queries in the run order's key (abi.h `MSA_ITEM_QUERY_BANDS`).
pub const ITEM_QUERY_BANDS: usize = 32;

/// The order key of an item of `head` whose first CSR entry is query `first_q` of `total_q`:
/// `head · 32 + ⌊q · 32 / T⌋`, below [`crate::lpt::LPT_BINS`] (a query outside `[0, T)` is
/// clamped; the main kernel skips it).
pub fn item_band(head: usize, first_q: i32, total_q: usize) -> usize {
    let q = first_q.clamp(0, total_q.saturating_sub(1) as i32) as usize;
    head * ITEM_QUERY_BANDS + q * ITEM_QUERY_BANDS / total_q.max(1)
}

/// Tiles of the main kernel in an item of `entries` CSR entries: its cost in the run order.
pub fn item_tiles(entries: usize) -> usize {
    entries.div_ceil(TILE_QUERIES)
}

/// The items and split slots of `csr`, in the claim order for `grid` CTAs.
pub fn build_kv_items(csr: &PhysicalCsr, grid: usize) -> KvItems {
    let cap = kv_item_capacity(csr.blocks, csr.total_q);
    let mut rows = Vec::new();
    let mut split_slot = vec![-1i32; NUM_KV_HEADS * csr.blocks];
    let mut split_part = vec![-1i32; NUM_KV_HEADS * csr.blocks];
    let (mut slots, mut parts) = (0usize, 0usize);
    for head in 0..NUM_KV_HEADS {
        for block in 0..csr.blocks {
            let (lo, hi) = csr.row_range(head, block);
            if hi - lo > KV_ITEM_QUERIES {
                split_slot[head * csr.blocks + block] = slots as i32;
                split_part[head * csr.blocks + block] = parts as i32;
                slots += 1;
                parts += (hi - lo).div_ceil(KV_ITEM_QUERIES);
            }
            for begin in (lo..hi).step_by(KV_ITEM_QUERIES) {
                let end = hi.min(begin + KV_ITEM_QUERIES);
                rows.push([head as i32, block as i32, begin as i32, end as i32]);
            }
        }
    }
    // The ids by band (stable: ties by id), then the shortest to the tail.
    let band = |r: &[i32; 4]| {
        let first = csr.q_indices[r[0] as usize * csr.edge_capacity() + r[2] as usize];
        item_band(r[0] as usize, first, csr.total_q)
    };
    let mut by_band: Vec<usize> = (0..rows.len()).collect();
    by_band.sort_by_key(|&i| band(&rows[i]));
    let costs: Vec<usize> = by_band
        .iter()
        .map(|&i| item_tiles((rows[i][3] - rows[i][2]) as usize))
        .collect();
    let order: Vec<usize> = claim_order(&costs, grid)
        .into_iter()
        .map(|k| by_band[k])
        .collect();
    let mut items = vec![0i32; cap * 4];
    for (p, &id) in order.iter().enumerate() {
        items[p * 4..p * 4 + 4].copy_from_slice(&rows[id]);
    }
    KvItems {
        items,
        count: rows.len(),
        grid,
        order: order.into_iter().map(|i| i as i32).collect(),
        split_slot,
        slots,
        split_part,
        parts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csr::build_physical_csr;
    use crate::layout::VarlenLayout;
    use crate::lpt::claimed_imbalance;

    /// recent-16 style selection: each query picks its own block and up to 15 before it.
    fn recent(layout: &VarlenLayout) -> Vec<i32> {
        let t = layout.total_q();
        let mut topk = vec![-1; NUM_KV_HEADS * t * TOPK_BLOCKS];
        for f in layout.fragments() {
            for i in 0..f.q_len {
                let b = (f.position(i) / 128) as i32;
                for h in 0..NUM_KV_HEADS {
                    let row = &mut topk[(h * t + f.q_start + i) * TOPK_BLOCKS..][..TOPK_BLOCKS];
                    for (s, e) in row.iter_mut().enumerate() {
                        let blk = b - 15 + s as i32;
                        *e = if blk >= 0 { blk } else { -1 };
                    }
                }
            }
        }
        topk
    }

    #[test]
    fn items_tile_every_row_in_order_and_slots_mark_split_rows() {
        // One long document (rows of 2,048 entries: split) and short ones (rows that fit).
        let layout = VarlenLayout::new(
            &[0, 4096, 4096 + 300, 4096 + 301],
            &[0, 4096, 4396, 4397],
            None,
        )
        .unwrap();
        let csr = build_physical_csr(&layout, &recent(&layout)).unwrap();
        let k = build_kv_items(&csr, 7);
        assert!(k.count <= kv_item_capacity(csr.blocks, csr.total_q));
        assert!(k.slots <= kv_slot_capacity(csr.total_q));
        assert!(k.parts <= kv_part_capacity(csr.total_q));
        assert!(k.items[k.count * 4..].iter().all(|&w| w == 0));
        let mut covered = 0usize;
        let (mut expect_slot, mut expect_part) = (0, 0);
        // The order is a permutation of the ids; position[id] is its inverse.
        let mut position = vec![usize::MAX; k.count];
        for (p, &id) in k.order.iter().enumerate() {
            assert_eq!(position[id as usize], usize::MAX, "id {id} listed twice");
            position[id as usize] = p;
        }
        let mut at = 0;
        for head in 0..NUM_KV_HEADS {
            for block in 0..csr.blocks {
                let (lo, hi) = csr.row_range(head, block);
                let mut next = lo;
                while next < hi {
                    let p = position[at];
                    let it = &k.items[p * 4..p * 4 + 4];
                    assert_eq!(
                        it,
                        &[
                            head as i32,
                            block as i32,
                            next as i32,
                            hi.min(next + KV_ITEM_QUERIES) as i32
                        ]
                    );
                    next = it[3] as usize;
                    at += 1;
                }
                covered += hi - lo;
                let slot = k.split_slot[head * csr.blocks + block];
                let part = k.split_part[head * csr.blocks + block];
                if hi - lo > KV_ITEM_QUERIES {
                    assert_eq!((slot, part), (expect_slot, expect_part));
                    expect_slot += 1;
                    expect_part += (hi - lo).div_ceil(KV_ITEM_QUERIES) as i32;
                } else {
                    assert_eq!((slot, part), (-1, -1));
                }
            }
        }
        assert_eq!(at, k.count);
        assert_eq!(expect_slot as usize, k.slots);
        assert_eq!(expect_part as usize, k.parts);
        assert!(k.slots > 0, "the 4,096-token document's rows must split");
        let edges: usize = (0..NUM_KV_HEADS)
            .map(|h| {
                (0..csr.blocks)
                    .map(|b| csr.row_range(h, b))
                    .map(|(l, h)| h - l)
                    .sum::<usize>()
            })
            .sum();
        assert_eq!(covered, edges);
    }

    #[test]
    fn claim_order_is_by_band_then_a_longest_first_tail_and_balances_better_than_id_order() {
        let layout =
            VarlenLayout::documents(&[0, 4096, 4096 + 300, 4096 + 301, 4096 + 1500]).unwrap();
        let csr = build_physical_csr(&layout, &recent(&layout)).unwrap();
        for grid in [1, 5, 7, 132] {
            let k = build_kv_items(&csr, grid);
            let tiles = |p: usize| item_tiles((k.items[p * 4 + 3] - k.items[p * 4 + 2]) as usize);
            let band = |p: usize| {
                let it = &k.items[p * 4..p * 4 + 4];
                let first = csr.q_indices[it[0] as usize * csr.edge_capacity() + it[2] as usize];
                item_band(it[0] as usize, first, csr.total_q)
            };
            // The head ends where the band order stops: the tail is what claim_order appended.
            let costs: Vec<usize> = (0..k.count).map(tiles).collect();
            let need = grid * costs.iter().max().copied().unwrap_or(0) / 2;
            let mut tail = 0;
            while tail < k.count && costs[k.count - tail..].iter().sum::<usize>() < need {
                tail += 1;
            }
            let head = k.count - tail;
            // The head by (band, id); the tail by (cost descending, band, id), none longer than
            // any item of the head.
            for p in 1..head {
                assert!(
                    (band(p - 1), k.order[p - 1]) < (band(p), k.order[p]),
                    "grid {grid}, {p}"
                );
            }
            for p in head + 1..k.count {
                let key = |p: usize| (std::cmp::Reverse(tiles(p)), band(p), k.order[p]);
                assert!(key(p - 1) < key(p), "grid {grid}, tail {p}");
            }
            if head > 0 && tail > 0 {
                assert!((0..head).all(|p| tiles(p) >= tiles(head)), "grid {grid}");
            }
            let run: Vec<usize> = (0..k.count).map(tiles).collect();
            let mut natural = vec![0; k.count];
            for (p, &id) in k.order.iter().enumerate() {
                natural[id as usize] = run[p];
            }
            let (now, before) = (
                claimed_imbalance(&run, grid),
                claimed_imbalance(&natural, grid),
            );
            assert!(now <= before + 1e-9, "grid {grid}: {now} > {before}");
        }
    }

    #[test]
    fn bands_split_each_heads_queries_in_order_below_the_lpt_bins() {
        for t in [1usize, 5, 32, 100, 12_288] {
            let bands: Vec<usize> = (-1..=t as i32).map(|q| item_band(3, q, t)).collect();
            assert!(bands.windows(2).all(|w| w[0] <= w[1]), "T {t}");
            assert_eq!(bands[0], 3 * ITEM_QUERY_BANDS);
            assert!(*bands.last().unwrap() < crate::lpt::LPT_BINS);
            assert_eq!(
                item_band(0, t as i32 - 1, t),
                (t - 1) * ITEM_QUERY_BANDS / t
            );
        }
        assert_eq!(item_band(1, 6_143, 12_288), ITEM_QUERY_BANDS + 15);
        assert_eq!(item_band(1, 6_144, 12_288), ITEM_QUERY_BANDS + 16);
    }

    proptest::proptest! {
        /// The capacities hold for any split of the `4·T·16` entries into rows.
        #[test]
        fn slot_and_part_capacities_bound_any_rows(
            total_q in 1usize..64,
            cuts in proptest::collection::vec(0.0f64..1.0, 1..40),
        ) {
            let edges = NUM_KV_HEADS * total_q * TOPK_BLOCKS;
            let sum: f64 = cuts.iter().sum::<f64>().max(1e-9);
            let lens: Vec<usize> = cuts.iter().map(|c| (c / sum * edges as f64) as usize).collect();
            let split = lens.iter().filter(|&&l| l > KV_ITEM_QUERIES);
            proptest::prop_assert!(split.clone().count() <= kv_slot_capacity(total_q));
            let parts: usize = split.map(|l| l.div_ceil(KV_ITEM_QUERIES)).sum();
            proptest::prop_assert!(parts <= kv_part_capacity(total_q));
        }
    }
}
