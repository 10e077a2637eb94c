//! Checks that need no reference numbers: which keys must get exact-zero gradients, and whether
//! an indexer selection is well formed.

use msa_plan::topology::{BLOCK_SIZE, NUM_INDEX_HEADS, NUM_KV_HEADS, TOPK_BLOCKS};
use msa_plan::VarlenLayout;

use super::CheckLine;

/// `[Tk, 4]`: whether any query of group g selected the block holding packed key row r (and
/// the key lies at or before that query's position, else its gradient is exactly zero too).
pub fn attended_keys(layout: &VarlenLayout, topk: &[i32]) -> Vec<bool> {
    let t = layout.total_q();
    let mut seen = vec![false; layout.total_k() * NUM_KV_HEADS];
    for g in 0..NUM_KV_HEADS {
        for q in 0..t {
            let (b, _, p) = layout.query_coords(q);
            let f = layout.fragment(b);
            for &e in &topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS] {
                if e < 0 || e as usize >= f.num_blocks {
                    continue;
                }
                let first = e as usize * BLOCK_SIZE;
                for j in first..(first + BLOCK_SIZE).min(p + 1) {
                    seen[(f.k_base + j) * NUM_KV_HEADS + g] = true;
                }
            }
        }
    }
    seen
}

/// Indexer selection rules (contract §3.1): per (head, query) exactly min(p/128+1, 16) valid
/// entries first, then -1; all distinct and causal; the local block last.
pub fn indexer_selection(layout: &VarlenLayout, topk: &[i32]) -> CheckLine {
    let t = layout.total_q();
    let mut bad = 0usize;
    let mut first = String::new();
    for g in 0..NUM_INDEX_HEADS {
        for q in 0..t {
            let (_, _, p) = layout.query_coords(q);
            let local = (p / BLOCK_SIZE) as i32;
            let n = (p / BLOCK_SIZE + 1).min(TOPK_BLOCKS);
            let row = &topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS];
            let valid = &row[..n];
            let ok = row[n..].iter().all(|&e| e == -1)
                && valid[n - 1] == local
                && valid.iter().all(|&e| (0..=local).contains(&e))
                && (0..n).all(|i| !valid[..i].contains(&valid[i]));
            if !ok {
                if first.is_empty() {
                    first = format!("first bad (head {g}, query {q}, p {p}): {row:?}");
                }
                bad += 1;
            }
        }
    }
    CheckLine {
        tensor: "indexer_topk".into(),
        metric: "malformed_rows",
        value: bad as f64,
        limit: 0.0,
        passed: bad == 0,
        detail: first,
    }
}

/// Non-finite elements: a poisoned output nobody wrote shows up here.
pub fn finite(tensor: &str, values: impl IntoIterator<Item = f32>) -> CheckLine {
    let (mut n, mut bad) = (0usize, 0usize);
    for v in values {
        n += 1;
        bad += !v.is_finite() as usize;
    }
    CheckLine {
        tensor: tensor.into(),
        metric: "non_finite",
        value: bad as f64,
        limit: 0.0,
        passed: bad == 0,
        detail: format!("n {n}"),
    }
}
