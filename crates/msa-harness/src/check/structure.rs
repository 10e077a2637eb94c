//! Checks that need no reference numbers: which keys must get exact-zero gradients, and whether
//! an indexer selection is well formed.

use msa_plan::topology::{BLOCK_SIZE, NUM_INDEX_HEADS, NUM_KV_HEADS, TOPK_BLOCKS};
use msa_plan::VarlenLayout;

use rayon::prelude::*;

use super::CheckLine;

/// `[Tk, 4]`: whether any query of group g selected the block holding packed key row r and sits
/// at or after the key (else the key's gradient is exactly zero).
pub fn attended_keys(layout: &VarlenLayout, topk: &[i32]) -> Vec<bool> {
    let t = layout.total_q();
    // Per (physical block, group): the furthest key offset any selecting query sees.
    let mut reach = vec![-1i32; layout.padded_kv_blocks() * NUM_KV_HEADS];
    for q in 0..t {
        let (b, _, p) = layout.query_coords(q);
        let f = layout.fragment(b);
        for g in 0..NUM_KV_HEADS {
            for &e in &topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS] {
                if e < 0 || e as usize >= f.num_blocks {
                    continue;
                }
                let seen = (p - e as usize * BLOCK_SIZE).min(BLOCK_SIZE - 1) as i32;
                let r = &mut reach[layout.physical_block(b, e as usize) * NUM_KV_HEADS + g];
                *r = (*r).max(seen);
            }
        }
    }
    let (start, count) = layout.physical_block_keys();
    let mut attended = vec![false; layout.total_k() * NUM_KV_HEADS];
    for (pb, (&s, &c)) in start.iter().zip(&count).enumerate() {
        for r in 0..c {
            for g in 0..NUM_KV_HEADS {
                attended[(s + r) as usize * NUM_KV_HEADS + g] = r <= reach[pb * NUM_KV_HEADS + g];
            }
        }
    }
    attended
}

/// Indexer selection rules (docs/contract.md §3.1): per (head, query) exactly min(p/128+1, 16) valid
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
pub fn finite<T: Copy + Into<f32> + Sync>(tensor: &str, values: &[T]) -> CheckLine {
    let bad = values
        .par_iter()
        .filter(|v| !(**v).into().is_finite())
        .count();
    CheckLine {
        tensor: tensor.into(),
        metric: "non_finite",
        value: bad as f64,
        limit: 0.0,
        passed: bad == 0,
        detail: format!("n {}", values.len()),
    }
}
