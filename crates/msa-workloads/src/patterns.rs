//! Top-k selection generators for attention tests and benchmarks: MSA's `make_torch_topk`
//! (`recent16`), the indexer's own choice, and the adversarial patterns of MSA's
//! `topk_patterns.py` (docs/contract.md §6.4).
//!
//! For a query at document position p with local block L = p/128, every pattern emits exactly
//! n = min(L+1, 16) valid entries — unique, causal (≤ L), the local block L last — then -1.
//! Every valid selection covers the same number of keys, so the FLOP model's S is exact for all.
//! Random draws stay in draw order (MSA's top-k entries are unordered; kernels must not assume
//! sorted rows).

use std::fmt;
use std::str::FromStr;

use msa_plan::topology::{BLOCK_SIZE, NUM_KV_HEADS, TOPK_BLOCKS};
use msa_plan::VarlenLayout;
use msa_ref::indexer::{self, IndexerInputs};
use rayon::prelude::*;

use crate::error::WorkloadError;
use crate::inputs::{InputMode, Rng, Tensor, PATTERN_DOMAIN};

/// The pool sizes of `pool-N`.
pub const POOL_SIZES: [usize; 5] = [16, 32, 64, 128, 256];

/// Share of queries that select block 0 under `b0p99`.
const SINK_SHARE: f64 = 0.99;

/// A selection pattern (names as in `Display`/`FromStr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pattern {
    /// `recent16`: the n most recent blocks L+1−n … L, ascending
    /// ([`msa_plan::topk::recent_topk`], the one copy of MSA's `make_torch_topk`).
    Recent16,
    /// `indexer`: `msa_ref::indexer::forward` on the seeded `qi`/`ki` of the same seed.
    Indexer,
    /// `b0p99`: each query independently with probability 0.99 (and L ≥ 1) takes block 0,
    /// then n−2 distinct uniform blocks of [1, L), then L; the others are `recent16`.
    B0p99,
    /// `random`: n−1 distinct uniform blocks of [0, L), then L.
    Random,
    /// `spread`: ⌊k·L/(n−1)⌋ for k = 0 … n−1, evenly spaced over [0, L], ending at L.
    Spread,
    /// `pool-N`: per (group, document) a pool of N distinct uniform blocks of the document's
    /// blocks in this layout (all of them when it has ≤ N); each query draws n−1 distinct blocks of
    /// pool ∩ [0, L) and, if that has fewer, takes all of it and fills with the most recent
    /// other blocks below L; then L.
    Pool(usize),
    /// `hot15_tail1`: blocks 0 … 14 shared by every query, then L (all blocks when n < 16).
    Hot15Tail1,
    /// `hot8_tail8`: blocks 0 … 7, then the 8 most recent L−7 … L (all blocks when n < 16).
    Hot8Tail8,
}

impl Pattern {
    /// The patterns every backend is verified on.
    pub const fn verification_set() -> [Pattern; 5] {
        [
            Pattern::Recent16,
            Pattern::Indexer,
            Pattern::B0p99,
            Pattern::Random,
            Pattern::Spread,
        ]
    }

    /// Every pattern: the verification set, the pools, then the hot patterns.
    pub const fn all() -> [Pattern; 12] {
        [
            Pattern::Recent16,
            Pattern::Indexer,
            Pattern::B0p99,
            Pattern::Random,
            Pattern::Spread,
            Pattern::Pool(16),
            Pattern::Pool(32),
            Pattern::Pool(64),
            Pattern::Pool(128),
            Pattern::Pool(256),
            Pattern::Hot15Tail1,
            Pattern::Hot8Tail8,
        ]
    }

    /// The stream path elements `[tag, parameter]` of the randomized patterns.
    fn stream_id(self) -> [u64; 2] {
        match self {
            Pattern::Random => [1, 0],
            Pattern::B0p99 => [2, 0],
            Pattern::Pool(n) => [3, n as u64],
            _ => [0, 0],
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Recent16 => f.write_str("recent16"),
            Pattern::Indexer => f.write_str("indexer"),
            Pattern::B0p99 => f.write_str("b0p99"),
            Pattern::Random => f.write_str("random"),
            Pattern::Spread => f.write_str("spread"),
            Pattern::Pool(n) => write!(f, "pool-{n}"),
            Pattern::Hot15Tail1 => f.write_str("hot15_tail1"),
            Pattern::Hot8Tail8 => f.write_str("hot8_tail8"),
        }
    }
}

impl FromStr for Pattern {
    type Err = WorkloadError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Pattern::all()
            .into_iter()
            .find(|p| p.to_string() == s)
            .ok_or_else(|| WorkloadError::UnknownPattern(s.to_string()))
    }
}

/// `topk_indices` `[4, T, 16]` (head-major) of `pattern` for `layout`. Group g draws from the
/// stream `[2, tag, parameter, g]` under `seed` (query by query in packed order) and its pools
/// from `[2, tag, parameter, g, f]` (f: the document's first fragment).
pub fn make_topk(layout: &VarlenLayout, pattern: Pattern, seed: u64) -> Vec<i32> {
    make_topk_in(layout, pattern, seed, InputMode::Msa)
}

/// [`make_topk`] for inputs drawn under `mode`: only `indexer` depends on it (the indexer runs
/// on the qi/ki of that mode, before any peak is planted).
pub fn make_topk_in(
    layout: &VarlenLayout,
    pattern: Pattern,
    seed: u64,
    mode: InputMode,
) -> Vec<i32> {
    if pattern == Pattern::Recent16 {
        return msa_plan::topk::recent_topk(layout);
    }
    if pattern == Pattern::Indexer {
        let qi = Tensor::Qi.generate_in(layout, seed, mode);
        let ki = Tensor::Ki.generate_in(layout, seed, mode);
        // The generated qi/ki always have the layout's sizes, the only thing forward checks.
        return indexer::forward(&IndexerInputs {
            layout,
            qi: &qi,
            ki: &ki,
        })
        .expect("generated qi/ki match the layout")
        .topk;
    }
    let per_group = layout.total_q() * TOPK_BLOCKS;
    let mut topk = vec![-1i32; NUM_KV_HEADS * per_group];
    topk.par_chunks_mut(per_group)
        .enumerate()
        .for_each(|(g, out)| fill_group(layout, pattern, seed, g as u64, out));
    topk
}

fn fill_group(layout: &VarlenLayout, pattern: Pattern, seed: u64, g: u64, out: &mut [i32]) {
    let [tag, param] = pattern.stream_id();
    let mut rng = Rng::stream(seed, &[PATTERN_DOMAIN, tag, param, g]);
    let pools = match pattern {
        Pattern::Pool(n) => document_pools(layout, n, |f| {
            Rng::stream(seed, &[PATTERN_DOMAIN, tag, param, g, f as u64])
        }),
        _ => Vec::new(),
    };
    let (mut sel, mut scratch) = (
        Vec::with_capacity(TOPK_BLOCKS),
        Vec::with_capacity(TOPK_BLOCKS),
    );
    for f in layout.fragments() {
        for i in 0..f.q_len {
            let local = f.position(i) / BLOCK_SIZE;
            let n = (local + 1).min(TOPK_BLOCKS);
            sel.clear();
            match pattern {
                Pattern::Hot15Tail1 => hot_tail(15, local, n, &mut sel),
                Pattern::Hot8Tail8 => hot_tail(8, local, n, &mut sel),
                Pattern::Spread => sel.extend((0..n - 1).map(|k| k * local / (n - 1))),
                Pattern::Random => floyd(&mut rng, n - 1, local, &mut sel),
                Pattern::B0p99 => {
                    if rng.uniform() < SINK_SHARE && n >= 2 {
                        sel.push(0);
                        floyd(&mut rng, n - 2, local - 1, &mut scratch);
                        sel.extend(scratch.drain(..).map(|b| b + 1));
                    } else {
                        // The recent16 rows.
                        hot_tail(0, local, n, &mut sel);
                    }
                }
                Pattern::Pool(_) => {
                    from_pool(&mut rng, &pools[f.first], local, n, &mut sel, &mut scratch)
                }
                Pattern::Recent16 | Pattern::Indexer => {
                    unreachable!("computed by msa_plan::topk and msa-ref")
                }
            }
            sel.push(local);
            debug_assert_eq!(sel.len(), n);
            let row = &mut out[(f.q_start + i) * TOPK_BLOCKS..][..n];
            for (slot, &b) in row.iter_mut().zip(&sel) {
                *slot = b as i32;
            }
        }
    }
}

/// The non-local part of "blocks 0 … h−1, then the most recent": h = min(hot, n−1), then the
/// n−1−h blocks just below `local`.
fn hot_tail(hot: usize, local: usize, n: usize, sel: &mut Vec<usize>) {
    let h = hot.min(n - 1);
    sel.extend(0..h);
    sel.extend(local + 1 + h - n..local);
}

/// Floyd's sampling: appends k distinct uniform values of [0, m) using exactly k draws.
fn floyd(rng: &mut Rng, k: usize, m: usize, out: &mut Vec<usize>) {
    let start = out.len();
    for j in m - k..m {
        let t = rng.below(j as u64 + 1) as usize;
        let v = if out[start..].contains(&t) { j } else { t };
        out.push(v);
    }
}

/// Sorted pools indexed by each document's first fragment (empty for the other fragments).
fn document_pools(
    layout: &VarlenLayout,
    n: usize,
    stream: impl Fn(usize) -> Rng,
) -> Vec<Vec<usize>> {
    let frags = layout.fragments();
    let mut pools = vec![Vec::new(); frags.len()];
    for (b, f) in frags.iter().enumerate() {
        // Fragments of a document are consecutive; its last one has the longest K range.
        if frags.get(b + 1).is_some_and(|next| next.first == f.first) {
            continue;
        }
        let blocks = f.num_blocks;
        let pool = &mut pools[f.first];
        if blocks <= n {
            pool.extend(0..blocks);
        } else {
            floyd(&mut stream(f.first), n, blocks, pool);
            pool.sort_unstable();
        }
    }
    pools
}

fn from_pool(
    rng: &mut Rng,
    pool: &[usize],
    local: usize,
    n: usize,
    sel: &mut Vec<usize>,
    scratch: &mut Vec<usize>,
) {
    let cand = &pool[..pool.partition_point(|&b| b < local)];
    let want = n - 1;
    if cand.len() >= want {
        floyd(rng, want, cand.len(), scratch);
        sel.extend(scratch.drain(..).map(|i| cand[i]));
    } else {
        sel.extend_from_slice(cand);
        let fill = (0..local).rev().filter(|b| cand.binary_search(b).is_err());
        sel.extend(fill.take(want - cand.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cp::{split_pack, CpConfig};

    /// Every rank of a CP split of `cu` (fragmented documents, shared K).
    fn rank_layouts(cu: &[i32], cp_size: usize, chunk_size: usize) -> Vec<VarlenLayout> {
        let ranks = split_pack(
            0,
            cu,
            &CpConfig {
                cp_size,
                chunk_size,
            },
        )
        .unwrap();
        ranks.into_iter().map(|r| r.layout().clone()).collect()
    }

    /// The contract of every pattern: n = min(L+1, 16) unique causal entries, local last, -1.
    fn assert_invariants(layout: &VarlenLayout, topk: &[i32], pattern: Pattern) {
        let t = layout.total_q();
        assert_eq!(topk.len(), NUM_KV_HEADS * t * TOPK_BLOCKS);
        for g in 0..NUM_KV_HEADS {
            for q in 0..t {
                let (_, _, p) = layout.query_coords(q);
                let local = (p / BLOCK_SIZE) as i32;
                let n = (p / BLOCK_SIZE + 1).min(TOPK_BLOCKS);
                let row = &topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS];
                let ctx = || format!("{pattern} group {g} query {q} (p = {p}): {row:?}");
                assert!(
                    row[..n].iter().all(|&b| (0..=local).contains(&b)),
                    "{}",
                    ctx()
                );
                assert_eq!(row[n - 1], local, "{}", ctx());
                assert!(row[n..].iter().all(|&b| b == -1), "{}", ctx());
                let mut sorted = row[..n].to_vec();
                sorted.sort_unstable();
                sorted.dedup();
                assert_eq!(sorted.len(), n, "duplicates: {}", ctx());
            }
        }
    }

    fn row(topk: &[i32], layout: &VarlenLayout, g: usize, q: usize) -> Vec<i32> {
        let t = layout.total_q();
        topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS]
            .iter()
            .copied()
            .filter(|&b| b >= 0)
            .collect()
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_listed() {
        for p in Pattern::all() {
            assert_eq!(p.to_string().parse::<Pattern>().unwrap(), p);
        }
        let names: Vec<String> = Pattern::verification_set()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(names, ["recent16", "indexer", "b0p99", "random", "spread"]);
        let e = "pool-17".parse::<Pattern>().unwrap_err().to_string();
        assert!(
            e.contains("unknown selection pattern `pool-17` (known: recent16, indexer,"),
            "{e}"
        );
        assert!(e.ends_with("pool-256, hot15_tail1, hot8_tail8)"), "{e}");
    }

    #[test]
    fn generated_patterns_keep_the_invariants_on_fragment_layouts() {
        // A 40K-token document (313 blocks, more than the largest pool) plus short ones, split
        // over 4 ranks: fragments of one document share K; L reaches 312.
        let cu = [0, 40_000, 40_100, 43_000, 49_152];
        for layout in rank_layouts(&cu, 4, 1024) {
            for p in Pattern::all()
                .into_iter()
                .filter(|&p| p != Pattern::Indexer)
            {
                assert_invariants(&layout, &make_topk(&layout, p, 5), p);
            }
        }
    }

    #[test]
    fn indexer_pattern_is_the_indexer_on_the_seeded_inputs() {
        // A rank of a 2,300 + 260 token pack: fragments of document 0 reach past 16 blocks.
        let layouts = rank_layouts(&[0, 2300, 2560], 2, 128);
        assert!(layouts[1].batch() > 2 && layouts[1].max_blocks() > 16);
        let topk = make_topk(&layouts[1], Pattern::Indexer, 9);
        assert_invariants(&layouts[1], &topk, Pattern::Indexer);
        // The same qi/ki as `Inputs::generate` with the same seed.
        let small = VarlenLayout::documents(&[0, 300, 330]).unwrap();
        let inputs = crate::inputs::Inputs::generate(&small, 9);
        let own = indexer::forward(&IndexerInputs {
            layout: &small,
            qi: &inputs.qi,
            ki: &inputs.ki,
        })
        .unwrap();
        assert_eq!(make_topk(&small, Pattern::Indexer, 9), own.topk);
    }

    #[test]
    fn deterministic_patterns_are_exact() {
        let layout = VarlenLayout::documents(&[0, 4096]).unwrap();
        let p = 30 * 128 + 5; // L = 30
        let recent = make_topk(&layout, Pattern::Recent16, 0);
        assert_eq!(row(&recent, &layout, 2, p), (15..=30).collect::<Vec<_>>());
        assert_eq!(row(&recent, &layout, 0, 3 * 128), [0, 1, 2, 3]);
        let spread = make_topk(&layout, Pattern::Spread, 0);
        assert_eq!(
            row(&spread, &layout, 1, p),
            (0..=15).map(|k| 2 * k).collect::<Vec<_>>()
        );
        let hot15 = make_topk(&layout, Pattern::Hot15Tail1, 0);
        assert_eq!(
            row(&hot15, &layout, 3, p),
            (0..15).chain([30]).collect::<Vec<_>>()
        );
        let hot8 = make_topk(&layout, Pattern::Hot8Tail8, 0);
        assert_eq!(
            row(&hot8, &layout, 0, p),
            (0..8).chain(23..=30).collect::<Vec<_>>()
        );
        assert_eq!(
            row(&hot8, &layout, 0, 15 * 128),
            (0..16).collect::<Vec<_>>()
        );
    }

    #[test]
    fn random_patterns_are_seeded_per_group() {
        let layout = VarlenLayout::documents(&[0, 4096]).unwrap();
        let a = make_topk(&layout, Pattern::Random, 1);
        assert_eq!(a, make_topk(&layout, Pattern::Random, 1));
        assert_ne!(a, make_topk(&layout, Pattern::Random, 2));
        let t = layout.total_q() * TOPK_BLOCKS;
        assert_ne!(a[..t], a[t..2 * t], "groups draw their own randomness");
        // Frozen: from an independent Python transcription of the streams, `below` and Floyd.
        assert_eq!(
            row(&a, &layout, 2, 3845),
            [6, 9, 2, 0, 19, 15, 10, 22, 23, 5, 4, 8, 27, 14, 29, 30]
        );
        assert_eq!(
            row(&a, &layout, 2, 4095),
            [13, 1, 17, 18, 11, 0, 22, 10, 8, 19, 26, 27, 28, 14, 24, 31]
        );
    }

    #[test]
    fn b0p99_sends_99_percent_of_queries_to_block_0() {
        let layout = VarlenLayout::documents(&[0, 65_536]).unwrap();
        let topk = make_topk(&layout, Pattern::B0p99, 3);
        // Queries at L >= 16: recent16 never holds block 0 there, so slot 0 tells the branch.
        let (mut sink, mut total) = (0, 0);
        for g in 0..NUM_KV_HEADS {
            for q in 16 * 128..layout.total_q() {
                total += 1;
                sink += usize::from(topk[(g * layout.total_q() + q) * TOPK_BLOCKS] == 0);
            }
        }
        let share = sink as f64 / total as f64;
        assert!((share - 0.99).abs() < 0.002, "{share} of {total}");
    }

    #[test]
    fn pool_queries_draw_from_one_pool_per_document() {
        // Two documents of 64 blocks: the 128 queries of a document's last block each take 15
        // non-local blocks, all from the same pool of N.
        let layout = VarlenLayout::documents(&[0, 8192, 16_384]).unwrap();
        for n in [16, 32] {
            let topk = make_topk(&layout, Pattern::Pool(n), 4);
            for g in 0..NUM_KV_HEADS {
                for end in [8192, 16_384] {
                    let mut used: Vec<i32> = (end - 128..end)
                        .flat_map(|q| row(&topk, &layout, g, q)[..15].to_vec())
                        .collect();
                    used.sort_unstable();
                    used.dedup();
                    assert!(
                        (15..=n).contains(&used.len()),
                        "pool-{n}, group {g}: {} blocks used",
                        used.len()
                    );
                }
            }
        }
    }
}
