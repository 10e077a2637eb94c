//! The context-parallel split of one global pack into the kernel inputs of each rank, exactly as
//! MSA's `datas/training/cases.py` (`magi_minheap_partitions`, `make_rank_case`; docs/contract.md
//! §6.3).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;

use msa_plan::topology::BLOCK_SIZE;
use msa_plan::VarlenLayout;

use crate::error::{Result, WorkloadError};
use crate::manifest::{check_cu_seqlens, RealCase};

/// CP degree and chunk length of the split; the default is MSA's 192K scenario (CP16, 1,024).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpConfig {
    pub cp_size: usize,
    pub chunk_size: usize,
}

impl Default for CpConfig {
    fn default() -> Self {
        Self {
            cp_size: 16,
            chunk_size: 1024,
        }
    }
}

/// A maximal run of one document's tokens inside a rank's chunks (runs in consecutive chunks
/// are merged). Positions are document-local: the fragment holds document tokens
/// `[local_begin, local_end)`, which sit at global tokens from `global_begin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankFragment {
    pub doc: usize,
    pub local_begin: usize,
    pub local_end: usize,
    pub global_begin: usize,
}

/// The inputs of one CP rank: its chunks, fragments, K packing and the validated layout
/// (`cu_seqlens_q`, `cu_seqlens_k`, `fragment_indices`, max seqlens and CSR rows are the
/// layout's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankCase {
    case_id: u64,
    rank: usize,
    chunks: Vec<usize>,
    fragments: Vec<RankFragment>,
    kv_source_ranges: Vec<Range<usize>>,
    layout: VarlenLayout,
}

impl RankCase {
    pub fn case_id(&self) -> u64 {
        self.case_id
    }
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// This rank's chunk ids, ascending.
    pub fn chunks(&self) -> &[usize] {
        &self.chunks
    }
    /// One per batch entry of the layout, in packed order.
    pub fn fragments(&self) -> &[RankFragment] {
        &self.fragments
    }
    /// Per document on this rank, in packed order: the global token range its packed K/V rows
    /// are gathered from, `[doc_begin, doc_begin + max_local_end)`.
    pub fn kv_source_ranges(&self) -> &[Range<usize>] {
        &self.kv_source_ranges
    }
    pub fn layout(&self) -> &VarlenLayout {
        &self.layout
    }
}

impl RealCase {
    /// Every rank of this pack under `cfg`.
    pub fn rank_cases(&self, cfg: &CpConfig) -> Result<Vec<RankCase>> {
        split_pack(self.case_id, &self.cu_seqlens, cfg)
    }

    /// Rank `rank` of this pack under `cfg`, its layout not yet built.
    pub fn rank_split(&self, cfg: &CpConfig, rank: usize) -> Result<RankSplit> {
        split_rank(self.case_id, &self.cu_seqlens, cfg, rank)
    }
}

/// One rank of a split before its layout is built: the sizes that a caller checks against a
/// memory budget are known here at the cost of the fragment list alone (a layout holds a word per
/// CSR row, and a single long document makes hundreds of millions of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankSplit {
    case_id: u64,
    rank: usize,
    chunks: Vec<usize>,
    fragments: Vec<RankFragment>,
}

impl RankSplit {
    /// Packed queries T.
    pub fn total_q(&self) -> usize {
        self.fragments
            .iter()
            .map(|f| f.local_end - f.local_begin)
            .sum()
    }

    /// Packed keys Tk: each document from its start to its last fragment's end.
    pub fn total_k(&self) -> usize {
        self.fragments
            .chunk_by(|a, b| a.doc == b.doc)
            .map(|d| d.last().unwrap().local_end)
            .sum()
    }

    /// Batch entries B.
    pub fn batch(&self) -> usize {
        self.fragments.len()
    }

    /// CSR rows per head, Σ ceil(klen / 128); a fragment's K range ends where its queries do.
    pub fn total_rows(&self) -> usize {
        self.fragments
            .iter()
            .map(|f| f.local_end.div_ceil(BLOCK_SIZE))
            .sum()
    }

    /// Build and validate the layout.
    pub fn into_case(self) -> Result<RankCase> {
        let RankSplit {
            case_id,
            rank,
            chunks,
            fragments,
        } = self;
        let mut cu_q = vec![0i32];
        for f in &fragments {
            cu_q.push(cu_q.last().unwrap() + (f.local_end - f.local_begin) as i32);
        }
        // A document's fragments are consecutive (ascending chunks), so packing documents in
        // order of first appearance keeps the fragment order; the last fragment has the largest
        // end.
        let mut cu_k = vec![0i32];
        let mut fragment_indices = Vec::with_capacity(fragments.len());
        let mut kv_source_ranges = Vec::new();
        let mut first = 0;
        for doc_frags in fragments.chunk_by(|a, b| a.doc == b.doc) {
            let base = *cu_k.last().unwrap();
            for f in doc_frags {
                cu_k.push(base + f.local_end as i32);
                fragment_indices.push(first as i32);
            }
            let doc_begin = doc_frags[0].global_begin - doc_frags[0].local_begin;
            kv_source_ranges.push(doc_begin..doc_begin + doc_frags.last().unwrap().local_end);
            first += doc_frags.len();
        }
        let layout = VarlenLayout::new(&cu_q, &cu_k, Some(&fragment_indices))?;
        Ok(RankCase {
            case_id,
            rank,
            chunks,
            fragments,
            kv_source_ranges,
            layout,
        })
    }
}

/// The overlaps `(doc, local_begin, local_end)` of global tokens `[begin, end)`, in order.
fn overlaps(
    cu: &[i32],
    begin: usize,
    end: usize,
) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let first = cu.partition_point(|&x| x as usize <= begin) - 1;
    (first..cu.len() - 1)
        .take_while(move |&d| (cu[d] as usize) < end)
        .map(move |d| {
            let start = cu[d] as usize;
            (
                d,
                begin.max(start) - start,
                end.min(cu[d + 1] as usize) - start,
            )
        })
}

/// Causal area of every chunk: Σ over its queries of (document position + 1).
pub fn chunk_workloads(cu_seqlens: &[i32], chunk_size: usize) -> Vec<u64> {
    let total = *cu_seqlens.last().expect("cu_seqlens is non-empty") as usize;
    (0..total.div_ceil(chunk_size))
        .map(|c| {
            overlaps(
                cu_seqlens,
                c * chunk_size,
                ((c + 1) * chunk_size).min(total),
            )
            .map(|(_, lb, le)| ((lb + 1 + le) * (le - lb) / 2) as u64)
            .sum()
        })
        .collect()
}

/// Magi min-heap dispatch: chunks by workload descending (a stable ascending sort, reversed, so
/// ties go to the higher chunk id first) each go to the least-loaded rank (lowest rank on a
/// tie) that has fewer than ceil(chunks / cp) chunks. Returns each rank's chunks, ascending.
pub fn magi_dispatch(workloads: &[u64], cp_size: usize) -> Vec<Vec<usize>> {
    let cap = workloads.len().div_ceil(cp_size);
    let mut order: Vec<usize> = (0..workloads.len()).collect();
    order.sort_by_key(|&c| workloads[c]);
    order.reverse();
    let mut heap: BinaryHeap<_> = (0..cp_size).map(|r| Reverse((0u64, r))).collect();
    let mut chunks = vec![Vec::with_capacity(cap); cp_size];
    for c in order {
        // Full ranks leave the heap; cap * cp_size >= chunks keeps it non-empty.
        let (load, r) = loop {
            let Reverse((load, r)) = heap.pop().expect("cap * cp_size covers every chunk");
            if chunks[r].len() < cap {
                break (load, r);
            }
        };
        chunks[r].push(c);
        heap.push(Reverse((load + workloads[c], r)));
    }
    for list in &mut chunks {
        list.sort_unstable();
    }
    chunks
}

/// Each rank's chunks; the pack must be a whole number of chunks and the chunks a whole number
/// per rank, as in all of MSA's scenarios.
fn dispatch(cu_seqlens: &[i32], cfg: &CpConfig) -> Result<Vec<Vec<usize>>> {
    check_cu_seqlens(cu_seqlens).map_err(|r| WorkloadError::Pack(format!("cu_seqlens {r}")))?;
    let total = *cu_seqlens.last().unwrap() as usize;
    let CpConfig {
        cp_size,
        chunk_size,
    } = *cfg;
    if cp_size == 0
        || chunk_size == 0
        || !total.is_multiple_of(chunk_size)
        || !(total / chunk_size).is_multiple_of(cp_size)
    {
        return Err(WorkloadError::Pack(format!(
            "{total} tokens do not split into chunks of {chunk_size} dealt evenly over {cp_size} ranks"
        )));
    }
    Ok(magi_dispatch(
        &chunk_workloads(cu_seqlens, chunk_size),
        cp_size,
    ))
}

/// Split a global pack into the inputs of every rank.
pub fn split_pack(case_id: u64, cu_seqlens: &[i32], cfg: &CpConfig) -> Result<Vec<RankCase>> {
    dispatch(cu_seqlens, cfg)?
        .into_iter()
        .enumerate()
        .map(|(rank, chunks)| {
            rank_split(case_id, rank, chunks, cu_seqlens, cfg.chunk_size).into_case()
        })
        .collect()
}

/// Split a global pack and keep rank `rank` alone, its layout not yet built.
pub fn split_rank(
    case_id: u64,
    cu_seqlens: &[i32],
    cfg: &CpConfig,
    rank: usize,
) -> Result<RankSplit> {
    if rank >= cfg.cp_size {
        return Err(WorkloadError::Pack(format!(
            "rank {rank} is out of range (CP size {})",
            cfg.cp_size
        )));
    }
    let chunks = dispatch(cu_seqlens, cfg)?.swap_remove(rank);
    Ok(rank_split(
        case_id,
        rank,
        chunks,
        cu_seqlens,
        cfg.chunk_size,
    ))
}

fn rank_split(
    case_id: u64,
    rank: usize,
    chunks: Vec<usize>,
    cu: &[i32],
    chunk_size: usize,
) -> RankSplit {
    let mut fragments: Vec<RankFragment> = Vec::new();
    for &c in &chunks {
        for (doc, lb, le) in overlaps(cu, c * chunk_size, (c + 1) * chunk_size) {
            match fragments.last_mut() {
                Some(f) if f.doc == doc && f.local_end == lb => f.local_end = le,
                _ => fragments.push(RankFragment {
                    doc,
                    local_begin: lb,
                    local_end: le,
                    global_begin: cu[doc] as usize + lb,
                }),
            }
        }
    }
    RankSplit {
        case_id,
        rank,
        chunks,
        fragments,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{load_manifest, DEV_MANIFEST};

    const PACK: i32 = 196_608;

    #[test]
    fn single_document_pack_matches_the_readme_sanity_check() {
        let ranks = split_pack(37, &[0, PACK], &CpConfig::default()).unwrap();
        let r11 = &ranks[11];
        assert_eq!(
            r11.chunks(),
            [11, 20, 43, 52, 75, 84, 107, 116, 139, 148, 171, 180]
        );
        let l = r11.layout();
        assert_eq!(
            (l.batch(), l.total_k(), l.total_rows()),
            (12, 185_344, 9_264)
        );
        assert_eq!(l.fragment_indices().unwrap(), [0; 12]);
        assert_eq!(r11.kv_source_ranges(), std::slice::from_ref(&(0..185_344)));

        let r15 = &ranks[15];
        assert_eq!(&r15.chunks()[..4], [15, 16, 47, 48]);
        let l = r15.layout();
        assert_eq!(
            (l.batch(), l.total_k(), l.total_rows()),
            (6, 181_248, 4_656)
        );
        assert!(l.fragments().iter().all(|f| f.q_len == 2048));
        assert_eq!((l.max_seqlen_q(), l.max_seqlen_k()), (2048, 181_248));
        assert_eq!(
            r15.fragments()[0],
            RankFragment {
                doc: 0,
                local_begin: 15 * 1024,
                local_end: 17 * 1024,
                global_begin: 15 * 1024
            }
        );
    }

    #[test]
    fn two_rank_split_is_hand_checked() {
        let cfg = CpConfig {
            cp_size: 2,
            chunk_size: 1024,
        };
        let cu = [0, 3000, 4096];
        assert_eq!(
            chunk_workloads(&cu, 1024),
            [524_800, 1_573_376, 2_405_952, 598_528]
        );
        let ranks = split_pack(1, &cu, &cfg).unwrap();
        let r0 = &ranks[0];
        assert_eq!(r0.chunks(), [0, 2]);
        assert_eq!(r0.layout().cu_seqlens_q(), [0, 1024, 1976, 2048]);
        assert_eq!(r0.layout().cu_seqlens_k(), [0, 1024, 3000, 3072]);
        assert_eq!(r0.layout().fragment_indices().unwrap(), [0, 0, 2]);
        assert_eq!(r0.kv_source_ranges(), [0..3000, 3000..3072]);
        assert_eq!(
            r0.fragments()[2],
            RankFragment {
                doc: 1,
                local_begin: 0,
                local_end: 72,
                global_begin: 3000
            }
        );
        let r1 = &ranks[1];
        assert_eq!(r1.chunks(), [1, 3]);
        assert_eq!(r1.layout().cu_seqlens_q(), [0, 1024, 2048]);
        assert_eq!(r1.layout().cu_seqlens_k(), [0, 2048, 3144]);
        assert_eq!(r1.layout().fragment_indices().unwrap(), [0, 1]);
        assert_eq!(r1.kv_source_ranges(), [0..2048, 3000..4096]);
    }

    #[test]
    fn one_rank_alone_is_that_rank_of_the_whole_split_with_its_sizes_known_first() {
        let cu = [0, 3000, 4096, 9000, 16 * 1024];
        let cfg = CpConfig {
            cp_size: 4,
            chunk_size: 1024,
        };
        let all = split_pack(5, &cu, &cfg).unwrap();
        for (rank, whole) in all.into_iter().enumerate() {
            let split = split_rank(5, &cu, &cfg, rank).unwrap();
            let l = whole.layout();
            assert_eq!(
                (
                    split.total_q(),
                    split.total_k(),
                    split.batch(),
                    split.total_rows()
                ),
                (l.total_q(), l.total_k(), l.batch(), l.total_rows())
            );
            assert_eq!(split.into_case().unwrap(), whole);
        }
        let e = split_rank(5, &cu, &cfg, 4).unwrap_err().to_string();
        assert_eq!(
            e,
            "cannot split the pack: rank 4 is out of range (CP size 4)"
        );
    }

    #[test]
    fn a_huge_document_is_sized_without_building_its_layout() {
        // 2^25 tokens in one document: 2,048 fragments of 1,024 queries per rank, whose K ranges
        // add up to about 2^28 CSR rows. Only the fragment list exists here.
        let split = split_rank(1, &[0, 1 << 25], &CpConfig::default(), 0).unwrap();
        assert_eq!(split.total_q(), 1 << 21);
        assert_eq!(split.total_k(), split.fragments.last().unwrap().local_end);
        assert!(split.total_rows() > 1 << 27, "{}", split.total_rows());
    }

    #[test]
    fn ties_go_to_the_higher_chunk_and_the_lower_rank() {
        // Four 1,024-token documents: equal workloads, dispatched in order 3, 2, 1, 0.
        let w = chunk_workloads(&[0, 1024, 2048, 3072, 4096], 1024);
        assert_eq!(magi_dispatch(&w, 2), [vec![1, 3], vec![0, 2]]);
    }

    #[test]
    fn every_rank_of_every_dev_case_is_a_valid_12k_query_layout() {
        for case in load_manifest(DEV_MANIFEST).unwrap() {
            let w = chunk_workloads(&case.cu_seqlens, 1024);
            assert_eq!(w.iter().sum::<u64>(), case.metrics.causal_elements);
            let ranks = case.rank_cases(&CpConfig::default()).unwrap();
            let mut owner = [usize::MAX; 192];
            for rc in &ranks {
                assert_eq!(rc.case_id(), case.case_id);
                assert_eq!(
                    rc.layout().total_q(),
                    12_288,
                    "case {} rank {}",
                    case.case_id,
                    rc.rank()
                );
                assert_eq!(rc.chunks().len(), 12);
                for &c in rc.chunks() {
                    assert_eq!(owner[c], usize::MAX, "chunk {c} dealt twice");
                    owner[c] = rc.rank();
                }
                let keys: usize = rc
                    .kv_source_ranges()
                    .iter()
                    .map(ExactSizeIterator::len)
                    .sum();
                assert_eq!(keys, rc.layout().total_k());
                for (f, lf) in rc.fragments().iter().zip(rc.layout().fragments()) {
                    assert_eq!(
                        lf.k_len, f.local_end,
                        "queries end where their K range ends"
                    );
                    assert_eq!(lf.q_len, f.local_end - f.local_begin);
                }
            }
            assert!(
                owner.iter().all(|&r| r < 16),
                "the 16 ranks partition the 192 chunks"
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        #[test]
        fn random_packs_split_into_valid_ranks(lens in proptest::collection::vec(1i32..3000, 1..40), cp_size in 1usize..5) {
            let cfg = CpConfig { cp_size, chunk_size: 256 };
            let unit = (cp_size * 256) as i32;
            let mut cu = vec![0];
            for len in lens {
                cu.push(cu.last().unwrap() + len);
            }
            let total = *cu.last().unwrap();
            if total % unit != 0 {
                cu.push(total + unit - total % unit);
            }
            let total = *cu.last().unwrap() as usize;
            let mut dealt = vec![0; total / 256];
            for rc in split_pack(3, &cu, &cfg).unwrap() {
                let l = rc.layout();
                assert_eq!(l.total_q(), total / cp_size);
                rc.chunks().iter().for_each(|&c| dealt[c] += 1);
                let keys: usize = rc.kv_source_ranges().iter().map(ExactSizeIterator::len).sum();
                assert_eq!(keys, l.total_k());
                for (f, lf) in rc.fragments().iter().zip(l.fragments()) {
                    assert_eq!(rc.fragments()[lf.first].doc, f.doc, "fragment_indices point into the same document");
                    assert_eq!((lf.k_len, lf.q_len), (f.local_end, f.local_end - f.local_begin));
                    assert_eq!(f.global_begin, cu[f.doc] as usize + f.local_begin);
                }
                for w in rc.fragments().windows(2) {
                    assert!(w[0].doc != w[1].doc || w[0].local_end < w[1].local_begin, "touching runs are merged");
                }
            }
            assert!(dealt.iter().all(|&n| n == 1), "the ranks partition the chunks");
        }
    }

    #[test]
    fn unsplittable_packs_are_rejected() {
        let e = |cu: &[i32], cp| {
            split_pack(
                0,
                cu,
                &CpConfig {
                    cp_size: cp,
                    chunk_size: 1024,
                },
            )
            .unwrap_err()
            .to_string()
        };
        assert!(e(&[0, 1000], 1).contains("1000 tokens do not split into chunks of 1024"));
        assert!(e(&[0, 3072], 2).contains("evenly over 2 ranks"));
        assert!(e(&[0, 1024, 1024, 2048], 2).contains("cu_seqlens must be strictly increasing"));
    }
}
