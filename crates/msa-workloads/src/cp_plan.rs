//! The data movement of one MSA call spread over CP ranks (TransformerEngine's KV all-gather),
//! as row maps with no transport: every rank holds the tokens of its chunks (the dispatch of
//! [`crate::cp`], any CP size), all-gathers K, V and KI rank-major, builds its packed K/V from
//! the gathered rows, runs its local call, and scatters its packed key gradients back to the
//! gathered rows, where a reduce-scatter (sum over ranks, split rank-major) hands each rank the
//! key gradients of its own chunks (docs/cp.md).

use msa_plan::VarlenLayout;

use crate::cp::{split_pack, CpConfig, RankCase};
use crate::error::{Result, WorkloadError};
use crate::manifest::check_cu_seqlens;

/// `len` rows copied from row `src` of one tensor to row `dst` of another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

impl Segment {
    /// The same rows the other way.
    pub fn inverse(self) -> Self {
        Self {
            src: self.dst,
            dst: self.src,
            len: self.len,
        }
    }
}

/// Appends `s`, merged into the last segment when both sides continue it.
fn push_merged(segs: &mut Vec<Segment>, s: Segment) {
    match segs.last_mut() {
        Some(l) if l.src + l.len == s.src && l.dst + l.len == s.dst => l.len += s.len,
        _ => segs.push(s),
    }
}

/// `dst[s.dst..][..s.len] = src[s.src..][..s.len]` for every segment, in rows of `width`.
pub fn copy_rows<T: Copy>(src: &[T], dst: &mut [T], width: usize, segs: &[Segment]) {
    for s in segs {
        dst[s.dst * width..(s.dst + s.len) * width]
            .copy_from_slice(&src[s.src * width..(s.src + s.len) * width]);
    }
}

/// `dst[s.dst..][..s.len] += src[s.src..][..s.len]` for every segment, in rows of `width`.
pub fn add_rows(src: &[f32], dst: &mut [f32], width: usize, segs: &[Segment]) {
    for s in segs {
        let d = &mut dst[s.dst * width..(s.dst + s.len) * width];
        for (d, x) in d
            .iter_mut()
            .zip(&src[s.src * width..(s.src + s.len) * width])
        {
            *d += x;
        }
    }
}

/// A group-major tensor `[groups, rows, width]` (a selection `[4, T, 16]`, an index LSE
/// `[4, T]`) with `segs` applied to the rows of each group: `[groups, dst_rows, width]`.
pub fn copy_grouped<T: Copy + Default>(
    src: &[T],
    groups: usize,
    width: usize,
    segs: &[Segment],
    dst_rows: usize,
) -> Vec<T> {
    let src_group = src.len() / groups;
    let dst_group = dst_rows * width;
    let mut dst = vec![T::default(); groups * dst_group];
    for (s, d) in src
        .chunks_exact(src_group)
        .zip(dst.chunks_exact_mut(dst_group))
    {
        copy_rows(s, d, width, segs);
    }
    dst
}

/// The first `tokens` tokens of a pack: its documents up to there, the last one cut.
pub fn truncate_pack(cu_seqlens: &[i32], tokens: usize) -> Result<Vec<i32>> {
    check_cu_seqlens(cu_seqlens).map_err(|r| WorkloadError::Pack(format!("cu_seqlens {r}")))?;
    let total = *cu_seqlens.last().unwrap() as usize;
    if tokens == 0 || tokens > total {
        return Err(WorkloadError::Pack(format!(
            "cannot keep {tokens} tokens of a {total}-token pack"
        )));
    }
    let mut cu: Vec<i32> = cu_seqlens
        .iter()
        .copied()
        .take_while(|&x| (x as usize) < tokens)
        .collect();
    cu.push(tokens as i32);
    Ok(cu)
}

/// Every rank of a CP split of one pack and the row maps between the pack, the ranks' local
/// tensors and the all-gathered buffer.
///
/// - Local rows of rank r: the tokens of its chunks, ascending (its packed queries, and the K, V,
///   KI rows it owns and contributes to the all-gather).
/// - Gathered rows: the ranks' local rows concatenated, rank 0 first (what an all-gather of
///   equal local lengths returns, and what a reduce-scatter splits).
#[derive(Debug, Clone)]
pub struct CpPlan {
    cfg: CpConfig,
    cu_seqlens: Vec<i32>,
    ranks: Vec<RankCase>,
    /// Per chunk, its first gathered row.
    chunk_gathered: Vec<usize>,
}

impl CpPlan {
    /// The split of pack `cu_seqlens` under `cfg` (MSA's dispatch, any CP size).
    pub fn new(case_id: u64, cu_seqlens: &[i32], cfg: CpConfig) -> Result<Self> {
        let ranks = split_pack(case_id, cu_seqlens, &cfg)?;
        let total = *cu_seqlens.last().unwrap() as usize;
        let rank_tokens = total / cfg.cp_size;
        let mut chunk_gathered = vec![0; total / cfg.chunk_size];
        for rc in &ranks {
            for (i, &c) in rc.chunks().iter().enumerate() {
                chunk_gathered[c] = rc.rank() * rank_tokens + i * cfg.chunk_size;
            }
        }
        Ok(Self {
            cfg,
            cu_seqlens: cu_seqlens.to_vec(),
            ranks,
            chunk_gathered,
        })
    }

    pub fn config(&self) -> CpConfig {
        self.cfg
    }

    pub fn cp_size(&self) -> usize {
        self.cfg.cp_size
    }

    /// Tokens of the pack.
    pub fn total_tokens(&self) -> usize {
        *self.cu_seqlens.last().unwrap() as usize
    }

    /// Tokens of every rank (equal by construction).
    pub fn rank_tokens(&self) -> usize {
        self.total_tokens() / self.cfg.cp_size
    }

    pub fn cu_seqlens(&self) -> &[i32] {
        &self.cu_seqlens
    }

    pub fn ranks(&self) -> &[RankCase] {
        &self.ranks
    }

    /// The layout of the single call over the whole pack (no fragments).
    pub fn pack_layout(&self) -> Result<VarlenLayout> {
        Ok(VarlenLayout::new(&self.cu_seqlens, &self.cu_seqlens, None)?)
    }

    /// The gathered row of pack token `token`.
    pub fn gathered_row(&self, token: usize) -> usize {
        let cs = self.cfg.chunk_size;
        self.chunk_gathered[token / cs] + token % cs
    }

    /// Rank `rank`'s local rows from the pack: `src` a pack token, `dst` a local row.
    pub fn local_rows(&self, rank: usize) -> Vec<Segment> {
        let cs = self.cfg.chunk_size;
        let mut segs = Vec::new();
        for (i, &c) in self.ranks[rank].chunks().iter().enumerate() {
            push_merged(
                &mut segs,
                Segment {
                    src: c * cs,
                    dst: i * cs,
                    len: cs,
                },
            );
        }
        segs
    }

    /// Rank `rank`'s packed K/V rows (`[Tk_r, …]`, its layout's `cu_seqlens_k`) from the
    /// gathered rows: `src` a gathered row, `dst` a packed key row. A document's prefix
    /// crosses chunks, so it is one segment per chunk piece (merged where the pieces are
    /// adjacent in the gathered buffer too). The inverse segments scatter the packed key
    /// gradients back; no gathered row appears twice (a rank's documents are distinct).
    pub fn kv_rows(&self, rank: usize) -> Vec<Segment> {
        let cs = self.cfg.chunk_size;
        let mut segs = Vec::new();
        let mut dst = 0;
        for range in self.ranks[rank].kv_source_ranges() {
            let mut t = range.start;
            while t < range.end {
                let len = (cs - t % cs).min(range.end - t);
                push_merged(
                    &mut segs,
                    Segment {
                        src: self.gathered_row(t),
                        dst,
                        len,
                    },
                );
                t += len;
                dst += len;
            }
        }
        segs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{load_manifest, DEV_MANIFEST};

    fn cfg(cp_size: usize, chunk_size: usize) -> CpConfig {
        CpConfig {
            cp_size,
            chunk_size,
        }
    }

    #[test]
    fn two_rank_maps_are_hand_checked() {
        // The split of cp.rs's hand-checked test: rank 0 holds chunks 0 and 2, rank 1 chunks 1
        // and 3; documents [0, 3000) and [3000, 4096).
        let plan = CpPlan::new(1, &[0, 3000, 4096], cfg(2, 1024)).unwrap();
        assert_eq!(plan.rank_tokens(), 2048);
        let seg = |src, dst, len| Segment { src, dst, len };
        assert_eq!(plan.local_rows(0), [seg(0, 0, 1024), seg(2048, 1024, 1024)]);
        assert_eq!(
            plan.local_rows(1),
            [seg(1024, 0, 1024), seg(3072, 1024, 1024)]
        );
        // Gathered: [chunk 0, chunk 2, chunk 1, chunk 3].
        assert_eq!(
            (0..4)
                .map(|c| plan.gathered_row(c * 1024))
                .collect::<Vec<_>>(),
            [0, 2048, 1024, 3072]
        );
        // Rank 0's K: document 0's [0, 3000) then document 1's [3000, 3072).
        assert_eq!(
            plan.kv_rows(0),
            [
                seg(0, 0, 1024),
                seg(2048, 1024, 1024),
                seg(1024, 2048, 952 + 72)
            ]
        );
        // Rank 1's K: document 0's [0, 2048), document 1's [3000, 4096).
        assert_eq!(
            plan.kv_rows(1),
            [
                seg(0, 0, 1024),
                seg(2048, 1024, 1024),
                seg(1024 + 952, 2048, 72),
                seg(3072, 2120, 1024)
            ]
        );
    }

    /// Every map checked against the token it must carry, on every rank of real packs.
    fn check_maps(plan: &CpPlan) {
        let total = plan.total_tokens();
        // Gathered rows are a permutation of the pack.
        let mut seen = vec![false; total];
        for t in 0..total {
            let g = plan.gathered_row(t);
            assert!(!seen[g], "gathered row {g} twice");
            seen[g] = true;
        }
        let pack: Vec<usize> = (0..total).collect();
        let mut gathered = vec![0; total];
        for rank in 0..plan.cp_size() {
            let mut local = vec![usize::MAX; plan.rank_tokens()];
            copy_rows(&pack, &mut local, 1, &plan.local_rows(rank));
            // The local rows are the rank's packed queries.
            let rc = &plan.ranks()[rank];
            let mut q = 0;
            for f in rc.fragments() {
                for p in f.local_begin..f.local_end {
                    assert_eq!(local[q], f.global_begin - f.local_begin + p);
                    q += 1;
                }
            }
            assert_eq!(q, local.len());
            // The all-gather of the local rows.
            gathered[rank * plan.rank_tokens()..][..plan.rank_tokens()].copy_from_slice(&local);
        }
        for rank in 0..plan.cp_size() {
            let rc = &plan.ranks()[rank];
            let mut k = vec![usize::MAX; rc.layout().total_k()];
            copy_rows(&gathered, &mut k, 1, &plan.kv_rows(rank));
            let expected: Vec<usize> = rc.kv_source_ranges().iter().cloned().flatten().collect();
            assert_eq!(k, expected, "rank {rank}");
        }
    }

    #[test]
    fn the_maps_carry_the_right_tokens_on_real_packs_for_every_cp_size() {
        let cases = load_manifest(DEV_MANIFEST).unwrap();
        for case in cases.iter().take(6) {
            for cp in [1, 2, 4, 8, 16] {
                check_maps(&CpPlan::new(case.case_id, &case.cu_seqlens, cfg(cp, 1024)).unwrap());
            }
        }
    }

    #[test]
    fn cp16_is_the_manifest_split() {
        let case = &load_manifest(DEV_MANIFEST).unwrap()[0];
        let plan = CpPlan::new(case.case_id, &case.cu_seqlens, CpConfig::default()).unwrap();
        assert_eq!(plan.ranks(), case.rank_cases(&CpConfig::default()).unwrap());
    }

    #[test]
    fn scatter_then_reduce_sums_every_ranks_key_rows() {
        // Each rank contributes 1 to every packed key row; after the scatter into gathered rows
        // and the sum over ranks, a token's count is the number of ranks whose K holds it.
        let case = &load_manifest(DEV_MANIFEST).unwrap()[1];
        let plan = CpPlan::new(case.case_id, &case.cu_seqlens, cfg(4, 1024)).unwrap();
        let mut sum = vec![0f32; plan.total_tokens()];
        let mut expected = vec![0f32; plan.total_tokens()];
        for rc in plan.ranks() {
            let ones = vec![1f32; rc.layout().total_k()];
            let inv: Vec<Segment> = plan
                .kv_rows(rc.rank())
                .iter()
                .map(|s| s.inverse())
                .collect();
            add_rows(&ones, &mut sum, 1, &inv);
            for r in rc.kv_source_ranges() {
                r.clone()
                    .for_each(|t| expected[plan.gathered_row(t)] += 1.0);
            }
        }
        assert_eq!(sum, expected);
    }

    #[test]
    fn grouped_tensors_move_per_group() {
        let src: Vec<i32> = (0..2 * 4 * 3).collect(); // [2, 4, 3]
        let segs = [Segment {
            src: 2,
            dst: 0,
            len: 2,
        }];
        assert_eq!(
            copy_grouped(&src, 2, 3, &segs, 2),
            [6, 7, 8, 9, 10, 11, 18, 19, 20, 21, 22, 23]
        );
    }

    #[test]
    fn packs_truncate_at_a_token() {
        assert_eq!(truncate_pack(&[0, 3000, 4096], 2048).unwrap(), [0, 2048]);
        assert_eq!(truncate_pack(&[0, 3000, 4096], 3000).unwrap(), [0, 3000]);
        assert_eq!(
            truncate_pack(&[0, 3000, 4096], 4000).unwrap(),
            [0, 3000, 4000]
        );
        assert!(truncate_pack(&[0, 3000], 4096).is_err());
    }
}
