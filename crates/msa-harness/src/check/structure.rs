//! Checks that need no reference numbers: which keys must get exact-zero gradients, whether an
//! indexer selection is well formed, and full-tensor invariants (LSE rows finite unless the set
//! is empty; Σ dV of a group equals the group's Σ dO over queries with any key).

use half::bf16;
use msa_plan::topology::{
    BLOCK_SIZE, HEADS_PER_GROUP, HEAD_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS,
};
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

/// Indexer selection rules (docs/contract.md §3.1): per (head, query) exactly min(p/128+1, 16)
/// valid entries first, then -1; all distinct and causal; the local block last.
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

/// Per (group, query): whether the token set is empty (no entry 0 <= e <= p/128 in the row).
pub fn empty_sets(layout: &VarlenLayout, topk: &[i32]) -> Vec<bool> {
    let t = layout.total_q();
    let mut empty = vec![true; NUM_KV_HEADS * t];
    for q in 0..t {
        let local = (layout.query_coords(q).2 / BLOCK_SIZE) as i32;
        for g in 0..NUM_KV_HEADS {
            let row = &topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS];
            empty[g * t + q] = !row.iter().any(|&e| (0..=local).contains(&e));
        }
    }
    empty
}

/// Every LSE row (`[T, 64]`) is finite, except rows of empty token sets, which are exactly
/// `-inf` (docs/contract.md §2.4): a full-tensor invariant that needs no reference.
pub fn lse_rows(layout: &VarlenLayout, topk: &[i32], lse: &[f32]) -> CheckLine {
    let t = layout.total_q();
    let empty = empty_sets(layout, topk);
    let (mut bad, mut first) = (0usize, String::new());
    for (i, &l) in lse.iter().enumerate().take(t * NUM_Q_HEADS) {
        let (q, h) = (i / NUM_Q_HEADS, i % NUM_Q_HEADS);
        let e = empty[(h / HEADS_PER_GROUP) * t + q];
        if (e && l != f32::NEG_INFINITY) || (!e && !l.is_finite()) {
            if first.is_empty() {
                first = format!("first at (query {q}, head {h}): {l}, empty set {e}");
            }
            bad += 1;
        }
    }
    CheckLine {
        tensor: "lse".into(),
        metric: "bad_rows",
        value: bad as f64,
        limit: 0.0,
        passed: bad == 0,
        detail: first,
    }
}

/// Limit of [`dv_sums`]: the bf16 rounding of dV (and of P in the kernels' P·dO) moves the sum
/// by about 1e-3 of the column norms (random signs), so this is ten standard deviations.
pub const DV_SUM_LIMIT: f64 = 1e-2;

/// Σ_j dV[j, g, :] over a group's keys equals the sum of the group's dO rows over the queries
/// whose token set is not empty (the probabilities of a row sum to 1). Per (group, dim):
/// |Σ dV − Σ dO| / (‖dV‖₂ + ‖dO‖₂) of the column, at most [`DV_SUM_LIMIT`]. A full-tensor
/// invariant that needs no reference: a lost or doubled block of contributions, or a scaled dV,
/// breaks it.
pub fn dv_sums(layout: &VarlenLayout, topk: &[i32], dout: &[bf16], dv: &[bf16]) -> CheckLine {
    let t = layout.total_q();
    let empty = empty_sets(layout, topk);
    let width = NUM_KV_HEADS * HEAD_DIM;
    // Per column (group, dim): (Σ x, Σ x²) over the rows `row` maps to an offset.
    let sums = |x: &[bf16], rows: usize, row: &(dyn Fn(usize, usize) -> Option<usize> + Sync)| {
        (0..width)
            .into_par_iter()
            .map(|c| {
                let (g, d) = (c / HEAD_DIM, c % HEAD_DIM);
                let (mut s, mut s2) = (0f64, 0f64);
                for r in 0..rows {
                    if let Some(at) = row(r, g) {
                        let v = x[at + d].to_f64();
                        s += v;
                        s2 += v * v;
                    }
                }
                (s, s2)
            })
            .collect::<Vec<(f64, f64)>>()
    };
    let got = sums(dv, layout.total_k(), &|r, g| {
        Some((r * NUM_KV_HEADS + g) * HEAD_DIM)
    });
    // dO rows of the group's 16 heads: row r = (query, head in group).
    let want = sums(dout, t * HEADS_PER_GROUP, &|r, g| {
        let (q, hh) = (r / HEADS_PER_GROUP, r % HEADS_PER_GROUP);
        (!empty[g * t + q]).then(|| (q * NUM_Q_HEADS + g * HEADS_PER_GROUP + hh) * HEAD_DIM)
    });
    let (mut worst, mut at) = (0f64, 0usize);
    for (c, ((s, n), (w, m))) in got.iter().zip(&want).enumerate() {
        let scale = n.sqrt() + m.sqrt();
        let err = if scale > 0.0 {
            (s - w).abs() / scale
        } else {
            0.0
        };
        let err = if err.is_nan() { f64::INFINITY } else { err };
        if err > worst {
            (worst, at) = (err, c);
        }
    }
    CheckLine {
        tensor: "dv".into(),
        metric: "sum_rel",
        value: worst,
        limit: DV_SUM_LIMIT,
        passed: worst <= DV_SUM_LIMIT,
        detail: format!(
            "|sum dV - sum dO| / (|dV|_2 + |dO|_2) per column, worst at group {} dim {}",
            at / HEAD_DIM,
            at % HEAD_DIM
        ),
    }
}
