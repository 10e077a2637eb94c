//! NeMo's packed microbatch layout from a document-id map (`MSAMicrobatch.from_document_map`,
//! docs/contract.md §5.5), and `pack`/`unpack` of row-major `[batch·seq, width]` tensors.
//!
//! A `[batch, seq]` map gives each token a document id (0 = padding). Every maximal run of one
//! positive id inside a batch row is one document, ordered by flat position; its tokens are packed
//! compactly (`cu_seqlens`) and also placed in a workspace where each document starts at a
//! multiple of 128 rows (NeMo's aligned prefix `Σ ceil(len/128)·128`, which is smaller than the
//! padded-varlen workspace of [`VarlenLayout`]; both put each document on whole 128-row blocks).

use std::collections::HashSet;

use crate::error::{PlanError, Result};
use crate::layout::VarlenLayout;
use crate::topology::BLOCK_SIZE;

/// The packed layout of one microbatch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedLayout {
    pub batch: usize,
    pub seq: usize,
    /// `[T]`: flat `batch·seq` row of each real token, in document order.
    pub token_rows: Vec<i64>,
    /// `[T]`: row of each packed token in the 128-aligned workspace.
    pub workspace_positions: Vec<i64>,
    /// `[T]`: document-local position of each packed token.
    pub document_positions: Vec<i64>,
    /// `[D]`: workspace row where each document starts (a multiple of 128).
    pub document_workspace_starts: Vec<i32>,
    /// `[D+1]`: compact document offsets in packed order.
    pub cu_seqlens: Vec<i32>,
    /// Workspace rows, `Σ ceil(len/128)·128` (a positive multiple of 128).
    pub workspace_size: usize,
    /// Longest document, in tokens.
    pub max_seqlen: usize,
    pub num_tokens: usize,
    pub num_documents: usize,
}

fn map_err(msg: String) -> PlanError {
    PlanError::DocumentMap(msg)
}

/// NeMo's int32 check of the document coordinates (tokens, workspace size, longest document).
pub fn check_document_coordinates(
    tokens: usize,
    workspace_size: usize,
    max_seqlen: usize,
) -> Result<()> {
    let limit = i32::MAX as usize;
    if tokens > limit || workspace_size > limit || max_seqlen > limit {
        return Err(map_err(format!(
            "MSA document coordinates must fit int32, got tokens={tokens}, \
             workspace_size={workspace_size}, max_seqlen={max_seqlen}"
        )));
    }
    Ok(())
}

/// Runs `(start, len)` of a `[batch, seq]` map with NeMo's checks: ids >= 0, at least one real
/// token, one contiguous run per (row, id); the reported flat index is the first token that
/// resumes a document after an interruption.
fn document_runs(doc_ids: &[i64], seq: usize) -> Result<Vec<(usize, usize)>> {
    if doc_ids.iter().any(|&d| d < 0) {
        return Err(map_err(
            "doc_ids must be non-negative (0 = padding, positive = document id)".into(),
        ));
    }
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut seen = HashSet::new();
    let mut bad = None;
    for (i, &id) in doc_ids.iter().enumerate() {
        let new_row = i % seq == 0;
        if new_row {
            seen.clear();
        }
        if id == 0 {
            continue;
        }
        if new_row || doc_ids[i - 1] != id {
            if !seen.insert(id) && bad.is_none() {
                bad = Some(i);
            }
            runs.push((i, 1));
        } else if let Some(run) = runs.last_mut() {
            run.1 += 1;
        }
    }
    if runs.is_empty() {
        return Err(map_err(
            "doc_ids must contain at least one real token (a positive document id)".into(),
        ));
    }
    if let Some(i) = bad {
        return Err(map_err(format!(
            "doc_ids must give each document one contiguous run of tokens; the document at flat \
             token index {i} resumes after an interruption"
        )));
    }
    Ok(runs)
}

impl PackedLayout {
    /// Build the layout of a row-major `[batch, seq]` document-id map (0 = padding).
    pub fn from_document_map(doc_ids: &[i64], batch: usize, seq: usize) -> Result<Self> {
        if doc_ids.len() != batch * seq {
            return Err(PlanError::Shape {
                name: "doc_ids",
                expected: format!("[{batch}, {seq}] ({} values)", batch * seq),
                got: format!("{} values", doc_ids.len()),
            });
        }
        let runs = document_runs(doc_ids, seq)?;
        let num_tokens: usize = runs.iter().map(|r| r.1).sum();
        let workspace_size: usize = runs
            .iter()
            .map(|r| r.1.div_ceil(BLOCK_SIZE) * BLOCK_SIZE)
            .sum();
        let max_seqlen = runs.iter().map(|r| r.1).max().unwrap_or(0);
        check_document_coordinates(num_tokens, workspace_size, max_seqlen)?;
        let mut out = Self {
            batch,
            seq,
            token_rows: Vec::with_capacity(num_tokens),
            workspace_positions: Vec::with_capacity(num_tokens),
            document_positions: Vec::with_capacity(num_tokens),
            document_workspace_starts: Vec::with_capacity(runs.len()),
            cu_seqlens: vec![0],
            workspace_size,
            max_seqlen,
            num_tokens,
            num_documents: runs.len(),
        };
        let mut aligned_start = 0usize;
        for &(start, len) in &runs {
            for j in 0..len {
                out.token_rows.push((start + j) as i64);
                out.workspace_positions.push((aligned_start + j) as i64);
                out.document_positions.push(j as i64);
            }
            out.document_workspace_starts.push(aligned_start as i32);
            out.cu_seqlens
                .push(out.cu_seqlens.last().unwrap() + len as i32);
            aligned_start += len.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
        }
        Ok(out)
    }

    /// Gather the real rows of a row-major `[batch·seq, width]` tensor into `[T, width]`.
    pub fn pack<T: Copy>(&self, external: &[T], width: usize) -> Result<Vec<T>> {
        self.check_len("external", external.len(), self.batch * self.seq, width)?;
        let mut out = Vec::with_capacity(self.num_tokens * width);
        for &r in &self.token_rows {
            let r = r as usize;
            out.extend_from_slice(&external[r * width..(r + 1) * width]);
        }
        Ok(out)
    }

    /// Scatter `[T, width]` back to `[batch·seq, width]`, padding rows `T::default()` (zero).
    pub fn unpack<T: Copy + Default>(&self, packed: &[T], width: usize) -> Result<Vec<T>> {
        self.check_len("packed", packed.len(), self.num_tokens, width)?;
        let mut out = vec![T::default(); self.batch * self.seq * width];
        for (t, &r) in self.token_rows.iter().enumerate() {
            let r = r as usize;
            out[r * width..(r + 1) * width].copy_from_slice(&packed[t * width..(t + 1) * width]);
        }
        Ok(out)
    }

    /// The documents as a [`VarlenLayout`] (`cu_seqlens_q == cu_seqlens_k`, no fragments).
    pub fn varlen_layout(&self) -> Result<VarlenLayout> {
        VarlenLayout::documents(&self.cu_seqlens)
    }

    fn check_len(&self, name: &'static str, got: usize, rows: usize, width: usize) -> Result<()> {
        if got != rows * width {
            return Err(PlanError::Shape {
                name,
                expected: format!("[{rows}, {width}] ({} values)", rows * width),
                got: format!("{got} values"),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_rows_with_padding_and_a_repeated_id_across_rows() {
        // Row 0: doc 7 (3 tokens), padding, doc 2 (2 tokens); row 1: doc 7 again (a new
        // document, other row), padding, doc 5.
        let ids = [7, 7, 7, 0, 2, 2, /* row 1 */ 7, 7, 0, 0, 0, 5];
        let p = PackedLayout::from_document_map(&ids, 2, 6).unwrap();
        assert_eq!(p.num_tokens, 8);
        assert_eq!(p.num_documents, 4);
        assert_eq!(p.token_rows, vec![0, 1, 2, 4, 5, 6, 7, 11]);
        assert_eq!(p.cu_seqlens, vec![0, 3, 5, 7, 8]);
        assert_eq!(p.document_workspace_starts, vec![0, 128, 256, 384]);
        assert_eq!(
            p.workspace_positions,
            vec![0, 1, 2, 128, 129, 256, 257, 384]
        );
        assert_eq!(p.document_positions, vec![0, 1, 2, 0, 1, 0, 1, 0]);
        assert_eq!((p.workspace_size, p.max_seqlen), (512, 3));
        let l = p.varlen_layout().unwrap();
        assert_eq!(l.batch(), 4);
    }

    #[test]
    fn long_documents_take_whole_blocks() {
        let mut ids = vec![1i64; 300];
        ids.extend(vec![2i64; 129]);
        let p = PackedLayout::from_document_map(&ids, 1, 429).unwrap();
        assert_eq!(p.document_workspace_starts, vec![0, 384]);
        assert_eq!(p.workspace_size, 384 + 256);
        assert_eq!(p.workspace_positions[300], 384);
        assert_eq!(p.max_seqlen, 300);
    }

    #[test]
    fn nemo_errors() {
        let e = |ids: &[i64], b: usize, s: usize| {
            PackedLayout::from_document_map(ids, b, s)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            e(&[1, -1], 1, 2),
            "document map is invalid: doc_ids must be non-negative (0 = padding, positive = document id)"
        );
        assert!(e(&[0, 0, 0, 0], 2, 2).contains("at least one real token (a positive document id)"));
        assert!(e(&[], 0, 5).contains("at least one real token"));
        assert!(e(&[1, 1, 2, 1, 0, 0], 1, 6)
            .contains("the document at flat token index 3 resumes after an interruption"));
        assert!(e(&[3, 0, 3, 4, 0, 4], 2, 3).contains("flat token index 2 resumes"));
        assert!(
            e(&[1, 2], 1, 3).contains("doc_ids must have shape [1, 3] (3 values), got 2 values")
        );
        assert_eq!(
            check_document_coordinates(5, 1 << 31, 5)
                .unwrap_err()
                .to_string(),
            "document map is invalid: MSA document coordinates must fit int32, got tokens=5, \
             workspace_size=2147483648, max_seqlen=5"
        );
        assert_eq!(check_document_coordinates(5, (1 << 31) - 1, 5), Ok(()));
    }

    #[test]
    fn pack_and_unpack_shapes() {
        let p = PackedLayout::from_document_map(&[0, 4, 4, 0], 2, 2).unwrap();
        let ext = [10, 11, 20, 21, 30, 31, 40, 41];
        let packed = p.pack(&ext, 2).unwrap();
        assert_eq!(packed, vec![20, 21, 30, 31]);
        assert_eq!(
            p.unpack(&packed, 2).unwrap(),
            vec![0, 0, 20, 21, 30, 31, 0, 0]
        );
        assert!(p.pack(&ext, 3).is_err());
        assert!(p
            .unpack(&packed, 1)
            .unwrap_err()
            .to_string()
            .contains("packed must have shape [2, 1]"));
    }
}
