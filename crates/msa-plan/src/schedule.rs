//! MSA's forward work list (docs/contract.md §4.2): every non-empty k2q row is cut
//! into chunks of `target_q_per_cta` queries, one CTA each.
//!
//! The chunk size is always a multiple of 8 (one 128-row MMA tile folds 8 queries × 16 heads), so
//! every work item splits into whole backward tasks. MSA emits items with `atomicAdd`, in a
//! nondeterministic row order; msa-rs fixes the order (head-major, then row, then chunk) so the
//! host and the device `prepare` produce the same table and the backward task build is
//! reproducible.

use crate::csr::K2qCsr;
use crate::error::{PlanError, Result};
use crate::layout::VarlenLayout;
use crate::topology::{BLOCK_SIZE, HEADS_PER_GROUP, NUM_KV_HEADS, TOPK_BLOCKS};

/// Query tokens per 128-row MMA tile, `128 / 16`.
pub const Q_TOKENS_PER_GROUP: usize = BLOCK_SIZE / HEADS_PER_GROUP;
/// Most tiles one forward CTA takes (`occupancy_target` cap).
pub const MAX_GROUPS_PER_CTA: usize = 512;
/// `max(8, topk·blk·2)`: no chunk exceeds this many queries, so "sink" rows are split.
pub const SINK_BALANCE_CAP: usize = TOPK_BLOCKS * BLOCK_SIZE * 2;
/// int32 words per `scheduler_metadata` row (`MSA_WORK_*` of `kernels/include/msa/abi.h`, as the
/// word positions below).
pub const WORK_WORDS: usize = 6;
/// Word of a `scheduler_metadata` row: index head.
pub const WORK_HEAD: usize = 0;
/// Word of a `scheduler_metadata` row: level-major k2q row.
pub const WORK_ROW: usize = 1;
/// Word of a `scheduler_metadata` row: first edge of the chunk, relative to the row start.
pub const WORK_Q_BEGIN: usize = 2;
/// Word of a `scheduler_metadata` row: queries of the chunk.
pub const WORK_Q_COUNT: usize = 3;
/// Word of a `scheduler_metadata` row: fragment of the row.
pub const WORK_FRAGMENT: usize = 4;
/// Word of a `scheduler_metadata` row: document-local key block (the row's level).
pub const WORK_KBLOCK: usize = 5;

/// MSA's `balanced_target_q_per_cta`: about two items per SM, capped, a multiple of 8.
pub fn balanced_target_q_per_cta(total_q: usize, num_sms: usize) -> usize {
    let g = Q_TOKENS_PER_GROUP;
    let total_refs_upper = total_q * TOPK_BLOCKS * NUM_KV_HEADS;
    let desired_work_items = num_sms.saturating_mul(2).max(1);
    let total_groups_upper = total_refs_upper.max(1).div_ceil(g);
    let occupancy_target =
        MAX_GROUPS_PER_CTA.min(total_groups_upper.div_ceil(desired_work_items).max(1)) * g;
    let capped = occupancy_target.max(g).min(SINK_BALANCE_CAP.max(g));
    capped.div_ceil(g) * g
}

/// MSA's `flat_schedule_capacity`: `max(1, rows·4 + ceil(max(T·16·4, 1) / target))`, an upper
/// bound of the work-item count (one partial chunk per non-empty row plus full chunks).
pub fn flat_schedule_capacity(total_rows: usize, total_q: usize, target: usize) -> usize {
    let edges = (total_q * TOPK_BLOCKS * NUM_KV_HEADS).max(1);
    (total_rows * NUM_KV_HEADS + edges.div_ceil(target)).max(1)
}

/// One forward CTA: queries `[q_begin, q_begin + q_count)` of k2q row `row` of head `head`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkItem {
    pub head: usize,
    /// Level-major row index.
    pub row: usize,
    /// First edge of the chunk, relative to the row start.
    pub q_begin: usize,
    pub q_count: usize,
    /// Fragment (MSA's "batch", NeMo's "document") of the row.
    pub fragment: usize,
    /// Document-local key block (the row's level).
    pub kblock: usize,
}

impl WorkItem {
    /// The `scheduler_metadata` row `(head, row, q_begin, q_count, fragment, kblock)`.
    pub fn to_words(&self) -> [i32; WORK_WORDS] {
        let mut words = [0; WORK_WORDS];
        words[WORK_HEAD] = self.head as i32;
        words[WORK_ROW] = self.row as i32;
        words[WORK_Q_BEGIN] = self.q_begin as i32;
        words[WORK_Q_COUNT] = self.q_count as i32;
        words[WORK_FRAGMENT] = self.fragment as i32;
        words[WORK_KBLOCK] = self.kblock as i32;
        words
    }
}

/// Cut every non-empty row of `csr` into chunks of `target` queries, in the order head, row,
/// chunk; `target` must be a positive multiple of 8 and `csr` built for `layout`.
pub fn build_work_items(
    layout: &VarlenLayout,
    csr: &K2qCsr,
    target: usize,
) -> Result<Vec<WorkItem>> {
    if target == 0 || !target.is_multiple_of(Q_TOKENS_PER_GROUP) {
        return Err(PlanError::Schedule(format!(
            "target_q_per_cta must be a positive multiple of {Q_TOKENS_PER_GROUP}, got {target}"
        )));
    }
    if csr.rows != layout.total_rows() || csr.total_q != layout.total_q() {
        return Err(PlanError::Shape {
            name: "k2q CSR",
            expected: format!(
                "{} rows and {} queries (the layout's)",
                layout.total_rows(),
                layout.total_q()
            ),
            got: format!("{} rows and {} queries", csr.rows, csr.total_q),
        });
    }
    let mut items = Vec::new();
    for head in 0..NUM_KV_HEADS {
        for (row, rc) in layout.rows().iter().enumerate() {
            let (begin, end) = csr.row_range(head, row);
            let count = end - begin;
            for q_begin in (0..count).step_by(target) {
                items.push(WorkItem {
                    head,
                    row,
                    q_begin,
                    q_count: target.min(count - q_begin),
                    fragment: rc.fragment as usize,
                    kblock: rc.level as usize,
                });
            }
        }
    }
    Ok(items)
}

/// The device form of a work list: `scheduler_metadata [capacity, 6]` and `work_count`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkTable {
    /// Rows past `work_count` are 0, as MSA leaves them after its memset.
    pub scheduler_metadata: Vec<i32>,
    pub work_count: i32,
    pub capacity: usize,
}

impl WorkTable {
    /// Lay `items` into a zero-filled `[capacity, 6]` table; more items than rows is an error.
    pub fn new(items: &[WorkItem], capacity: usize) -> Result<Self> {
        if items.len() > capacity {
            return Err(PlanError::Schedule(format!(
                "{} work items do not fit the schedule capacity {capacity}",
                items.len()
            )));
        }
        let mut scheduler_metadata = vec![0; capacity * WORK_WORDS];
        for (row, item) in scheduler_metadata.chunks_exact_mut(WORK_WORDS).zip(items) {
            row.copy_from_slice(&item.to_words());
        }
        Ok(Self {
            scheduler_metadata,
            work_count: items.len() as i32,
            capacity,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csr::build_k2q_csr;

    #[test]
    fn target_follows_the_balanced_model() {
        // 12,288 queries on 132 SMs: ceil(786432/8 / 264) = 373 groups -> 2984 queries.
        assert_eq!(balanced_target_q_per_cta(12_288, 132), 2984);
        // Capped at 512 groups = 4096 queries.
        assert_eq!(balanced_target_q_per_cta(1 << 20, 132), 4096);
        // Tiny inputs still get one tile; zero SMs count as one.
        assert_eq!(balanced_target_q_per_cta(0, 132), 8);
        assert_eq!(balanced_target_q_per_cta(1, 0), 64);
        // An absurd SM count does not wrap: the smallest chunk.
        assert_eq!(balanced_target_q_per_cta(12_288, usize::MAX), 8);
        for t in [1, 7, 100, 5000, 77_777] {
            for sms in [1, 78, 132, 148] {
                let target = balanced_target_q_per_cta(t, sms);
                assert!(
                    target.is_multiple_of(8) && (8..=4096).contains(&target),
                    "{t} {sms} {target}"
                );
            }
        }
    }

    #[test]
    fn capacity_matches_the_formula() {
        assert_eq!(flat_schedule_capacity(0, 0, 8), 1);
        assert_eq!(flat_schedule_capacity(10, 100, 64), 40 + 100);
        assert_eq!(flat_schedule_capacity(3, 5, 4096), 12 + 1);
    }

    #[test]
    fn rows_are_cut_in_order_with_a_short_last_chunk() {
        // One 300-token document; head 2 selects block 0 for every query, block 1 for the others.
        let l = VarlenLayout::documents(&[0, 300]).unwrap();
        let mut topk = vec![-1; 4 * 300 * 16];
        for q in 0..300 {
            topk[(2 * 300 + q) * 16] = 0;
            if q >= 128 {
                topk[(2 * 300 + q) * 16 + 1] = (q / 128) as i32;
            }
        }
        let csr = build_k2q_csr(&l, &topk).unwrap();
        let items = build_work_items(&l, &csr, 128).unwrap();
        let got: Vec<[i32; 6]> = items.iter().map(WorkItem::to_words).collect();
        assert_eq!(
            got,
            vec![
                [2, 0, 0, 128, 0, 0],
                [2, 0, 128, 128, 0, 0],
                [2, 0, 256, 44, 0, 0],
                [2, 1, 0, 128, 0, 1],
                [2, 2, 0, 44, 0, 2],
            ]
        );
        let table = WorkTable::new(&items, 7).unwrap();
        assert_eq!(table.work_count, 5);
        assert_eq!(&table.scheduler_metadata[6..12], &[2, 0, 128, 128, 0, 0]);
        assert!(table.scheduler_metadata[30..].iter().all(|&v| v == 0));
        assert!(WorkTable::new(&items, 4)
            .unwrap_err()
            .to_string()
            .contains("capacity 4"));
        let err = build_work_items(&l, &csr, 12).unwrap_err().to_string();
        assert!(err.contains("positive multiple of 8, got 12"), "{err}");
        let other = VarlenLayout::documents(&[0, 1]).unwrap();
        assert!(matches!(
            build_work_items(&other, &csr, 8),
            Err(PlanError::Shape { .. })
        ));
    }
}
