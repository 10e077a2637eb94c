//! The indexer's Top-k rule (docs/contract.md §3.1): the top `min(15, local)` non-local blocks by
//! (score desc, id asc) in that order, then the local block, then -1 padding.

use std::cmp::Ordering;

use msa_plan::topology::TOPK_BLOCKS;

/// `-0.0` and `0.0` are the same score (a tie broken by id), so compare canonical values.
fn by_score_then_id(scores: &[f32], a: u32, b: u32) -> Ordering {
    let (sa, sb) = (scores[a as usize] + 0.0, scores[b as usize] + 0.0);
    sb.total_cmp(&sa).then(a.cmp(&b))
}

/// Select from the visible block maxima `scores[0..=local]`; `candidates` is reused scratch.
pub(crate) fn select(
    scores: &[f32],
    local: usize,
    candidates: &mut Vec<u32>,
) -> [i32; TOPK_BLOCKS] {
    let k = local.min(TOPK_BLOCKS - 1);
    candidates.clear();
    candidates.extend(0..local as u32);
    let cmp = |a: &u32, b: &u32| by_score_then_id(scores, *a, *b);
    if k < candidates.len() {
        candidates.select_nth_unstable_by(k, cmp);
    }
    candidates[..k].sort_unstable_by(cmp);
    let mut out = [-1i32; TOPK_BLOCKS];
    for (o, &c) in out.iter_mut().zip(&candidates[..k]) {
        *o = c as i32;
    }
    out[k] = local as i32;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_smaller_id_and_local_comes_last() {
        let mut scratch = Vec::new();
        // All-zero inputs with 2304 keys (docs/contract.md §3.1): blocks 0..14, then local 17.
        let zeros = [0f32; 18];
        let want: Vec<i32> = (0..15).chain([17]).collect();
        assert_eq!(select(&zeros, 17, &mut scratch)[..], want[..]);

        let mut scores = [0f32; 18];
        scores[3] = -0.0;
        scores[9] = 2.0;
        scores[5] = 2.0;
        scores[16] = -1.0;
        scores[17] = 99.0; // the local block's own score never ranks
        let got = select(&scores, 17, &mut scratch);
        let want: Vec<i32> = [5, 9, 0, 1, 2, 3, 4, 6, 7, 8, 10, 11, 12, 13, 14, 17].to_vec();
        assert_eq!(got[..], want[..]);

        let few = select(&[1.0, 3.0, 2.0, 0.0], 3, &mut scratch);
        assert_eq!(few[..5], [1, 2, 0, 3, -1]);
        assert_eq!(select(&[5.0], 0, &mut scratch)[..2], [0, -1]);
    }
}
