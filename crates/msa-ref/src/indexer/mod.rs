//! The lightning indexer (docs/contract.md §3.1): token scores `s_j = qi·ki_j / √128` over the
//! visible keys, block maxima, the Top-k selection and the LSE of the selected tokens.
//!
//! Queries are processed in tiles of up to 16 consecutive queries of one fragment, so each
//! key block is read once per tile rather than once per query.

mod rank;
#[cfg(test)]
mod tests;

use half::bf16;
use msa_plan::topology::{BLOCK_SIZE, INDEX_DIM, NUM_INDEX_HEADS, SOFTMAX_SCALE, TOPK_BLOCKS};
use msa_plan::VarlenLayout;
use rayon::prelude::*;

use crate::blocks::{BlockTable, KeyCache};
use crate::compare::widen;
use crate::error::{expect_indices, expect_len, Result};
use crate::gemm::dot_rows;
use crate::selection::{selected_blocks, topk_row, QueryPos, Selection};
use crate::softmax::{exp_shifted, lse, row_max};

/// Inputs of the indexer.
#[derive(Debug, Clone, Copy)]
pub struct IndexerInputs<'a> {
    pub layout: &'a VarlenLayout,
    /// Index queries `[T, 4, 128]`.
    pub qi: &'a [bf16],
    /// The shared index key head `[Tk, 1, 128]`.
    pub ki: &'a [bf16],
}

/// Indexer outputs, head-major.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexerOut {
    /// `[4, n, 16]`: n = T, or the number of queries asked for.
    pub topk: Vec<i32>,
    /// `[4, n]` natural-log LSE of the selected visible tokens.
    pub lse: Vec<f32>,
}

const TILE: usize = 16;
/// Elements of one query's `[4, 128]` index rows.
const QI_ROW: usize = NUM_INDEX_HEADS * INDEX_DIM;

impl IndexerInputs<'_> {
    fn check(&self) -> Result<()> {
        let (t, tk) = (self.layout.total_q(), self.layout.total_k());
        expect_len("qi", self.qi.len(), &[t, NUM_INDEX_HEADS, INDEX_DIM])?;
        expect_len("ki", self.ki.len(), &[tk, 1, INDEX_DIM])
    }

    fn qi_row(&self, q: usize, head: usize) -> &[bf16] {
        let at = q * QI_ROW + head * INDEX_DIM;
        &self.qi[at..at + INDEX_DIM]
    }

    /// f32 index keys of the given physical blocks.
    fn keys(&self, needed: &[bool]) -> KeyCache {
        KeyCache::new(&BlockTable::new(self.layout), self.ki, 1, needed)
    }

    /// Every block visible to some query of `queries`.
    fn visible_blocks(&self, queries: &[usize]) -> Vec<bool> {
        let mut needed = vec![false; self.layout.padded_kv_blocks()];
        for &q in queries {
            let pos = QueryPos::of(self.layout, q);
            needed[pos.phys_base..=pos.phys_base + pos.local_block()].fill(true);
        }
        needed
    }
}

/// Selection and LSE of every query.
pub fn forward(inputs: &IndexerInputs<'_>) -> Result<IndexerOut> {
    let all: Vec<usize> = (0..inputs.layout.total_q()).collect();
    forward_queries(inputs, &all)
}

/// Selection and LSE of the given packed queries, in the given order; equal to the same rows
/// of [`forward`].
pub fn forward_queries(inputs: &IndexerInputs<'_>, queries: &[usize]) -> Result<IndexerOut> {
    inputs.check()?;
    expect_indices("query", queries, inputs.layout.total_q())?;
    let ki = inputs.keys(&inputs.visible_blocks(queries));
    let per_query: Vec<([i32; TOPK_BLOCKS], f32)> = tiles(inputs.layout, queries)
        .par_iter()
        .map_init(Scratch::default, |s, tile| {
            let maxima = tile_maxima(inputs, &ki, tile, s);
            let mut rows = Vec::with_capacity(tile.len() * NUM_INDEX_HEADS);
            for (t, &q) in tile.iter().enumerate() {
                let pos = QueryPos::of(inputs.layout, q);
                let nb = maxima.len() / (tile.len() * NUM_INDEX_HEADS);
                for g in 0..NUM_INDEX_HEADS {
                    let at = (t * NUM_INDEX_HEADS + g) * nb;
                    let ids = rank::select(&maxima[at..at + nb], pos.local_block(), &mut s.ids);
                    let sel = Selection::new(&ids, &pos);
                    rows.push((ids, set_lse(inputs, &ki, q, g, &pos, &sel, &mut s.scores)));
                }
            }
            rows
        })
        .flatten()
        .collect();
    let n = queries.len();
    let mut out = IndexerOut {
        topk: vec![-1; NUM_INDEX_HEADS * n * TOPK_BLOCKS],
        lse: vec![0.0; NUM_INDEX_HEADS * n],
    };
    for (i, (ids, l)) in per_query.into_iter().enumerate() {
        let (t, g) = (i / NUM_INDEX_HEADS, i % NUM_INDEX_HEADS);
        let at = (g * n + t) * TOPK_BLOCKS;
        out.topk[at..at + TOPK_BLOCKS].copy_from_slice(&ids);
        out.lse[g * n + t] = l;
    }
    Ok(out)
}

/// Block scores of `query` for index `head`: the max of `s` over the visible tokens of each
/// block `0..=p/128`, in block order (for ranking checks).
pub fn block_scores(inputs: &IndexerInputs<'_>, head: usize, query: usize) -> Result<Vec<f32>> {
    inputs.check()?;
    expect_indices("query", &[query], inputs.layout.total_q())?;
    expect_indices("index head", &[head], NUM_INDEX_HEADS)?;
    let ki = inputs.keys(&inputs.visible_blocks(&[query]));
    let maxima = tile_maxima(inputs, &ki, &[query], &mut Scratch::default());
    let nb = maxima.len() / NUM_INDEX_HEADS;
    Ok(maxima[head * nb..(head + 1) * nb].to_vec())
}

/// LSE `[4, n]` of `s` over the token sets that `topk` (`[4, T, 16]`, any selection, read with
/// the attention's set semantics) gives the given queries; `-inf` for an empty set. Checks a
/// device selection that differs from [`forward`]'s at near-ties.
pub fn selection_lse(
    inputs: &IndexerInputs<'_>,
    topk: &[i32],
    queries: &[usize],
) -> Result<Vec<f32>> {
    inputs.check()?;
    let t = inputs.layout.total_q();
    expect_len("topk", topk.len(), &[NUM_INDEX_HEADS, t, TOPK_BLOCKS])?;
    expect_indices("query", queries, t)?;
    let per_group = selected_blocks(inputs.layout, topk, queries);
    let blocks = inputs.layout.padded_kv_blocks();
    let needed: Vec<bool> = (0..blocks)
        .map(|pb| per_group.iter().skip(pb).step_by(blocks).any(|&b| b))
        .collect();
    let ki = inputs.keys(&needed);
    let n = queries.len();
    let mut out = vec![0f32; NUM_INDEX_HEADS * n];
    let per_query: Vec<[f32; NUM_INDEX_HEADS]> = queries
        .par_iter()
        .map_init(Scratch::default, |s, &q| {
            let pos = QueryPos::of(inputs.layout, q);
            std::array::from_fn(|g| {
                let sel = Selection::new(topk_row(topk, t, g, q), &pos);
                set_lse(inputs, &ki, q, g, &pos, &sel, &mut s.scores)
            })
        })
        .collect();
    for (i, row) in per_query.iter().enumerate() {
        for (g, &l) in row.iter().enumerate() {
            out[g * n + i] = l;
        }
    }
    Ok(out)
}

#[derive(Default)]
struct Scratch {
    q: Vec<f32>,
    scores: Vec<f32>,
    ids: Vec<u32>,
}

/// Runs of up to 16 consecutive entries of `queries` in one fragment.
fn tiles(layout: &VarlenLayout, queries: &[usize]) -> Vec<Vec<usize>> {
    let mut tiles: Vec<Vec<usize>> = Vec::new();
    let mut last_fragment = usize::MAX;
    for &q in queries {
        let b = layout.query_fragment(q);
        match tiles.last_mut() {
            Some(tile) if b == last_fragment && tile.len() < TILE => tile.push(q),
            _ => tiles.push(vec![q]),
        }
        last_fragment = b;
    }
    tiles
}

/// Block maxima `[tile, 4, nb]` with `nb` = the blocks visible to the tile's last position;
/// entries of blocks a query cannot see are `-inf`.
fn tile_maxima(
    inputs: &IndexerInputs<'_>,
    ki: &KeyCache,
    tile: &[usize],
    s: &mut Scratch,
) -> Vec<f32> {
    let pos: Vec<QueryPos> = tile
        .iter()
        .map(|&q| QueryPos::of(inputs.layout, q))
        .collect();
    let last = pos
        .iter()
        .map(|p| p.position)
        .max()
        .expect("tiles are not empty");
    let nb = last / BLOCK_SIZE + 1;
    let rows = tile.len() * NUM_INDEX_HEADS;
    s.q.resize(rows * INDEX_DIM, 0.0);
    for (t, &q) in tile.iter().enumerate() {
        widen(
            &inputs.qi[q * QI_ROW..(q + 1) * QI_ROW],
            &mut s.q[t * QI_ROW..(t + 1) * QI_ROW],
        );
    }
    s.scores.resize(rows * BLOCK_SIZE, 0.0);
    let mut maxima = vec![f32::NEG_INFINITY; rows * nb];
    for e in 0..nb {
        let c = (last + 1 - e * BLOCK_SIZE).min(BLOCK_SIZE);
        dot_rows(&s.q, ki.block(0, pos[0].phys_base + e, c), &mut s.scores, c);
        for (t, p) in pos.iter().enumerate() {
            if p.local_block() < e {
                continue;
            }
            let visible = p.visible_keys(e);
            for g in 0..NUM_INDEX_HEADS {
                let row = t * NUM_INDEX_HEADS + g;
                let m = row_max(&s.scores[row * c..row * c + visible]);
                maxima[row * nb + e] = m * SOFTMAX_SCALE;
            }
        }
    }
    maxima
}

/// `logsumexp` of `s` over a token set of (query, head).
fn set_lse(
    inputs: &IndexerInputs<'_>,
    ki: &KeyCache,
    q: usize,
    g: usize,
    pos: &QueryPos,
    sel: &Selection,
    buf: &mut Vec<f32>,
) -> f32 {
    let n = sel.tokens();
    buf.resize(n.max(buf.len()), 0.0);
    let mut qf = [0f32; INDEX_DIM];
    widen(inputs.qi_row(q, g), &mut qf);
    let mut at = 0;
    for (e, c) in sel.blocks() {
        dot_rows(
            &qf,
            ki.block(0, pos.phys_base + e, c),
            &mut buf[at..at + c],
            c,
        );
        at += c;
    }
    let (m, sum) = exp_shifted(&mut buf[..n], SOFTMAX_SCALE);
    lse(m, sum)
}
