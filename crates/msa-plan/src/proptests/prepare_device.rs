//! The rule `msa_prepare_metadata` (kernels/src/prepare/) uses to build the CSRs on the device,
//! transliterated: one bit per (head, level, packed query) in a bitmap of 32-query words, a
//! popcount prefix per column, row counts as prefix differences over each fragment's query range,
//! a physical block's earlier edges from its document's earlier fragments, and every edge at its
//! row start plus the row's queries before it. It must equal `build_k2q_csr` and
//! `build_physical_csr` word for word on every layout and selection, invalid and repeated
//! entries included; the GPU suite checks the kernels themselves against the host.

use proptest::prelude::*;

use super::config;
use super::csr::with_noise;
use crate::csr::{build_k2q_csr, build_physical_csr, K2qCsr, PhysicalCsr};
use crate::layout::VarlenLayout;
use crate::testing::{layouts_with_topk, SplitMix64};
use crate::topology::BLOCK_SIZE;

const TILE: usize = 32;

struct Bitmap {
    words: Vec<u32>,
    prefix: Vec<i32>,
    levels: usize,
    stride: usize,
}

impl Bitmap {
    fn column(&self, head: usize, level: usize) -> usize {
        (head * self.levels + level) * self.stride
    }
    /// Set bits of a column at packed queries < x.
    fn before(&self, col: usize, x: usize) -> i32 {
        let below = (1u64 << (x % TILE)) as u32 - 1;
        self.prefix[col + x / TILE] + (self.words[col + x / TILE] & below).count_ones() as i32
    }
}

/// `(edges, rank of each slot)` of one row: slot s is an edge iff valid and no earlier slot
/// holds its value; the rank counts the row's valid entries below it.
fn row_edges(entries: &[i32], num_blocks: usize) -> (Vec<bool>, Vec<i32>) {
    let valid = |e: i32| e >= 0 && (e as usize) < num_blocks;
    let edge = (0..16)
        .map(|s| valid(entries[s]) && !entries[..s].contains(&entries[s]))
        .collect();
    let rank = (0..16)
        .map(|s| {
            entries
                .iter()
                .filter(|&&o| valid(o) && o < entries[s])
                .count() as i32
        })
        .collect();
    (edge, rank)
}

fn exclusive_scan(counts: &[i32]) -> Vec<i32> {
    let mut out = Vec::with_capacity(counts.len() + 1);
    let mut acc = 0;
    for &c in counts {
        out.push(acc);
        acc += c;
    }
    out.push(acc);
    out
}

fn device_rule(l: &VarlenLayout, topk: &[i32]) -> (K2qCsr, PhysicalCsr) {
    let (t, rows, blocks, frags) = (
        l.total_q(),
        l.total_rows(),
        l.padded_kv_blocks(),
        l.fragments(),
    );
    let cap = t * 16;
    let tiles = t.div_ceil(TILE);
    let mut bm = Bitmap {
        levels: l.max_blocks().max(1),
        stride: tiles + 1,
        words: Vec::new(),
        prefix: Vec::new(),
    };
    bm.words = vec![0; 4 * bm.levels * bm.stride];
    let qf = l.query_fragments();
    let mut split_counts = vec![0; t * 4];
    // The select phase.
    for h in 0..4 {
        for q in 0..t {
            let f = &frags[qf[q] as usize];
            let entries = &topk[(h * t + q) * 16..][..16];
            let (edge, _) = row_edges(entries, f.num_blocks);
            split_counts[q * 4 + h] = edge.iter().filter(|&&e| e).count() as i32;
            for s in (0..16).filter(|&s| edge[s] && (entries[s] as usize) < bm.levels) {
                let col = bm.column(h, entries[s] as usize);
                bm.words[col + q / TILE] |= 1 << (q % TILE);
            }
        }
    }
    // The level phase: prefixes, rows, counts.
    bm.prefix = vec![0; bm.words.len()];
    for col in (0..bm.words.len()).step_by(bm.stride) {
        let mut acc = 0;
        for w in 0..bm.stride {
            bm.prefix[col + w] = acc;
            acc += bm.words[col + w].count_ones() as i32;
        }
    }
    let (mut counts, mut row_first, mut phys_shift) =
        (vec![0; 4 * rows], vec![0; 4 * rows], vec![0; 4 * rows]);
    let mut phys_counts = vec![0; 4 * blocks];
    let mut row_offsets = vec![0; frags.len() + 1];
    for b in 0..frags.len() {
        row_offsets[b + 1] = row_offsets[b] + frags[b].num_blocks;
    }
    let mut row_map = vec![0usize; rows];
    for level in 0..bm.levels {
        let mut row: usize = frags.iter().map(|f| f.num_blocks.min(level)).sum();
        for (b, f) in frags.iter().enumerate() {
            if f.num_blocks <= level {
                continue;
            }
            row_map[row_offsets[b] + level] = row;
            for h in 0..4 {
                let col = bm.column(h, level);
                let bits_before = bm.before(col, f.q_start);
                let count = bm.before(col, f.q_start + f.q_len) - bits_before;
                let earlier: i32 = (f.first..b)
                    .filter(|&e| frags[e].first == f.first)
                    .map(|e| {
                        bm.before(col, frags[e].q_start + frags[e].q_len)
                            - bm.before(col, frags[e].q_start)
                    })
                    .sum();
                counts[h * rows + row] = count;
                row_first[h * rows + row] = bits_before;
                phys_shift[h * rows + row] = earlier - bits_before;
                phys_counts[h * blocks + f.phys_base + level] += count;
            }
            row += 1;
        }
    }
    let mut k2q = K2qCsr {
        rows,
        total_q: t,
        row_ptr: Vec::new(),
        q_indices: vec![-1; 4 * cap],
        qsplit: vec![-1; 4 * cap],
        split_counts,
    };
    let mut phys = PhysicalCsr {
        blocks,
        total_q: t,
        row_ptr: Vec::new(),
        q_indices: vec![-1; 4 * cap],
        valid: vec![-1; 4 * cap],
    };
    for h in 0..4 {
        k2q.row_ptr
            .extend(exclusive_scan(&counts[h * rows..(h + 1) * rows]));
        phys.row_ptr
            .extend(exclusive_scan(&phys_counts[h * blocks..(h + 1) * blocks]));
    }
    // The scatter phase.
    for h in 0..4 {
        for q in 0..t {
            let b = qf[q] as usize;
            let f = &frags[b];
            let entries = &topk[(h * t + q) * 16..][..16];
            let (edge, rank) = row_edges(entries, f.num_blocks);
            let (local, pos) = (q - f.q_start, f.position(q - f.q_start));
            for s in (0..16).filter(|&s| edge[s] && (entries[s] as usize) < bm.levels) {
                let level = entries[s] as usize;
                let row = row_map[row_offsets[b] + level];
                let before = bm.before(bm.column(h, level), q);
                let k2q_at = h * cap
                    + (k2q.row_ptr[h * (rows + 1) + row] + before - row_first[h * rows + row])
                        as usize;
                k2q.q_indices[k2q_at] = local as i32;
                k2q.qsplit[k2q_at] = local as i32 | rank[s] << 24;
                let block_keys = (f.k_len - level * BLOCK_SIZE).min(BLOCK_SIZE);
                let visible = block_keys.min((pos + 1).saturating_sub(level * BLOCK_SIZE));
                let phys_at = h * cap
                    + (phys.row_ptr[h * (blocks + 1) + f.phys_base + level]
                        + before
                        + phys_shift[h * rows + row]) as usize;
                phys.q_indices[phys_at] = q as i32;
                phys.valid[phys_at] = visible as i32 | rank[s] << 8;
            }
        }
    }
    (k2q, phys)
}

/// Copy an existing entry of some rows into a later padding slot (a `DUPLICATE` fault).
fn with_repeats(topk: &[i32], seed: u64) -> Vec<i32> {
    let mut r = SplitMix64::new(seed);
    let mut out = topk.to_vec();
    for row in out.chunks_mut(16) {
        if let Some(s) = (1..16).find(|&s| row[s] == -1) {
            if r.chance(1, 8) && row[0] != -1 {
                row[s] = row[r.below(s)];
            }
        }
    }
    out
}

fn check_device_rule(l: &VarlenLayout, topk: &[i32]) -> Result<(), String> {
    let (k2q, phys) = device_rule(l, topk);
    let host_k2q = build_k2q_csr(l, topk).map_err(|e| e.to_string())?;
    let host_phys = build_physical_csr(l, topk).map_err(|e| e.to_string())?;
    if k2q != host_k2q {
        return Err(format!("k2q CSR differs for {l:?}"));
    }
    if phys != host_phys {
        return Err(format!("physical CSR differs for {l:?}"));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn device_csr_rule_equals_the_host_csrs((l, topk) in layouts_with_topk(config()), seed: u64) {
        super::ok(check_device_rule(&l, &topk))?;
        let faulty = with_repeats(&with_noise(&l, &topk, seed), seed ^ 0x5eed);
        super::ok(check_device_rule(&l, &faulty))?;
    }
}
