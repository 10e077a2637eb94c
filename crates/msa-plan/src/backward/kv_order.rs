//! Accumulation order of the deterministic sm_90a backward
//! (kernels/src/attention/backward_order.cuh, whose comment gives the argument): the item at list
//! position `I` of [`super::kv_items`] runs on CTA `I % G` of `G` persistent CTAs, starting at the estimated
//! tile time `start(I)` (the tiles of the CTA's earlier items plus [`ITEM_OVERHEAD_TILES`] each).
//! Each split row's dK/dV slot adds its items' partials in ascending order of their keys
//! (half-tile time, CTA); the ranks here are what the device order build writes
//! (`backward_order_*_kernel`). dQ needs no order: its contributions add exactly
//! ([`super::det_grid`]).

use super::kv_items::{item_tiles, KvItems, KV_ITEM_QUERIES};
use crate::csr::PhysicalCsr;

/// Estimated cost of an item beyond its tiles (K/V load, dK/dV store), in tile times (abi.h
/// `MSA_ITEM_OVERHEAD_TILES`).
pub const ITEM_OVERHEAD_TILES: usize = 2;
/// CSR entries (queries) per tile of the main kernel (abi.h `MSA_KV_TILE_QUERIES`).
pub const TILE_QUERIES: usize = 4;

/// Persistent CTAs of the main kernel (`backward_grid`): one per SM, at most one per item slot.
pub fn backward_grid(item_capacity: usize, sms: usize) -> usize {
    item_capacity.min(sms)
}

/// The key of an event at `half_time` (half tiles) on CTA `cta` of `grid`.
pub fn order_key(half_time: u64, cta: usize, grid: usize) -> u64 {
    half_time * grid as u64 + cta as u64
}

/// The order tables of one item list and grid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvOrder {
    pub grid: usize,
    /// `[count]`: estimated start of each item, in tiles of its CTA's timeline.
    pub item_start: Vec<i32>,
    /// `[count]`: rank of each item's dK/dV addition among its row's items (0 for unsplit rows).
    pub dkv_rank: Vec<i32>,
}

fn item(items: &KvItems, i: usize) -> [usize; 4] {
    let w = &items.items[i * 4..i * 4 + 4];
    [w[0] as usize, w[1] as usize, w[2] as usize, w[3] as usize]
}

fn tiles(it: [usize; 4]) -> usize {
    item_tiles(it[3] - it[2])
}

impl KvOrder {
    /// Key of the dK/dV addition of item `i` (after its last tile, before its CTA's next item).
    pub fn dkv_key(&self, items: &KvItems, i: usize) -> u64 {
        let half = 2 * (self.item_start[i] as u64 + tiles(item(items, i)) as u64) - 1;
        order_key(half, i % self.grid, self.grid)
    }
}

/// The order of `items` (built from `csr`) on the grid their run order is made for.
pub fn build_kv_order(csr: &PhysicalCsr, items: &KvItems) -> KvOrder {
    let grid = items.grid;
    assert!(grid > 0, "at least one CTA");
    let n = items.count;
    let mut order = KvOrder {
        grid,
        item_start: vec![0; n],
        dkv_rank: vec![0; n],
    };
    for c in 0..grid.min(n) {
        let mut acc = 0usize;
        for i in (c..n).step_by(grid) {
            order.item_start[i] = acc as i32;
            acc += tiles(item(items, i)) + ITEM_OVERHEAD_TILES;
        }
    }
    // dK/dV: rank among the row's items (consecutive item ids) by key.
    for i in 0..n {
        let [g, block, first, _] = item(items, i);
        let (lo, hi) = csr.row_range(g, block);
        let row_first = items.order[i] as usize - (first - lo) / KV_ITEM_QUERIES;
        let row_items = (hi - lo).div_ceil(KV_ITEM_QUERIES);
        let mine = order.dkv_key(items, i);
        order.dkv_rank[i] = (row_first..row_first + row_items)
            .map(|id| items.position[id] as usize)
            .filter(|&o| o != i && order.dkv_key(items, o) < mine)
            .count() as i32;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backward::kv_items::{build_kv_items, kv_item_capacity};
    use crate::csr::build_physical_csr;
    use crate::layout::VarlenLayout;
    use crate::testing::recent_topk;
    use crate::topology::{NUM_KV_HEADS, TOPK_BLOCKS};

    /// Random selections (own block + up to 15 distinct earlier ones), seeded.
    fn random_topk(layout: &VarlenLayout, seed: u64) -> Vec<i32> {
        let t = layout.total_q();
        let mut s = seed;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let mut topk = vec![-1; NUM_KV_HEADS * t * TOPK_BLOCKS];
        for f in layout.fragments() {
            for i in 0..f.q_len {
                let own = f.position(i) / 128;
                for g in 0..NUM_KV_HEADS {
                    let row = &mut topk[(g * t + f.q_start + i) * TOPK_BLOCKS..][..TOPK_BLOCKS];
                    row[0] = own as i32;
                    let mut n = 1;
                    for _ in 0..64 {
                        if n == TOPK_BLOCKS || own == 0 {
                            break;
                        }
                        let b = (next() % own as u64) as i32;
                        if !row[..n].contains(&b) {
                            row[n] = b;
                            n += 1;
                        }
                    }
                }
            }
        }
        topk
    }

    fn layouts() -> Vec<(VarlenLayout, Vec<i32>)> {
        // A long document (rows of 2,048 entries and a 6-item sink-like first block) and short
        // ones, recent and random.
        let l = VarlenLayout::documents(&[0, 6144, 6144 + 300, 6144 + 301, 6144 + 1500]).unwrap();
        let r = recent_topk(&l);
        let x = random_topk(&l, 0x5EED);
        vec![(l.clone(), r), (l, x)]
    }

    /// A CTA's program: its dK/dV additions (key, row, rank), in the kernel's order.
    fn programs(csr: &PhysicalCsr, items: &KvItems, o: &KvOrder) -> Vec<Vec<(u64, usize, i32)>> {
        let mut progs = vec![Vec::new(); o.grid];
        for i in 0..items.count {
            let [g, block, _, _] = item(items, i);
            let row = g * csr.blocks + block;
            if items.split_slot[row] >= 0 {
                progs[i % o.grid].push((o.dkv_key(items, i), row, o.dkv_rank[i]));
            }
        }
        progs
    }

    #[test]
    fn ranks_number_each_row_in_key_order() {
        for (layout, topk) in layouts() {
            let csr = build_physical_csr(&layout, &topk).unwrap();
            for sms in [1, 7, 132] {
                let grid = backward_grid(kv_item_capacity(csr.blocks, csr.total_q), sms);
                let items = build_kv_items(&csr, grid);
                let o = build_kv_order(&csr, &items);
                let mut dkv: Vec<Vec<(i32, u64)>> = vec![Vec::new(); NUM_KV_HEADS * csr.blocks];
                for p in programs(&csr, &items, &o) {
                    // A CTA's additions have increasing keys in program order (waits go to
                    // smaller keys only).
                    assert!(p.windows(2).all(|w| w[0].0 < w[1].0));
                    for (key, row, r) in p {
                        dkv[row].push((r, key));
                    }
                }
                // Ranks 0..n-1, ascending with the keys.
                for list in dkv.iter_mut() {
                    list.sort();
                    assert!(list.iter().enumerate().all(|(r, &(x, _))| x as usize == r));
                    assert!(list.windows(2).all(|w| w[0].1 < w[1].1));
                }
                assert!(
                    dkv.iter().any(|l| l.len() > 2),
                    "some row splits in 3+ items"
                );
            }
        }
    }

    /// The persistent schedule cannot deadlock: G CTAs each run their program, an addition
    /// waiting until its row's counter reaches its rank; every step some CTA advances.
    #[test]
    fn the_schedule_completes_under_the_semaphores() {
        for (layout, topk) in layouts() {
            let csr = build_physical_csr(&layout, &topk).unwrap();
            for sms in [1, 3, 132] {
                let grid = backward_grid(kv_item_capacity(csr.blocks, csr.total_q), sms);
                let items = build_kv_items(&csr, grid);
                let o = build_kv_order(&csr, &items);
                let progs = programs(&csr, &items, &o);
                let mut dkv_sem = vec![0i32; NUM_KV_HEADS * csr.blocks];
                let mut pc = vec![0usize; grid];
                let total: usize = progs.iter().map(Vec::len).sum();
                let mut done = 0;
                while done < total {
                    let mut moved = false;
                    for (c, p) in progs.iter().enumerate() {
                        while let Some(&(_, row, r)) = p.get(pc[c]) {
                            if dkv_sem[row] != r {
                                break;
                            }
                            dkv_sem[row] += 1;
                            pc[c] += 1;
                            done += 1;
                            moved = true;
                        }
                    }
                    assert!(
                        moved,
                        "deadlock with {done} of {total} events done (grid {grid})"
                    );
                }
            }
        }
    }
}
