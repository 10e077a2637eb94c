//! Key blocks by physical block number: an f32 copy of the blocks a call reads, and the split of
//! per-key outputs into the disjoint row ranges that block-parallel passes own.

use std::ops::Range;

use half::bf16;
use msa_plan::topology::BLOCK_SIZE;
use msa_plan::VarlenLayout;
use rayon::prelude::*;

use crate::gemm::D;

const BLOCK_ELEMS: usize = BLOCK_SIZE * D;

/// Packed key rows stored in each physical block (`None` for padding blocks).
pub(crate) struct BlockTable {
    stored: Vec<Option<Range<usize>>>,
}

impl BlockTable {
    pub fn new(layout: &VarlenLayout) -> Self {
        let (start, count) = layout.physical_block_keys();
        let stored = start
            .iter()
            .zip(&count)
            .map(|(&s, &c)| (s >= 0).then(|| s as usize..(s + c) as usize))
            .collect();
        Self { stored }
    }

    /// Physical blocks, `padded_kv_blocks`.
    pub fn len(&self) -> usize {
        self.stored.len()
    }

    /// Packed key rows of physical block `pb`.
    pub fn rows(&self, pb: usize) -> Option<Range<usize>> {
        self.stored[pb].clone()
    }

    /// Stored blocks whose rows intersect `rows`.
    pub fn overlapping(&self, rows: &Range<usize>) -> Vec<usize> {
        (0..self.len())
            .filter(|&pb| {
                self.rows(pb)
                    .is_some_and(|r| r.start < rows.end && rows.start < r.end)
            })
            .collect()
    }

    /// Split a per-key-row tensor (`row_len` values per packed key) into the chunks of the
    /// stored blocks, as `(physical block, chunk)`; rows of no block stay out of every chunk.
    pub fn split_rows<'a>(
        &self,
        mut out: &'a mut [f32],
        row_len: usize,
    ) -> Vec<(usize, &'a mut [f32])> {
        let mut blocks: Vec<(usize, Range<usize>)> = (0..self.len())
            .filter_map(|pb| self.rows(pb).map(|r| (pb, r)))
            .collect();
        blocks.sort_by_key(|(_, r)| r.start);
        let mut chunks = Vec::with_capacity(blocks.len());
        let mut at = 0;
        for (pb, r) in blocks {
            let rest = std::mem::take(&mut out);
            let (chunk, rest) = rest[(r.start - at) * row_len..].split_at_mut(r.len() * row_len);
            chunks.push((pb, chunk));
            out = rest;
            at = r.end;
        }
        chunks
    }
}

/// f32 copies of key blocks, head-major `[heads, P, 128, 128]`, filled only for the
/// (head, physical block) pairs a call reads. The allocation is zeroed lazily by the OS, so
/// blocks never filled cost no memory.
pub(crate) struct KeyCache {
    blocks: usize,
    data: Vec<f32>,
}

impl KeyCache {
    /// Convert the `needed[head · P + pb]` blocks of `src` (`[Tk, heads, 128]` bf16).
    pub fn new(table: &BlockTable, src: &[bf16], heads: usize, needed: &[bool]) -> Self {
        let blocks = table.len();
        let mut data = vec![0f32; heads * blocks * BLOCK_ELEMS];
        data.par_chunks_mut(BLOCK_ELEMS)
            .enumerate()
            .filter(|(i, _)| needed[*i])
            .for_each(|(i, dst)| {
                let (head, pb) = (i / blocks, i % blocks);
                let Some(rows) = table.rows(pb) else { return };
                for (key, dst) in rows.zip(dst.chunks_exact_mut(D)) {
                    let at = (key * heads + head) * D;
                    for (d, s) in dst.iter_mut().zip(&src[at..at + D]) {
                        *d = s.to_f32();
                    }
                }
            });
        Self { blocks, data }
    }

    /// The first `keys` rows of `head`'s physical block `pb`, `[keys, 128]`.
    pub fn block(&self, head: usize, pb: usize, keys: usize) -> &[f32] {
        let at = (head * self.blocks + pb) * BLOCK_ELEMS;
        &self.data[at..at + keys * D]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_holds_needed_blocks_and_chunks_tile_the_rows() {
        // Document 0: 300 keys in 3 blocks shared by 2 fragments; document 1: 6 keys.
        let l = VarlenLayout::new(&[0, 32, 64, 70], &[0, 200, 300, 306], Some(&[0, 0, 2])).unwrap();
        let t = BlockTable::new(&l);
        let rows: Vec<Option<Range<usize>>> = (0..t.len()).map(|pb| t.rows(pb)).collect();
        assert_eq!(rows[..3], [Some(0..128), Some(128..256), Some(256..300)]);
        let doc1 = l.fragment(2).phys_base;
        assert_eq!(rows[doc1], Some(300..306));
        assert_eq!(t.overlapping(&(127..129)), vec![0, 1]);
        assert_eq!(t.overlapping(&(300..301)), vec![doc1]);

        let heads = 2;
        let src: Vec<bf16> = (0..306 * heads * D)
            .map(|i| bf16::from_f32((i % 251) as f32))
            .collect();
        let mut needed = vec![false; heads * t.len()];
        needed[t.len() + 1] = true; // head 1, block 1
        let cache = KeyCache::new(&t, &src, heads, &needed);
        let blk = cache.block(1, 1, 128);
        for (k, key) in (128..256).enumerate() {
            for d in 0..D {
                assert_eq!(blk[k * D + d], src[(key * heads + 1) * D + d].to_f32());
            }
        }
        assert!(
            cache.block(0, 1, 128).iter().all(|&x| x == 0.0),
            "unneeded block stays empty"
        );

        let mut out = vec![0f32; 306 * 3];
        let chunks = t.split_rows(&mut out, 3);
        let sizes: Vec<(usize, usize)> = chunks.iter().map(|(pb, c)| (*pb, c.len())).collect();
        assert_eq!(
            sizes,
            vec![(0, 128 * 3), (1, 128 * 3), (2, 44 * 3), (doc1, 6 * 3)]
        );
    }
}
