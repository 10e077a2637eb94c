//! MSA's FLOP model (docs/contract.md §6.1), used to report the benchmark's TFLOP/s exactly as MSA
//! does.
//!
//! `S` (sparse elements) counts, per query, 15 full blocks plus its partial local block, capped
//! by the causal count — the same for any valid selection that keeps the local block and fills
//! the other 15 slots when it can. `C` (causal elements) is the dense causal count the indexer
//! scores. Both have closed forms per fragment (prefix sums over document positions).

use crate::error::Result;
use crate::layout::VarlenLayout;
use crate::topk::check_topk_shape;
use crate::topology::{
    BLOCK_SIZE, HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS,
};

/// Full non-local blocks a query can attend: 15.
const FULL_BLOCKS: u64 = (TOPK_BLOCKS - 1) as u64;
const BLK: u64 = BLOCK_SIZE as u64;

/// `Σ_{p < n} min(p+1, 1920 + p mod 128 + 1)` = `Σ_{p < n} 128·min(p/128, 15) + p mod 128 + 1`.
fn sparse_prefix(n: u64) -> u64 {
    let (full, rem) = (n / BLK, n % BLK);
    let local = full * (BLK * (BLK + 1) / 2) + rem * (rem + 1) / 2;
    // Σ over complete blocks a < full of min(a, 15), then the partial block at level `full`.
    let capped = if full <= FULL_BLOCKS + 1 {
        full * full.saturating_sub(1) / 2
    } else {
        FULL_BLOCKS * (FULL_BLOCKS + 1) / 2 + FULL_BLOCKS * (full - FULL_BLOCKS - 1)
    };
    local + BLK * (BLK * capped + rem * full.min(FULL_BLOCKS))
}

/// `Σ_{p < n} (p + 1)`.
fn causal_prefix(n: u64) -> u64 {
    n * (n + 1) / 2
}

/// Sum of `prefix` over every fragment's positions `[k_len − q_len, k_len)`.
fn over_fragments(layout: &VarlenLayout, prefix: fn(u64) -> u64) -> u64 {
    layout
        .fragments()
        .iter()
        .map(|f| prefix(f.k_len as u64) - prefix(f.query_offset() as u64))
        .sum()
}

/// MSA's `sparse_elements` S = Σ_q min(p+1, 1920 + (p mod 128) + 1), in closed form.
pub fn sparse_elements(layout: &VarlenLayout) -> u64 {
    over_fragments(layout, sparse_prefix)
}

/// MSA's `causal_elements` C = Σ_q (p+1), in closed form.
pub fn causal_elements(layout: &VarlenLayout) -> u64 {
    over_fragments(layout, causal_prefix)
}

/// The per-head average of the keys a selection actually attends, `Σ_{head, q} |S(q, head)| / 4`
/// (rounded down; invalid entries ignored, repeats counted once), for reporting beside S.
pub fn selected_elements(layout: &VarlenLayout, topk: &[i32]) -> Result<u64> {
    check_topk_shape(layout, topk)?;
    let t = layout.total_q();
    let mut total = 0u64;
    for h in 0..NUM_KV_HEADS {
        for f in layout.fragments() {
            for i in 0..f.q_len {
                let base = (h * t + f.q_start + i) * TOPK_BLOCKS;
                let entries = &topk[base..base + TOPK_BLOCKS];
                let p = f.position(i);
                for (slot, &e) in entries.iter().enumerate() {
                    let valid = e >= 0 && (e as usize) < f.num_blocks;
                    if valid && !entries[..slot].contains(&e) {
                        let e = e as usize;
                        total += crate::csr::visible_keys(f.block_keys(e), p, e) as u64;
                    }
                }
            }
        }
    }
    Ok(total / NUM_KV_HEADS as u64)
}

/// FLOPs of each MSA operation for one layout (f64: the indexer count can pass 2^64 for the
/// largest legal layouts; values are exact below 2^53).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlopModel {
    /// `2·(128+128)·64·S`.
    pub fwd: f64,
    /// `2·(3·128+2·128)·64·S` (2.5× forward).
    pub bwd: f64,
    /// `2·128·4·C`.
    pub indexer: f64,
    /// `2·(128·64 + 3·128·4)·S`.
    pub kl: f64,
}

impl FlopModel {
    /// The model from element counts S (sparse) and C (causal).
    pub fn from_elements(sparse: u64, causal: u64) -> Self {
        let (s, c) = (sparse as f64, causal as f64);
        let (d, hq, di, hi) = (
            HEAD_DIM as f64,
            NUM_Q_HEADS as f64,
            INDEX_DIM as f64,
            NUM_INDEX_HEADS as f64,
        );
        Self {
            fwd: 2.0 * (d + d) * hq * s,
            bwd: 2.0 * (3.0 * d + 2.0 * d) * hq * s,
            indexer: 2.0 * di * hi * c,
            kl: 2.0 * (d * hq + 3.0 * di * hi) * s,
        }
    }

    /// The model of a layout (`sparse_elements`, `causal_elements`).
    pub fn for_layout(layout: &VarlenLayout) -> Self {
        Self::from_elements(sparse_elements(layout), causal_elements(layout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute_sparse(positions: impl Iterator<Item = u64>) -> u64 {
        positions.map(|p| (p + 1).min(1920 + p % 128 + 1)).sum()
    }

    #[test]
    fn closed_form_prefix_matches_brute_force() {
        for n in (0..5000).chain([2047, 2048, 2049, 100_000, 131_071]) {
            assert_eq!(sparse_prefix(n), brute_sparse(0..n), "n = {n}");
            assert_eq!(
                causal_prefix(n),
                (0..n).map(|p| p + 1).sum::<u64>(),
                "n = {n}"
            );
        }
    }

    #[test]
    fn fragments_count_their_own_positions() {
        let l =
            VarlenLayout::new(&[0, 32, 64, 3064], &[0, 128, 256, 3256], Some(&[0, 0, 2])).unwrap();
        let want = brute_sparse(96..128) + brute_sparse(224..256) + brute_sparse(0..3000);
        assert_eq!(sparse_elements(&l), want);
        let causal: u64 = (96..128)
            .chain(224..256)
            .chain(0..3000)
            .map(|p| p + 1)
            .sum();
        assert_eq!(causal_elements(&l), causal);
    }

    #[test]
    fn model_constants() {
        let m = FlopModel::from_elements(1, 1);
        assert_eq!(
            (m.fwd, m.bwd, m.indexer, m.kl),
            (32768.0, 81920.0, 1024.0, 2.0 * 128.0 * 76.0)
        );
        assert_eq!(m.bwd, 2.5 * m.fwd);
    }

    #[test]
    fn selected_elements_count_visible_unique_keys() {
        // One 300-token document. Head 0 of query 299 (own block 2, 44 visible keys) selects
        // {2, 0, 0, 9}: 44 + 128 (repeat and out-of-range ignored); head 1 of query 5 selects 0.
        let l = VarlenLayout::documents(&[0, 300]).unwrap();
        let mut topk = vec![-1; 4 * 300 * 16];
        topk[299 * 16..299 * 16 + 4].copy_from_slice(&[2, 0, 0, 9]);
        topk[(300 + 5) * 16 + 7] = 0;
        assert_eq!(selected_elements(&l, &topk).unwrap(), (44 + 128 + 6) / 4);
        assert!(selected_elements(&l, &topk[1..]).is_err());
    }
}
