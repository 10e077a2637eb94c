//! Packed varlen layout with context-parallel fragments (docs/contract.md §2.1, §2.2).
//!
//! A batch entry is a *fragment*: a run of one document's queries. Its queries are the
//! bottom-right-aligned suffix of its K range, which starts at the document's first fragment
//! (`fragment_indices`). Key blocks are document-local; CSR rows are counted per fragment and
//! numbered level-major; physical blocks use the padded-varlen offset, so fragments of one
//! document share them.

use crate::error::{PlanError, Result};
use crate::topology::BLOCK_SIZE;

/// Largest packed query index that `qsplit` (24 low bits) can carry.
pub const MAX_QUERY_INDEX: usize = (1 << 24) - 1;
const I32_MAX: i64 = i32::MAX as i64;

/// One batch entry of the packed layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    /// First packed query row (`cu_seqlens_q[b]`).
    pub q_start: usize,
    /// Queries in this fragment.
    pub q_len: usize,
    /// First packed key row of the document (`cu_seqlens_k[fragment_indices[b]]`).
    pub k_base: usize,
    /// Logical K length `klen_b`: keys from the document start to this fragment's end.
    pub k_len: usize,
    /// Index of the document's first fragment.
    pub first: usize,
    /// `ceil(k_len / 128)`: CSR rows (levels) of this fragment.
    pub num_blocks: usize,
    /// Physical (padded-varlen) block number of the document's block 0.
    pub phys_base: usize,
}

impl Fragment {
    /// K position of query 0: queries are the suffix of the K range.
    pub fn query_offset(&self) -> usize {
        self.k_len - self.q_len
    }

    /// Document position of local query `i`.
    pub fn position(&self, i: usize) -> usize {
        self.query_offset() + i
    }

    /// Workspace row (128-aligned) where the document starts.
    pub fn workspace_start(&self) -> usize {
        self.phys_base * BLOCK_SIZE
    }

    /// Keys of local block `j` visible to this fragment (the last block may be partial).
    pub fn block_keys(&self, j: usize) -> usize {
        (self.k_len - j * BLOCK_SIZE).min(BLOCK_SIZE)
    }
}

/// A CSR row: fragment `b`, document-local key block `level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowCoord {
    pub fragment: u32,
    pub level: u32,
}

/// The validated packed layout of one call: fragments, rows and workspace sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarlenLayout {
    cu_seqlens_q: Vec<i32>,
    cu_seqlens_k: Vec<i32>,
    fragment_indices: Option<Vec<i32>>,
    fragments: Vec<Fragment>,
    rows: Vec<RowCoord>,
    /// `fragment_rows[row_offsets[b] + level]` is the row of (b, level).
    row_offsets: Vec<usize>,
    fragment_rows: Vec<u32>,
    total_q: usize,
    total_k: usize,
    padded_kv_blocks: usize,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
}

fn seq_err(name: &'static str, reason: String) -> PlanError {
    PlanError::Seqlens { name, reason }
}

fn check_cu(name: &'static str, cu: &[i32]) -> Result<()> {
    if cu[0] != 0 {
        return Err(seq_err(name, format!("must start at 0, got {}", cu[0])));
    }
    for i in 1..cu.len() {
        if cu[i] < cu[i - 1] {
            return Err(seq_err(
                name,
                format!(
                    "must be non-decreasing; entry {i} (= {}) < entry {} (= {})",
                    cu[i],
                    i - 1,
                    cu[i - 1]
                ),
            ));
        }
    }
    Ok(())
}

fn fits_i32(what: &'static str, got: usize) -> Result<()> {
    if got as i64 > I32_MAX {
        return Err(PlanError::Overflow {
            what,
            limit: I32_MAX,
            got: got as i64,
        });
    }
    Ok(())
}

impl VarlenLayout {
    /// Validate `cu_seqlens_q`, `cu_seqlens_k` (both `[B+1]`, B >= 1) and the optional
    /// `fragment_indices` (`[B]`), and derive fragments, rows and workspace sizes.
    pub fn new(
        cu_seqlens_q: &[i32],
        cu_seqlens_k: &[i32],
        fragment_indices: Option<&[i32]>,
    ) -> Result<Self> {
        if cu_seqlens_q.len() < 2 || cu_seqlens_q.len() != cu_seqlens_k.len() {
            return Err(seq_err(
                "cu_seqlens",
                format!(
                    "cu_seqlens_q and cu_seqlens_k must both have B+1 entries with B >= 1, got {} and {}",
                    cu_seqlens_q.len(),
                    cu_seqlens_k.len()
                ),
            ));
        }
        check_cu("cu_seqlens_q", cu_seqlens_q)?;
        check_cu("cu_seqlens_k", cu_seqlens_k)?;
        let batch = cu_seqlens_q.len() - 1;
        if let Some(f) = fragment_indices {
            if f.len() != batch {
                return Err(PlanError::Shape {
                    name: "fragment_indices",
                    expected: format!("[{batch}] (one entry per batch entry)"),
                    got: format!("[{}]", f.len()),
                });
            }
            for (b, &fb) in f.iter().enumerate() {
                if fb < 0 || fb as usize > b {
                    return Err(seq_err(
                        "fragment_indices",
                        format!("entry {b} = {fb} must lie in [0, {b}] (a fragment points at its document's first fragment)"),
                    ));
                }
                let fb = fb as usize;
                if f[fb] as usize != fb {
                    return Err(seq_err(
                        "fragment_indices",
                        format!("entry {b} points at fragment {fb}, whose own entry is {} (a document's first fragment must point at itself)", f[fb]),
                    ));
                }
                if fb < b && f[b - 1] as usize != fb {
                    return Err(seq_err(
                        "fragment_indices",
                        format!("document of fragment {fb} resumes at fragment {b} after an interruption (its fragments must be consecutive)"),
                    ));
                }
            }
        }
        let total_q = cu_seqlens_q[batch] as usize;
        let total_k = cu_seqlens_k[batch] as usize;
        let mut fragments = Vec::with_capacity(batch);
        let (mut max_q, mut max_k) = (0usize, 0usize);
        for b in 0..batch {
            let first = fragment_indices.map_or(b, |f| f[b] as usize);
            let q_start = cu_seqlens_q[b] as usize;
            let q_len = cu_seqlens_q[b + 1] as usize - q_start;
            let k_base = cu_seqlens_k[first] as usize;
            let k_len = cu_seqlens_k[b + 1] as usize - k_base;
            if k_len < q_len {
                return Err(seq_err(
                    "cu_seqlens_k",
                    format!("fragment {b} has {q_len} queries but only {k_len} keys (queries are the suffix of their K range)"),
                ));
            }
            if q_len > MAX_QUERY_INDEX + 1 {
                return Err(PlanError::TooLarge {
                    what: "queries per fragment (the 24-bit qsplit field)",
                    limit: MAX_QUERY_INDEX as u64 + 1,
                    got: q_len as u64,
                });
            }
            let num_blocks = k_len.div_ceil(BLOCK_SIZE);
            let phys_base = (k_base + first * BLOCK_SIZE) / BLOCK_SIZE;
            max_q = max_q.max(q_len);
            max_k = max_k.max(k_len);
            fragments.push(Fragment {
                q_start,
                q_len,
                k_base,
                k_len,
                first,
                num_blocks,
                phys_base,
            });
        }
        let padded_kv_blocks = (total_k + (batch + 1) * BLOCK_SIZE - 1) / BLOCK_SIZE;
        fits_i32(
            "workspace rows (padded K blocks x 128)",
            padded_kv_blocks * BLOCK_SIZE,
        )?;
        fits_i32("queries x 16 x 4 (edge capacity)", total_q * 64)?;

        // Level-major row numbering: level 0 of every fragment that has it, then level 1, ...
        let max_blocks = fragments.iter().map(|f| f.num_blocks).max().unwrap_or(0);
        let total_rows: usize = fragments.iter().map(|f| f.num_blocks).sum();
        fits_i32("CSR rows x 4", total_rows * 4)?;
        let mut row_offsets = Vec::with_capacity(batch + 1);
        row_offsets.push(0);
        for f in &fragments {
            row_offsets.push(row_offsets.last().unwrap() + f.num_blocks);
        }
        let mut rows = Vec::with_capacity(total_rows);
        let mut fragment_rows = vec![0u32; total_rows];
        // Fragments sorted by block count let each level visit only the active ones.
        let mut active: Vec<usize> = (0..batch)
            .filter(|&b| fragments[b].num_blocks > 0)
            .collect();
        for level in 0..max_blocks {
            active.retain(|&b| fragments[b].num_blocks > level);
            for &b in &active {
                fragment_rows[row_offsets[b] + level] = rows.len() as u32;
                rows.push(RowCoord {
                    fragment: b as u32,
                    level: level as u32,
                });
            }
        }
        Ok(Self {
            cu_seqlens_q: cu_seqlens_q.to_vec(),
            cu_seqlens_k: cu_seqlens_k.to_vec(),
            fragment_indices: fragment_indices.map(<[i32]>::to_vec),
            fragments,
            rows,
            row_offsets,
            fragment_rows,
            total_q,
            total_k,
            padded_kv_blocks,
            max_seqlen_q: max_q,
            max_seqlen_k: max_k,
        })
    }

    /// A layout of independent documents (`cu_seqlens_q == cu_seqlens_k`, no fragments).
    pub fn documents(cu_seqlens: &[i32]) -> Result<Self> {
        Self::new(cu_seqlens, cu_seqlens, None)
    }

    /// `cu_seqlens_q`, `[B+1]`.
    pub fn cu_seqlens_q(&self) -> &[i32] {
        &self.cu_seqlens_q
    }
    /// `cu_seqlens_k`, `[B+1]`.
    pub fn cu_seqlens_k(&self) -> &[i32] {
        &self.cu_seqlens_k
    }
    /// `fragment_indices` as given (`None` for plain documents).
    pub fn fragment_indices(&self) -> Option<&[i32]> {
        self.fragment_indices.as_deref()
    }
    /// Every fragment, in batch order.
    pub fn fragments(&self) -> &[Fragment] {
        &self.fragments
    }
    /// Fragment `b`; panics if out of range.
    pub fn fragment(&self, b: usize) -> &Fragment {
        &self.fragments[b]
    }
    /// Batch entries (fragments), B.
    pub fn batch(&self) -> usize {
        self.fragments.len()
    }
    /// Packed queries T, `cu_seqlens_q[B]`.
    pub fn total_q(&self) -> usize {
        self.total_q
    }
    /// Packed keys Tk, `cu_seqlens_k[B]`.
    pub fn total_k(&self) -> usize {
        self.total_k
    }
    /// Σ_b ceil(klen_b / 128): CSR rows per head.
    pub fn total_rows(&self) -> usize {
        self.rows.len()
    }
    /// `(total_k + (B+1)·128 − 1) // 128`: physical blocks of the padded workspace.
    pub fn padded_kv_blocks(&self) -> usize {
        self.padded_kv_blocks
    }
    /// Rows of the 128-aligned K workspace, `padded_kv_blocks · 128`.
    pub fn workspace_rows(&self) -> usize {
        self.padded_kv_blocks * BLOCK_SIZE
    }
    /// Most queries of any fragment.
    pub fn max_seqlen_q(&self) -> usize {
        self.max_seqlen_q
    }
    /// Longest logical K range, max_b klen_b.
    pub fn max_seqlen_k(&self) -> usize {
        self.max_seqlen_k
    }
    /// Most key blocks of any fragment, `ceil(max_seqlen_k / 128)`.
    pub fn max_blocks(&self) -> usize {
        self.max_seqlen_k.div_ceil(BLOCK_SIZE)
    }

    /// Fragment holding packed query `q` (empty fragments are skipped).
    pub fn query_fragment(&self, q: usize) -> usize {
        assert!(
            q < self.total_q,
            "query {q} out of range ({} queries)",
            self.total_q
        );
        self.cu_seqlens_q.partition_point(|&c| c as usize <= q) - 1
    }

    /// `(fragment, local index, document position)` of packed query `q`.
    pub fn query_coords(&self, q: usize) -> (usize, usize, usize) {
        let b = self.query_fragment(q);
        let f = &self.fragments[b];
        let i = q - f.q_start;
        (b, i, f.position(i))
    }

    /// Every row's (fragment, level), in row order.
    pub fn rows(&self) -> &[RowCoord] {
        &self.rows
    }

    /// Row index of (fragment `b`, level), level-major.
    pub fn row_index(&self, b: usize, level: usize) -> usize {
        assert!(
            level < self.fragments[b].num_blocks,
            "fragment {b} has no level {level}"
        );
        self.fragment_rows[self.row_offsets[b] + level] as usize
    }

    /// Physical (workspace) block of fragment `b`'s document-local block `j`.
    pub fn physical_block(&self, b: usize, j: usize) -> usize {
        self.fragments[b].phys_base + j
    }

    /// For every physical block: the packed K row of its first key and the keys the document
    /// stores in it; `(-1, 0)` for padding blocks. A document stores K up to its last
    /// fragment's end, so the count is taken from the longest fragment of the document.
    pub fn physical_block_keys(&self) -> (Vec<i32>, Vec<i32>) {
        let mut start = vec![-1i32; self.padded_kv_blocks];
        let mut count = vec![0i32; self.padded_kv_blocks];
        for f in &self.fragments {
            for j in 0..f.num_blocks {
                let pb = f.phys_base + j;
                start[pb] = (f.k_base + j * BLOCK_SIZE) as i32;
                count[pb] = count[pb].max(f.block_keys(j) as i32);
            }
        }
        (start, count)
    }

    /// Fragment of every packed query, `[T]`.
    pub fn query_fragments(&self) -> Vec<i32> {
        let mut out = Vec::with_capacity(self.total_q);
        for (b, f) in self.fragments.iter().enumerate() {
            out.extend(std::iter::repeat_n(b as i32, f.q_len));
        }
        out
    }

    /// `fragment_indices`, or the identity when the layout has none.
    pub fn fragment_first(&self) -> Vec<i32> {
        self.fragments.iter().map(|f| f.first as i32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_fragment_example_of_the_contract() {
        // testing.py make_shared_fragment_metadata: cu_q=(0,32,64), cu_k=(0,128,256), fragments (0,0).
        let l = VarlenLayout::new(&[0, 32, 64], &[0, 128, 256], Some(&[0, 0])).unwrap();
        assert_eq!(l.total_rows(), 3);
        assert_eq!(l.fragment(0).position(0), 96);
        assert_eq!(l.fragment(1).position(0), 224);
        assert_eq!(l.fragment(1).k_len, 256);
        assert_eq!(l.physical_block(0, 0), l.physical_block(1, 0));
        assert_eq!(l.physical_block(1, 1), 1);
        // Level-major: (0,0), (1,0), (1,1).
        assert_eq!(l.row_index(0, 0), 0);
        assert_eq!(l.row_index(1, 0), 1);
        assert_eq!(l.row_index(1, 1), 2);
        assert_eq!(l.padded_kv_blocks(), (256 + 3 * 128 - 1) / 128);
    }

    #[test]
    fn level_major_rows_match_the_closed_form() {
        let cu = [0, 300, 310, 700, 700, 1000];
        let l = VarlenLayout::documents(&cu).unwrap();
        let rows_of: Vec<usize> = l.fragments().iter().map(|f| f.num_blocks).collect();
        for (b, f) in l.fragments().iter().enumerate() {
            for level in 0..f.num_blocks {
                let closed: usize = rows_of.iter().map(|&r| r.min(level)).sum::<usize>()
                    + rows_of[..b].iter().filter(|&&r| r > level).count();
                assert_eq!(l.row_index(b, level), closed);
                let rc = l.rows()[closed];
                assert_eq!((rc.fragment as usize, rc.level as usize), (b, level));
            }
        }
        assert_eq!(l.query_fragment(305), 1);
        assert_eq!(l.query_fragment(700), 4, "empty fragment 3 is skipped");
    }

    #[test]
    fn physical_block_keys_cover_every_packed_key_once() {
        let l = VarlenLayout::new(&[0, 32, 64, 70], &[0, 200, 300, 306], Some(&[0, 0, 2])).unwrap();
        let (start, count) = l.physical_block_keys();
        let mut seen = vec![0; l.total_k()];
        for (s, c) in start.iter().zip(&count) {
            for r in 0..*c {
                seen[(*s + r) as usize] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 1), "{seen:?}");
        assert_eq!(l.query_fragments().len(), 70);
        assert_eq!(l.fragment_first(), vec![0, 0, 2]);
    }

    #[test]
    fn physical_blocks_of_documents_never_overlap() {
        let l = VarlenLayout::documents(&[0, 1, 129, 130, 500, 501]).unwrap();
        let mut last_end = 0;
        for f in l.fragments() {
            assert!(f.phys_base >= last_end);
            last_end = f.phys_base + f.num_blocks;
        }
        assert!(last_end <= l.padded_kv_blocks());
    }

    #[test]
    fn malformed_seqlens_are_rejected_with_reasons() {
        let e = |r: Result<VarlenLayout>| r.unwrap_err().to_string();
        assert!(e(VarlenLayout::new(&[0, 5], &[0, 5, 6], None)).contains("B+1 entries"));
        assert!(e(VarlenLayout::new(&[1, 5], &[0, 5], None)).contains("must start at 0, got 1"));
        assert!(e(VarlenLayout::new(&[0, 5, 3], &[0, 5, 9], None))
            .contains("non-decreasing; entry 2 (= 3) < entry 1 (= 5)"));
        assert!(e(VarlenLayout::new(&[0, 5], &[0, 4], None)).contains("5 queries but only 4 keys"));
        assert!(e(VarlenLayout::new(&[0, 5, 9], &[0, 5, 9], Some(&[0])))
            .contains("fragment_indices must have shape [2]"));
        assert!(e(VarlenLayout::new(&[0, 5, 9], &[0, 5, 9], Some(&[0, 2])))
            .contains("must lie in [0, 1]"));
        assert!(e(VarlenLayout::new(
            &[0, 5, 9, 12],
            &[0, 5, 9, 12],
            Some(&[0, 1, 0])
        ))
        .contains("after an interruption"));
        assert!(e(VarlenLayout::new(&[0, 5, 9], &[0, 5, 9], Some(&[1, 1])))
            .contains("must lie in [0, 0]"));
    }

    #[test]
    fn the_query_limit_is_worded_as_the_bit_field_it_is() {
        let n = (MAX_QUERY_INDEX + 2) as i32;
        assert_eq!(
            VarlenLayout::documents(&[0, n]).unwrap_err().to_string(),
            "queries per fragment (the 24-bit qsplit field) must be at most 16777216, got 16777217"
        );
    }
}
