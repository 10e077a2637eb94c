//! The k2q and physical CSRs hold exactly the valid top-k entries, queries ascending per row.

use proptest::prelude::*;

use super::{config, ok};
use crate::csr::{build_k2q_csr, build_physical_csr, K2qCsr, PhysicalCsr};
use crate::layout::VarlenLayout;
use crate::testing::{layouts_with_topk, SplitMix64};

/// Put invalid entries (`-5`, `num_blocks`, `num_blocks + 3`) and non-causal blocks into some
/// padding slots: the CSRs must ignore the first kind and keep the second (`e < num_blocks`).
pub(super) fn with_noise(layout: &VarlenLayout, topk: &[i32], seed: u64) -> Vec<i32> {
    let mut r = SplitMix64::new(seed);
    let t = layout.total_q();
    let mut out = topk.to_vec();
    for h in 0..4 {
        for f in layout.fragments() {
            for i in 0..f.q_len {
                let own = f.position(i) / 128;
                let slots = &mut out[(h * t + f.q_start + i) * 16..][..16];
                for s in 0..16 {
                    if slots[s] != -1 || !r.chance(1, 16) {
                        continue;
                    }
                    let nb = f.num_blocks as i32;
                    let future = (own + 1..f.num_blocks).find(|&b| !slots.contains(&(b as i32)));
                    slots[s] = match (r.below(4), future) {
                        (0, _) => -5,
                        (1, _) => nb,
                        (2, Some(b)) => b as i32,
                        _ => nb + 3,
                    };
                }
            }
        }
    }
    out
}

/// Row of (fragment `b`, level `l`) by the contract's closed form.
fn row_closed_form(layout: &VarlenLayout, b: usize, l: usize) -> usize {
    let rows: Vec<usize> = layout.fragments().iter().map(|f| f.num_blocks).collect();
    rows.iter().map(|&r| r.min(l)).sum::<usize>() + rows[..b].iter().filter(|&&r| r > l).count()
}

/// Valid entries `(block, rank)` of one (head, query): rank = index in ascending block order.
fn valid_entries(entries: &[i32], num_blocks: usize) -> Vec<(usize, usize)> {
    let mut valid: Vec<usize> = entries
        .iter()
        .filter(|&&e| e >= 0 && (e as usize) < num_blocks)
        .map(|&e| e as usize)
        .collect();
    valid.sort_unstable();
    valid
        .iter()
        .enumerate()
        .map(|(rank, &e)| (e, rank))
        .collect()
}

/// CSR row offsets start at 0, never decrease, and end at `edges`; the tail is -1.
fn check_offsets(row_ptr: &[i32], edges: usize, tails: [&[i32]; 2]) -> Result<(), String> {
    if row_ptr[0] != 0
        || row_ptr.windows(2).any(|w| w[0] > w[1])
        || *row_ptr.last().unwrap() as usize != edges
    {
        return Err(format!(
            "row_ptr {row_ptr:?} is not a prefix of {edges} edges"
        ));
    }
    if tails.iter().any(|t| t[edges..].iter().any(|&v| v != -1)) {
        return Err("the edge tail is not -1".into());
    }
    Ok(())
}

pub(super) fn check_k2q(layout: &VarlenLayout, topk: &[i32], csr: &K2qCsr) -> Result<(), String> {
    let (t, rows, cap) = (layout.total_q(), layout.total_rows(), layout.total_q() * 16);
    for h in 0..4 {
        let mut want = Vec::new();
        for q in 0..t {
            let (b, i, _) = layout.query_coords(q);
            let entries = &topk[(h * t + q) * 16..][..16];
            let valid = valid_entries(entries, layout.fragment(b).num_blocks);
            if csr.split_counts[q * 4 + h] != valid.len() as i32 {
                return Err(format!(
                    "split_counts[{q}, {h}] = {}",
                    csr.split_counts[q * 4 + h]
                ));
            }
            want.extend(
                valid
                    .into_iter()
                    .map(|(e, rank)| (row_closed_form(layout, b, e), i as i32, rank as i32)),
            );
        }
        let row_ptr = &csr.row_ptr[h * (rows + 1)..(h + 1) * (rows + 1)];
        let (qi, qs) = (
            &csr.q_indices[h * cap..(h + 1) * cap],
            &csr.qsplit[h * cap..(h + 1) * cap],
        );
        check_offsets(row_ptr, want.len(), [qi, qs])?;
        let mut got = Vec::new();
        for r in 0..rows {
            let span = row_ptr[r] as usize..row_ptr[r + 1] as usize;
            if qi[span.clone()].windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!(
                    "head {h} row {r}: queries {:?} do not ascend",
                    &qi[span]
                ));
            }
            for p in span {
                if qs[p] & 0xFF_FFFF != qi[p] {
                    return Err(format!("qsplit {} does not carry query {}", qs[p], qi[p]));
                }
                got.push((r, qi[p], qs[p] >> 24));
            }
        }
        want.sort_unstable();
        got.sort_unstable();
        if got != want {
            return Err(format!(
                "head {h}: CSR edges differ from the valid top-k entries"
            ));
        }
    }
    Ok(())
}

pub(super) fn check_physical(
    layout: &VarlenLayout,
    topk: &[i32],
    csr: &PhysicalCsr,
) -> Result<(), String> {
    let (t, blocks, cap) = (
        layout.total_q(),
        layout.padded_kv_blocks(),
        layout.total_q() * 16,
    );
    for h in 0..4 {
        let mut want = Vec::new();
        for q in 0..t {
            let (b, _, p) = layout.query_coords(q);
            let f = layout.fragment(b);
            for (e, rank) in valid_entries(&topk[(h * t + q) * 16..][..16], f.num_blocks) {
                // Keys of block e: the fragment's K range clipped to the block, then to p.
                let block_end = (128 * e + 128).min(f.k_len);
                let visible = (block_end.min(p + 1)).saturating_sub(128 * e);
                let pb = (f.k_base + 128 * f.first) / 128 + e;
                want.push((pb, q as i32, (visible | rank << 8) as i32));
            }
        }
        let row_ptr = &csr.row_ptr[h * (blocks + 1)..(h + 1) * (blocks + 1)];
        let (qi, valid) = (
            &csr.q_indices[h * cap..(h + 1) * cap],
            &csr.valid[h * cap..(h + 1) * cap],
        );
        check_offsets(row_ptr, want.len(), [qi, valid])?;
        let mut got = Vec::new();
        for pb in 0..blocks {
            let span = row_ptr[pb] as usize..row_ptr[pb + 1] as usize;
            if qi[span.clone()].windows(2).any(|w| w[0] >= w[1]) {
                return Err(format!("head {h} block {pb}: queries do not ascend"));
            }
            got.extend(span.map(|p| (pb, qi[p], valid[p])));
        }
        want.sort_unstable();
        got.sort_unstable();
        if got != want {
            return Err(format!(
                "head {h}: physical CSR edges differ from the valid top-k entries"
            ));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn k2q_csr_holds_exactly_the_valid_entries((l, t) in layouts_with_topk(config()), seed in any::<u64>()) {
        let t = with_noise(&l, &t, seed);
        ok(check_k2q(&l, &t, &build_k2q_csr(&l, &t).unwrap()))?;
    }

    #[test]
    fn physical_csr_holds_exactly_the_valid_entries((l, t) in layouts_with_topk(config()), seed in any::<u64>()) {
        let t = with_noise(&l, &t, seed);
        ok(check_physical(&l, &t, &build_physical_csr(&l, &t).unwrap()))?;
    }
}
