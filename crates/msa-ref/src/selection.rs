//! Token sets of the contract (docs/contract.md §2.3) and their inverse.
//!
//! The token set of (query q, group g) is `{j : j/128 ∈ topk[g,q,:], j ≤ p}` inside the
//! fragment's K range. Entries outside `[0, num_blocks)` are ignored and the entries are a set;
//! a block past the local one has no visible key, so it contributes nothing either.

use msa_plan::topology::{BLOCK_SIZE, NUM_KV_HEADS, TOPK_BLOCKS};
use msa_plan::VarlenLayout;

/// Where a packed query sits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueryPos {
    /// Document position p (bottom-right aligned in the fragment's K range).
    pub position: usize,
    /// Physical block of the document's block 0.
    pub phys_base: usize,
    /// First packed key row of the document.
    pub k_base: usize,
}

impl QueryPos {
    pub fn of(layout: &VarlenLayout, q: usize) -> Self {
        let (b, _, position) = layout.query_coords(q);
        let f = layout.fragment(b);
        Self {
            position,
            phys_base: f.phys_base,
            k_base: f.k_base,
        }
    }

    /// The local block `p / 128`.
    pub fn local_block(&self) -> usize {
        self.position / BLOCK_SIZE
    }

    /// Keys of document-local block `e <= local_block()` visible to the query.
    pub fn visible_keys(&self, e: usize) -> usize {
        (self.position + 1 - e * BLOCK_SIZE).min(BLOCK_SIZE)
    }
}

/// The 16 top-k entries of (group, query) in the head-major `[4, T, 16]` tensor.
pub(crate) fn topk_row(topk: &[i32], total_q: usize, group: usize, q: usize) -> &[i32] {
    let at = (group * total_q + q) * TOPK_BLOCKS;
    &topk[at..at + TOPK_BLOCKS]
}

/// The blocks of one token set, ascending and unique, each with its visible key count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Selection {
    blocks: [(u32, u32); TOPK_BLOCKS],
    len: usize,
}

impl Selection {
    pub fn new(entries: &[i32], pos: &QueryPos) -> Self {
        let local = pos.local_block();
        let mut ids = [0u32; TOPK_BLOCKS];
        let mut n = 0;
        // `e <= local` also implies `e < num_blocks`, because p < k_len.
        for &e in entries {
            if e >= 0 && e as usize <= local {
                ids[n] = e as u32;
                n += 1;
            }
        }
        let ids = &mut ids[..n];
        ids.sort_unstable();
        let mut blocks = [(0, 0); TOPK_BLOCKS];
        let mut len = 0;
        for (i, &e) in ids.iter().enumerate() {
            if i == 0 || e != ids[i - 1] {
                blocks[len] = (e, pos.visible_keys(e as usize) as u32);
                len += 1;
            }
        }
        Self { blocks, len }
    }

    /// `(document-local block, visible keys)`, ascending by block.
    pub fn blocks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.blocks[..self.len]
            .iter()
            .map(|&(e, c)| (e as usize, c as usize))
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens in the set.
    pub fn tokens(&self) -> usize {
        self.blocks().map(|(_, c)| c).sum()
    }
}

/// Mark every (group, physical block) that the given queries select: `[4 · P]`, group-major.
pub(crate) fn selected_blocks(layout: &VarlenLayout, topk: &[i32], queries: &[usize]) -> Vec<bool> {
    let blocks = layout.padded_kv_blocks();
    let mut needed = vec![false; NUM_KV_HEADS * blocks];
    for &q in queries {
        let pos = QueryPos::of(layout, q);
        for g in 0..NUM_KV_HEADS {
            let sel = Selection::new(topk_row(topk, layout.total_q(), g, q), &pos);
            for (e, _) in sel.blocks() {
                needed[g * blocks + pos.phys_base + e] = true;
            }
        }
    }
    needed
}

/// The inverse of the token sets: for every (group, physical block), the packed queries that
/// select it, ascending. Fragments of one document share physical blocks, so a block's list
/// spans all of them.
pub(crate) struct Visits {
    blocks: usize,
    offsets: Vec<usize>,
    queries: Vec<u32>,
}

impl Visits {
    pub fn new(layout: &VarlenLayout, topk: &[i32]) -> Self {
        let (blocks, total_q) = (layout.padded_kv_blocks(), layout.total_q());
        let positions: Vec<QueryPos> = (0..total_q).map(|q| QueryPos::of(layout, q)).collect();
        let each = |f: &mut dyn FnMut(usize, usize)| {
            for g in 0..NUM_KV_HEADS {
                for (q, pos) in positions.iter().enumerate() {
                    let sel = Selection::new(topk_row(topk, total_q, g, q), pos);
                    for (e, _) in sel.blocks() {
                        f(g * blocks + pos.phys_base + e, q);
                    }
                }
            }
        };
        let mut offsets = vec![0usize; NUM_KV_HEADS * blocks + 1];
        each(&mut |slot, _| offsets[slot + 1] += 1);
        for i in 1..offsets.len() {
            offsets[i] += offsets[i - 1];
        }
        let mut fill = offsets.clone();
        let mut queries = vec![0u32; offsets[offsets.len() - 1]];
        // Queries are visited in ascending order within each group, so lists come out sorted.
        each(&mut |slot, q| {
            queries[fill[slot]] = q as u32;
            fill[slot] += 1;
        });
        Self {
            blocks,
            offsets,
            queries,
        }
    }

    /// Queries that select physical block `pb` for `group`, ascending.
    pub fn of(&self, group: usize, pb: usize) -> &[u32] {
        let slot = group * self.blocks + pb;
        &self.queries[self.offsets[slot]..self.offsets[slot + 1]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_drop_invalid_future_and_duplicate_entries() {
        // Fragment 1 of the contract's shared example: queries at 224..255 over K 0..255.
        let l = VarlenLayout::new(&[0, 32, 64], &[0, 128, 256], Some(&[0, 0])).unwrap();
        let pos = QueryPos::of(&l, 40); // position 232, local block 1
        assert_eq!(pos.position, 232);
        let mut entries = [-1i32; 16];
        entries[..6].copy_from_slice(&[1, 7, 0, 1, -5, 2]);
        let sel = Selection::new(&entries, &pos);
        assert_eq!(sel.blocks().collect::<Vec<_>>(), vec![(0, 128), (1, 105)]);
        assert_eq!(sel.tokens(), 233);
        let none = Selection::new(&[-1; 16], &pos);
        assert!(none.is_empty());
        assert_eq!(none.tokens(), 0);
    }

    #[test]
    fn visits_invert_the_sets_across_fragments() {
        let l = VarlenLayout::new(&[0, 2, 4], &[0, 128, 256], Some(&[0, 0])).unwrap();
        // Group 0: q0, q1 (fragment 0) pick block 0; q2 picks 0 and 1; q3 picks 1 only.
        let mut topk = vec![-1i32; 4 * 4 * 16];
        let rows: [&[i32]; 4] = [&[0], &[0, 0], &[1, 0], &[1]];
        for (q, r) in rows.iter().enumerate() {
            topk[q * 16..q * 16 + r.len()].copy_from_slice(r);
        }
        topk[(3 * 4 + 2) * 16] = 1; // group 3, q2
        let v = Visits::new(&l, &topk);
        assert_eq!(v.of(0, 0), &[0, 1, 2]);
        assert_eq!(v.of(0, 1), &[2, 3]);
        assert_eq!(v.of(1, 0), &[] as &[u32]);
        assert_eq!(v.of(3, 1), &[2]);
        let needed = selected_blocks(&l, &topk, &[3, 2]);
        let p = l.padded_kv_blocks();
        assert!(needed[0] && needed[1] && needed[3 * p + 1]);
        assert_eq!(needed.iter().filter(|&&b| b).count(), 3);
    }
}
