//! Key-block → query maps (docs/contract.md §4.1, §4.3): the k2q CSR over fragment rows that the
//! forward and the NeMo-style backward walk, and the physical CSR over workspace blocks that the
//! deterministic backward and the KL backward walk.
//!
//! Both are built by a stable counting sort over queries in packed order, so the queries of a row
//! ascend — the forward kernel's causal "diagonal prefix" and the backward task build rely on it.
//! An entry is an edge iff `0 <= e < num_blocks` of the query's fragment (as MSA's histogram) and
//! no earlier slot of the row holds `e`; range, causality and duplicates are
//! [`crate::topk::validate_topk`]'s job, and a duplicate that slipped through is one edge, as on
//! the device (whose CSR build keeps one bit per (query, block)).

use crate::error::Result;
use crate::layout::VarlenLayout;
use crate::topk::check_topk_shape;
use crate::topology::{BLOCK_SIZE, NUM_INDEX_HEADS, TOPK_BLOCKS};

/// Bit offset of `writer_rank` in `qsplit`; the low 24 bits hold the fragment-local query
/// (`MSA_QSPLIT_RANK_SHIFT` of `kernels/include/msa/abi.h`, as the next one).
pub const QSPLIT_RANK_SHIFT: u32 = 24;
/// Bit offset of `writer_rank` in the physical CSR's `valid`; the low 8 bits hold visible keys.
pub const PHYSICAL_RANK_SHIFT: u32 = 8;

/// The k2q CSR of MSA's `prepare` (all arrays int32, row-major, `-1` where no edge is stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct K2qCsr {
    /// Rows per head, `layout.total_rows()` (level-major).
    pub rows: usize,
    /// Packed queries T.
    pub total_q: usize,
    /// `[4, rows+1]`: row r of head h is `q_indices[h, row_ptr[h,r]..row_ptr[h,r+1]]`.
    pub row_ptr: Vec<i32>,
    /// `[4, T·16]`: fragment-local queries, ascending within a row, `-1` tail.
    pub q_indices: Vec<i32>,
    /// `[4, T·16]`: `q_local | writer_rank << 24` at the same positions, `-1` tail.
    pub qsplit: Vec<i32>,
    /// `[T, 4]`: edges per (query, head) (valid entries, a repeated value once), the partials
    /// the combine merges.
    pub split_counts: Vec<i32>,
}

impl K2qCsr {
    /// Edge slots per head, `T·16` (the width of `q_indices`).
    pub fn edge_capacity(&self) -> usize {
        self.total_q * TOPK_BLOCKS
    }

    /// Edge positions `[begin, end)` of row `row` of head `head` within that head's edge slots.
    pub fn row_range(&self, head: usize, row: usize) -> (usize, usize) {
        let base = head * (self.rows + 1) + row;
        (self.row_ptr[base] as usize, self.row_ptr[base + 1] as usize)
    }

    /// The fragment-local queries of row `row` of head `head`, ascending.
    pub fn row_queries(&self, head: usize, row: usize) -> &[i32] {
        let (b, e) = self.row_range(head, row);
        let base = head * self.edge_capacity();
        &self.q_indices[base + b..base + e]
    }
}

/// The physical CSR of MSA's KL / deterministic schedule (int32, row-major, `-1` tail).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhysicalCsr {
    /// Physical blocks P, `layout.padded_kv_blocks()`.
    pub blocks: usize,
    /// Packed queries T.
    pub total_q: usize,
    /// `[4, P+1]`: row offsets per (head, physical block).
    pub row_ptr: Vec<i32>,
    /// `[4, T·16]`: global packed queries, ascending within a row, `-1` tail.
    pub q_indices: Vec<i32>,
    /// `[4, T·16]`: `visible_keys | writer_rank << 8` at the same positions, `-1` tail.
    pub valid: Vec<i32>,
}

impl PhysicalCsr {
    /// Edge slots per head, `T·16`.
    pub fn edge_capacity(&self) -> usize {
        self.total_q * TOPK_BLOCKS
    }

    /// Edge positions `[begin, end)` of physical block `block` of head `head`.
    pub fn row_range(&self, head: usize, block: usize) -> (usize, usize) {
        let base = head * (self.blocks + 1) + block;
        (self.row_ptr[base] as usize, self.row_ptr[base + 1] as usize)
    }
}

/// One query's edges with their writer ranks, in slot order.
struct QueryEdges {
    /// `(block, writer_rank)` of each edge.
    edges: [(usize, i32); TOPK_BLOCKS],
    len: usize,
}

/// Edges of one (head, query): its valid entries in slot order, each value once, with the writer
/// rank (the row's valid entries below it).
fn query_edges(entries: &[i32], num_blocks: usize) -> QueryEdges {
    let is_valid = |e: i32| e >= 0 && (e as usize) < num_blocks;
    let mut out = QueryEdges {
        edges: [(0, 0); TOPK_BLOCKS],
        len: 0,
    };
    for (s, &e) in entries.iter().enumerate() {
        if !is_valid(e) || entries[..s].contains(&e) {
            continue;
        }
        let rank = entries.iter().filter(|&&o| is_valid(o) && o < e).count() as i32;
        out.edges[out.len] = (e as usize, rank);
        out.len += 1;
    }
    out
}

/// One query of the layout, visited in packed order.
struct QueryRef {
    /// Packed (global) query index.
    q: usize,
    fragment: usize,
    local: usize,
    position: usize,
}

fn queries(layout: &VarlenLayout) -> impl Iterator<Item = QueryRef> + '_ {
    layout.fragments().iter().enumerate().flat_map(|(b, f)| {
        (0..f.q_len).map(move |i| QueryRef {
            q: f.q_start + i,
            fragment: b,
            local: i,
            position: f.position(i),
        })
    })
}

/// Counting sort of `(row, value)` edges of one head into `row_ptr`/payload arrays: counts, then
/// an exclusive scan, then a stable scatter in visiting order.
fn scatter_rows(
    num_rows: usize,
    edges: &[(usize, [i32; 2])],
    row_ptr: &mut [i32],
    first: &mut [i32],
    second: &mut [i32],
) {
    let mut counts = vec![0usize; num_rows];
    for &(r, _) in edges {
        counts[r] += 1;
    }
    let mut cursor = vec![0usize; num_rows];
    let mut acc = 0usize;
    for r in 0..num_rows {
        row_ptr[r] = acc as i32;
        cursor[r] = acc;
        acc += counts[r];
    }
    row_ptr[num_rows] = acc as i32;
    for &(r, [a, b]) in edges {
        first[cursor[r]] = a;
        second[cursor[r]] = b;
        cursor[r] += 1;
    }
}

/// Build MSA's k2q CSR, `qsplit` and `split_counts` from a `[4, T, 16]` selection (shape-checked).
pub fn build_k2q_csr(layout: &VarlenLayout, topk: &[i32]) -> Result<K2qCsr> {
    check_topk_shape(layout, topk)?;
    let t = layout.total_q();
    let rows = layout.total_rows();
    let cap = t * TOPK_BLOCKS;
    let mut csr = K2qCsr {
        rows,
        total_q: t,
        row_ptr: vec![0; NUM_INDEX_HEADS * (rows + 1)],
        q_indices: vec![-1; NUM_INDEX_HEADS * cap],
        qsplit: vec![-1; NUM_INDEX_HEADS * cap],
        split_counts: vec![0; t * NUM_INDEX_HEADS],
    };
    let mut edges = Vec::with_capacity(cap);
    for h in 0..NUM_INDEX_HEADS {
        edges.clear();
        for qr in queries(layout) {
            let base = (h * t + qr.q) * TOPK_BLOCKS;
            let nb = layout.fragment(qr.fragment).num_blocks;
            let qe = query_edges(&topk[base..base + TOPK_BLOCKS], nb);
            for &(e, rank) in &qe.edges[..qe.len] {
                let local = qr.local as i32;
                let row = layout.row_index(qr.fragment, e);
                edges.push((row, [local, local | rank << QSPLIT_RANK_SHIFT]));
            }
            csr.split_counts[qr.q * NUM_INDEX_HEADS + h] = qe.len as i32;
        }
        scatter_rows(
            rows,
            &edges,
            &mut csr.row_ptr[h * (rows + 1)..(h + 1) * (rows + 1)],
            &mut csr.q_indices[h * cap..(h + 1) * cap],
            &mut csr.qsplit[h * cap..(h + 1) * cap],
        );
    }
    Ok(csr)
}

/// Keys of block `e` that the query at document position `p` sees (0 for a future block).
pub fn visible_keys(block_keys: usize, position: usize, e: usize) -> usize {
    block_keys.min((position + 1).saturating_sub(e * BLOCK_SIZE))
}

/// Build the physical CSR (per head and workspace block, global queries, visible keys and writer
/// ranks) from a `[4, T, 16]` selection (shape-checked).
pub fn build_physical_csr(layout: &VarlenLayout, topk: &[i32]) -> Result<PhysicalCsr> {
    check_topk_shape(layout, topk)?;
    let t = layout.total_q();
    let blocks = layout.padded_kv_blocks();
    let cap = t * TOPK_BLOCKS;
    let mut csr = PhysicalCsr {
        blocks,
        total_q: t,
        row_ptr: vec![0; NUM_INDEX_HEADS * (blocks + 1)],
        q_indices: vec![-1; NUM_INDEX_HEADS * cap],
        valid: vec![-1; NUM_INDEX_HEADS * cap],
    };
    let mut edges = Vec::with_capacity(cap);
    for h in 0..NUM_INDEX_HEADS {
        edges.clear();
        for qr in queries(layout) {
            let base = (h * t + qr.q) * TOPK_BLOCKS;
            let f = layout.fragment(qr.fragment);
            let qe = query_edges(&topk[base..base + TOPK_BLOCKS], f.num_blocks);
            for &(e, rank) in &qe.edges[..qe.len] {
                let keys = visible_keys(f.block_keys(e), qr.position, e) as i32;
                let pb = layout.physical_block(qr.fragment, e);
                edges.push((pb, [qr.q as i32, keys | rank << PHYSICAL_RANK_SHIFT]));
            }
        }
        scatter_rows(
            blocks,
            &edges,
            &mut csr.row_ptr[h * (blocks + 1)..(h + 1) * (blocks + 1)],
            &mut csr.q_indices[h * cap..(h + 1) * cap],
            &mut csr.valid[h * cap..(h + 1) * cap],
        );
    }
    Ok(csr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_fragment_example_csr() {
        // cu_q=(0,32,64), cu_k=(0,128,256), fragments (0,0): rows (0,0)=0, (1,0)=1, (1,1)=2.
        let l = VarlenLayout::new(&[0, 32, 64], &[0, 128, 256], Some(&[0, 0])).unwrap();
        let mut topk = vec![-1; 4 * 64 * 16];
        for q in 0..64 {
            // head 0: every query selects block 0; fragment 1 also its own block 1, in slot 0.
            topk[q * 16 + 5] = 0;
            if q >= 32 {
                topk[q * 16] = 1;
            }
        }
        topk[(64 + 3) * 16 + 2] = 7; // head 1, query 3: out of range, ignored
        let csr = build_k2q_csr(&l, &topk).unwrap();
        assert_eq!(&csr.row_ptr[..4], &[0, 32, 64, 96]);
        assert_eq!(&csr.row_ptr[4..8], &[0, 0, 0, 0]);
        let local: Vec<i32> = (0..32).collect();
        assert_eq!(csr.row_queries(0, 0), &local[..]);
        assert_eq!(csr.row_queries(0, 1), &local[..]);
        assert_eq!(csr.row_queries(0, 2), &local[..]);
        assert!(csr.q_indices[96..64 * 16].iter().all(|&v| v == -1));
        // Block 0 has rank 0; block 1 rank 1 although it sits in an earlier slot.
        assert_eq!(csr.qsplit[32 + 5], 5);
        assert_eq!(csr.qsplit[64 + 5], 5 | 1 << 24);
        assert_eq!(csr.split_counts[0], 1);
        assert_eq!(csr.split_counts[40 * 4], 2);
        assert_eq!(csr.split_counts[3 * 4 + 1], 0);

        let phys = build_physical_csr(&l, &topk).unwrap();
        assert_eq!(phys.blocks, l.padded_kv_blocks());
        // Physical block 0 is shared: 64 global queries, ascending; block 1 has 32.
        assert_eq!(&phys.row_ptr[..3], &[0, 64, 96]);
        let global: Vec<i32> = (0..64).collect();
        assert_eq!(&phys.q_indices[..64], &global[..]);
        assert_eq!(&phys.q_indices[64..96], &global[32..]);
        // Block 0: fragment 0 (positions 96+i) sees 97+i keys, fragment 1 all 128; block 1 is
        // the own block of fragment 1 (positions 224+i): 97+i keys, rank 1.
        assert_eq!(phys.valid[0], 97);
        assert_eq!(phys.valid[31], 128);
        assert!(phys.valid[32..64].iter().all(|&v| v == 128));
        assert_eq!(phys.valid[64], 97 | 1 << 8);
        assert_eq!(phys.valid[95], 128 | 1 << 8);
    }

    #[test]
    fn a_repeated_entry_is_one_edge() {
        let l = VarlenLayout::new(&[0, 300], &[0, 300], None).unwrap();
        let mut topk = vec![-1; 4 * 300 * 16];
        // Query 299 (own block 2) of head 0 selects block 1 twice and block 0 once.
        topk[299 * 16..299 * 16 + 3].copy_from_slice(&[1, 0, 1]);
        let csr = build_k2q_csr(&l, &topk).unwrap();
        assert_eq!(csr.split_counts[299 * 4], 2);
        assert_eq!(&csr.row_ptr[..4], &[0, 1, 2, 2]);
        assert_eq!(&csr.q_indices[..3], &[299, 299, -1]);
        // Block 0 has rank 0, block 1 rank 1 (its earlier copy counts no lower entry twice).
        assert_eq!(&csr.qsplit[..2], &[299, 299 | 1 << 24]);
        let phys = build_physical_csr(&l, &topk).unwrap();
        assert_eq!(&phys.row_ptr[..4], &[0, 1, 2, 2]);
        assert_eq!(&phys.q_indices[..3], &[299, 299, -1]);
    }

    #[test]
    fn visible_keys_clip_to_the_block_and_the_position() {
        assert_eq!(visible_keys(128, 300, 2), 45);
        assert_eq!(visible_keys(128, 300, 1), 128);
        assert_eq!(visible_keys(10, 300, 2), 10);
        assert_eq!(visible_keys(128, 100, 1), 0);
        assert_eq!(visible_keys(128, 255, 1), 128);
    }
}
