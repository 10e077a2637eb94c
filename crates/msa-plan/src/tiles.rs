//! Work items of the sm_90a forward (kernels/src/attention/forward_sm90.cuh): per KV group `g`, a
//! tile of 8 consecutive packed queries; its cost is the size of its block union (the distinct
//! physical blocks its queries selected). Item `g · tiles + tile`; the kernel's CTAs claim them
//! in that order ([`crate::lpt::claimed_imbalance`]).

use crate::layout::VarlenLayout;
use crate::topology::{NUM_KV_HEADS, TOPK_BLOCKS};

/// Queries per tile of the sm_90a forward (abi.h `MSA_FWD_TILE_QUERIES`).
pub const TILE_QUERIES: usize = 8;

/// `[4 · tiles]`: the union size of each item, as the kernel's `build_union_warp` counts it.
pub fn tile_union_sizes(layout: &VarlenLayout, topk: &[i32]) -> Vec<usize> {
    let t = layout.total_q();
    let tiles = t.div_ceil(TILE_QUERIES);
    let frag = layout.query_fragments();
    let mut sizes = Vec::with_capacity(NUM_KV_HEADS * tiles);
    let mut union = Vec::with_capacity(TILE_QUERIES * TOPK_BLOCKS);
    for g in 0..NUM_KV_HEADS {
        for tile in 0..tiles {
            union.clear();
            for q in tile * TILE_QUERIES..t.min((tile + 1) * TILE_QUERIES) {
                let row = &topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS];
                union.extend(
                    row.iter()
                        .filter(|&&b| b >= 0)
                        .map(|&b| layout.physical_block(frag[q] as usize, b as usize)),
                );
            }
            union.sort_unstable();
            union.dedup();
            sizes.push(union.len());
        }
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::recent_topk;

    #[test]
    fn unions_count_distinct_blocks_across_documents() {
        // Document 0 holds queries 0..300, document 1 queries 300..301: tile 37 (queries
        // 296..303) sees blocks 0..2 of document 0 and block 0 of document 1.
        let layout = VarlenLayout::documents(&[0, 300, 301]).unwrap();
        let sizes = tile_union_sizes(&layout, &recent_topk(&layout));
        let tiles = 301usize.div_ceil(TILE_QUERIES);
        assert_eq!(sizes.len(), NUM_KV_HEADS * tiles);
        assert_eq!(sizes[0], 1);
        assert_eq!(sizes[16], 2, "queries 128..135 see blocks 0 and 1");
        assert_eq!(sizes[37], 4);
        assert_eq!(sizes[tiles + 37], 4, "every group alike under recent16");
    }
}
