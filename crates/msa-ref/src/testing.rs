//! Test inputs: bf16 normals drawn with msa-plan's test generator (`msa_plan::testing`, which
//! also gives the selections), and the packed queries of a layout. The f64 oracle the tests
//! judge the reference with is `msa-oracle`, shared with the harness's checks.

use half::bf16;
use msa_plan::peak::{peak_key, PEAK_WEIGHT};
use msa_plan::testing::SplitMix64;
use msa_plan::topology::{BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, TOPK_BLOCKS};
use msa_plan::VarlenLayout;

/// `n` bf16 values `N(0,1)·std`, never zero.
pub(crate) fn bf16s(rng: &mut SplitMix64, n: usize, std: f64) -> Vec<bf16> {
    (0..n)
        .map(|_| loop {
            let x = bf16::from_f64(rng.normal() * std);
            if x.to_f32() != 0.0 {
                break x;
            }
        })
        .collect()
}

pub(crate) fn to_f64(x: &[bf16]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Every packed query with its document position and number of key blocks.
pub(crate) fn queries(layout: &VarlenLayout) -> Vec<(usize, usize, usize)> {
    let mut out = Vec::new();
    for f in layout.fragments() {
        for i in 0..f.q_len {
            out.push((f.q_start + i, f.position(i), f.num_blocks));
        }
    }
    out
}

/// Whether key `j` (document-local) is in the token set of (query, group), straight from the
/// definition: its block is listed and `j <= p`.
pub(crate) fn in_set(topk: &[i32], t: usize, g: usize, q: usize, p: usize, j: usize) -> bool {
    let row = &topk[(g * t + q) * TOPK_BLOCKS..][..TOPK_BLOCKS];
    j <= p && row.contains(&((j / BLOCK_SIZE) as i32))
}

/// Plant the maximum-score keys of peaked inputs (docs/contract.md §7.3, the rule of
/// `msa_plan::peak`): for each query t and group g with a non-empty token set under `topk`, the
/// `heads`-per-group rows of `q` (`[T, heads·G, 128]`, G groups) get `PEAK_WEIGHT·k[r*, g]`.
/// With `heads = 16` this plants the attention's q from k `[Tk, 4, 128]`; with `heads = 1`
/// the index queries qi `[T, 4, 128]` from ki `[Tk, 1, 128]` (`key_groups = 1`).
pub(crate) fn plant_peaks(
    layout: &VarlenLayout,
    topk: &[i32],
    q: &mut [bf16],
    heads: usize,
    k: &[bf16],
    key_groups: usize,
    seed: u64,
) {
    let mut rng = SplitMix64::new(seed);
    for t in 0..layout.total_q() {
        for g in 0..NUM_KV_HEADS {
            let pick = rng.next_u64();
            let Some(r) = peak_key(layout, topk, t, g, pick) else {
                continue;
            };
            let kg = g % key_groups;
            let krow = &k[(r * key_groups + kg) * HEAD_DIM..][..HEAD_DIM];
            for h in g * heads..(g + 1) * heads {
                let row = &mut q[(t * NUM_KV_HEADS * heads + h) * HEAD_DIM..][..HEAD_DIM];
                for (x, y) in row.iter_mut().zip(krow) {
                    *x = bf16::from_f64(x.to_f64() + PEAK_WEIGHT * y.to_f64());
                }
            }
        }
    }
}
