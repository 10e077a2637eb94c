//! Work items of the sm_90a KV-outer backward (kernels/src/attention/backward_sm90.cuh): each row
//! of the physical CSR (one (head, physical block) pair) cut into items of at most
//! [`KV_ITEM_QUERIES`] consecutive entries, in head-major, block-ascending order. A row cut into
//! several items gets a slot of the fp32 dK/dV accumulator (slots numbered in the same order);
//! a row that fits one item is written in bf16 by that item. The device item build
//! (`backward_items_kernel`) computes the same tables word for word.

use crate::csr::PhysicalCsr;
use crate::topology::{NUM_KV_HEADS, TOPK_BLOCKS};

/// Most CSR entries (selecting queries) one item takes: 128 tiles of 4 queries.
pub const KV_ITEM_QUERIES: usize = 512;

/// The item tables of one physical CSR (int32, the device ABI).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvItems {
    /// `[capacity, 4]`: `(head, physical block, first entry, end entry)` per item; rows past
    /// `count` are 0.
    pub items: Vec<i32>,
    /// Items in use.
    pub count: usize,
    /// `[4, P]`: the dK/dV accumulator slot of a row split over items, else -1.
    pub split_slot: Vec<i32>,
    /// Slots in use.
    pub slots: usize,
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

/// The items and split slots of `csr`.
pub fn build_kv_items(csr: &PhysicalCsr) -> KvItems {
    let cap = kv_item_capacity(csr.blocks, csr.total_q);
    let mut items = vec![0i32; cap * 4];
    let mut split_slot = vec![-1i32; NUM_KV_HEADS * csr.blocks];
    let (mut count, mut slots) = (0usize, 0usize);
    for head in 0..NUM_KV_HEADS {
        for block in 0..csr.blocks {
            let (lo, hi) = csr.row_range(head, block);
            if hi - lo > KV_ITEM_QUERIES {
                split_slot[head * csr.blocks + block] = slots as i32;
                slots += 1;
            }
            for begin in (lo..hi).step_by(KV_ITEM_QUERIES) {
                let end = hi.min(begin + KV_ITEM_QUERIES);
                items[count * 4..count * 4 + 4].copy_from_slice(&[
                    head as i32,
                    block as i32,
                    begin as i32,
                    end as i32,
                ]);
                count += 1;
            }
        }
    }
    KvItems {
        items,
        count,
        split_slot,
        slots,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csr::build_physical_csr;
    use crate::layout::VarlenLayout;

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
        let k = build_kv_items(&csr);
        assert!(k.count <= kv_item_capacity(csr.blocks, csr.total_q));
        assert!(k.slots <= kv_slot_capacity(csr.total_q));
        assert!(k.items[k.count * 4..].iter().all(|&w| w == 0));
        let mut covered = 0usize;
        let mut expect_slot = 0;
        let mut at = 0;
        for head in 0..NUM_KV_HEADS {
            for block in 0..csr.blocks {
                let (lo, hi) = csr.row_range(head, block);
                let mut next = lo;
                while next < hi {
                    let it = &k.items[at * 4..at * 4 + 4];
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
                if hi - lo > KV_ITEM_QUERIES {
                    assert_eq!(slot, expect_slot);
                    expect_slot += 1;
                } else {
                    assert_eq!(slot, -1);
                }
            }
        }
        assert_eq!(at, k.count);
        assert_eq!(expect_slot as usize, k.slots);
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
}
