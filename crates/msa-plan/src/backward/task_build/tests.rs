//! Hand-computed task builds: a small two-document plan in forward order, reordered, with a
//! noncontiguous segment, and past its capacity.

use super::*;
use crate::csr::build_k2q_csr;
use crate::layout::VarlenLayout;
use crate::schedule::{build_work_items, flat_schedule_capacity, WorkItem};

/// Documents of 10 and 130 tokens: doc 0 in workspace block 0, doc 1 in blocks 1 and 2 of a
/// 4-block (512-row) workspace. Head 0: every query selects its block 0; doc 1's positions
/// 128/129 also block 1. Head 3: doc 1's position 129 selects block 1 only.
fn plan() -> (VarlenLayout, crate::csr::K2qCsr, Vec<WorkItem>) {
    let l = VarlenLayout::documents(&[0, 10, 140]).unwrap();
    let mut topk = vec![-1; 4 * 140 * 16];
    for q in 0..140 {
        topk[q * 16 + 3] = 0;
    }
    topk[138 * 16 + 9] = 1;
    topk[139 * 16] = 1;
    topk[(3 * 140 + 139) * 16 + 15] = 1;
    let csr = build_k2q_csr(&l, &topk).unwrap();
    let items = build_work_items(&l, &csr, 64).unwrap();
    (l, csr, items)
}

fn work_capacity() -> usize {
    flat_schedule_capacity(3, 140, 64)
}

fn tables(items: &[WorkItem], work_capacity: usize) -> TaskTables {
    let (l, csr, _) = plan();
    let s = MsaBackwardSchedule::from_plan(&l, &csr, items, work_capacity).unwrap();
    build_backward_tasks(&s, 140, l.workspace_rows(), 2).unwrap()
}

fn meta(t: &TaskTables, row: usize) -> [i32; 4] {
    t.task_meta[row * 4..row * 4 + 4].try_into().unwrap()
}

fn qrows(t: &TaskTables, row: usize) -> &[i32] {
    &t.task_qrows[row * 8..row * 8 + 8]
}

fn qpos(t: &TaskTables, row: usize) -> &[i32] {
    &t.task_qpos[row * 8..row * 8 + 8]
}

#[test]
fn forward_order_build_by_hand() {
    let (l, _, items) = plan();
    assert_eq!(
        (l.workspace_rows(), l.fragment(1).workspace_start()),
        (512, 128)
    );
    let words: Vec<[i32; 6]> = items.iter().map(WorkItem::to_words).collect();
    assert_eq!(
        words,
        vec![
            [0, 0, 0, 10, 0, 0],
            [0, 1, 0, 64, 1, 0],
            [0, 1, 64, 64, 1, 0],
            [0, 1, 128, 2, 1, 0],
            [0, 2, 0, 2, 1, 1],
            [3, 2, 0, 1, 1, 1],
        ]
    );
    let t = tables(&items, work_capacity());
    let sizes = t.sizes;
    assert_eq!(work_capacity(), 152);
    assert_eq!(
        sizes,
        TaskBuildSizes {
            capacity: 4 * 2240 / 8 + 152,
            num_windows: 1,
            num_kblocks: 4,
            bins: 16,
            scratch_words: 8 + 152 + 1272 + 64 + 3 * 1272,
            table_words: 1272 * 20,
        }
    );
    assert_eq!(t.desc, [21, 4, 0, 4, 6, 6, 21, 0]);
    assert_eq!(t.grid_launch, 318 + 2);
    assert_eq!(&t.task_ends[..6], &[2, 10, 18, 19, 20, 21]);
    assert!(t.task_ends[6..].iter().all(|&v| v == -1));
    let mut segs = vec![0; 2];
    segs.extend([1; 17]);
    segs.extend([2, 14]);
    assert_eq!(&t.task_segments[..21], &segs[..]);
    assert!(t.task_segments[21..].iter().all(|&v| v == -1));

    let (mx, e) = (i32::MAX, -1);
    let mut counts = [0; 16];
    counts[..3].copy_from_slice(&[2, 17, 1]);
    counts[14] = 1;
    assert_eq!(t.bin_row(BIN_COUNTS), &counts);
    let mut first = [mx; 16];
    first[..3].copy_from_slice(&[0, 2, 19]);
    first[14] = 20;
    assert_eq!(t.bin_row(BIN_FIRST_TASKS), &first);
    let mut last = [e; 16];
    last[..3].copy_from_slice(&[1, 18, 19]);
    last[14] = 20;
    assert_eq!(t.bin_row(BIN_LAST_TASKS), &last);
    let mut offsets = [20; 16];
    offsets[..3].copy_from_slice(&[0, 2, 19]);
    offsets[15] = 21;
    assert_eq!(t.bin_row(BIN_OFFSETS), &offsets);

    assert_eq!(&t.task_decode[..6], &[8, 0, 0, 2, 8, 0]);
    assert_eq!(
        &t.task_decode[18 * 3..21 * 3],
        &[2, 138, 1, 2, 140, 1, 1, 0, 1]
    );
    assert!(t.task_decode[21 * 3..].iter().all(|&v| v == -1));

    assert_eq!(meta(&t, 0), [0, 0, 0, 8]);
    assert_eq!(meta(&t, 1), [0, 0, 0, 2]);
    assert_eq!(meta(&t, 2), [0, 0, 1, 8]);
    assert_eq!(meta(&t, 18), [0, 0, 1, 2]);
    assert_eq!(meta(&t, 19), [0, 0, 2, 2]);
    assert_eq!(meta(&t, 20), [0, 3, 2, 1]);
    assert!(t.task_meta[21 * 4..].iter().all(|&v| v == -1));
    assert_eq!(qrows(&t, 1), &[8, 9, e, e, e, e, e, e]);
    assert_eq!(qpos(&t, 1), &[8, 9, e, e, e, e, e, e]);
    assert_eq!(qrows(&t, 2), &[10, 11, 12, 13, 14, 15, 16, 17]);
    assert_eq!(qpos(&t, 2), &[128, 129, 130, 131, 132, 133, 134, 135]);
    for row in [18, 19] {
        assert_eq!(qrows(&t, row), &[138, 139, e, e, e, e, e, e]);
        assert_eq!(qpos(&t, row), &[256, 257, e, e, e, e, e, e]);
    }
    assert_eq!(qrows(&t, 20), &[139, e, e, e, e, e, e, e]);
    assert_eq!(qpos(&t, 20), &[257, e, e, e, e, e, e, e]);
    assert!(t.task_qrows[21 * 8..].iter().all(|&v| v == -1));

    let scratch = t.scratch_image();
    assert_eq!(scratch.len(), sizes.scratch_words);
    assert_eq!(&scratch[..8], &t.desc);
    assert_eq!(
        scratch[8 + 152 + 1272 + 16 * 3 + 2],
        19,
        "offsets row follows three bin rows"
    );
    let table = t.table_image();
    assert_eq!(table.len(), sizes.table_words);
    assert_eq!(&table[1272 * 4 + 8..1272 * 4 + 10], &[8, 9]);
}

#[test]
fn reversed_work_order_is_regrouped_by_segment() {
    let (_, _, mut items) = plan();
    items.reverse();
    let t = tables(&items, work_capacity());
    assert_eq!(t.desc[DESC_FLAGS], 0);
    // Sources: task 0 = head 3 (seg 14), task 1 = row 2 (seg 2), tasks 2..19 = row 1 chunks from
    // the last to the first (seg 1), tasks 19, 20 = doc 0 (seg 0).
    assert_eq!(meta(&t, 0), [0, 0, 0, 8]);
    assert_eq!(qrows(&t, 1)[..2], [8, 9]);
    assert_eq!(
        meta(&t, 2),
        [0, 0, 1, 2],
        "segment 1 keeps source order: the 2-query chunk first"
    );
    assert_eq!(qrows(&t, 3)[0], 10 + 64);
    assert_eq!(qrows(&t, 18)[0], 10 + 56);
    assert_eq!(meta(&t, 19), [0, 0, 2, 2]);
    assert_eq!(meta(&t, 20), [0, 3, 2, 1]);
}

#[test]
fn noncontiguous_segments_keep_source_order() {
    let (_, _, items) = plan();
    let t = tables(&[items[1], items[4], items[2]], work_capacity());
    assert_eq!(t.desc[DESC_FLAGS], FLAG_NONCONTIGUOUS_SEGMENTS);
    assert_eq!(t.desc[DESC_NUM_TASK_ROWS], 17);
    assert_eq!(t.bin_row(BIN_COUNTS)[1], 16);
    assert_eq!(
        (t.bin_row(BIN_FIRST_TASKS)[1], t.bin_row(BIN_LAST_TASKS)[1]),
        (0, 16)
    );
    assert_eq!(meta(&t, 8), [0, 0, 2, 2]);
    assert_eq!(qrows(&t, 9)[0], 10 + 64);
}

#[test]
fn overflow_disables_the_walk() {
    let (_, _, items) = plan();
    let copies = vec![items[1]; 200];
    let t = tables(&copies, 200);
    let cap = 1120 + 200;
    assert_eq!(t.sizes.capacity, cap);
    assert_eq!(t.desc, [0, 4, 0, 1, 0, 200, 1600, FLAG_CAPACITY_OVERFLOW]);
    assert_eq!(t.num_tasks(), cap);
    assert_eq!(
        t.walk(),
        CtaWalk {
            num_rows: 0,
            rows_per_cta: 4,
            num_full: 0,
            tail_rows: 1,
            grid: 0
        }
    );
    assert_eq!(meta(&t, cap - 1), [0, 0, 1, 8]);
    assert_eq!(t.bin_row(BIN_COUNTS)[1], cap as i32);
}

#[test]
fn work_count_is_clamped_to_the_table() {
    let (l, csr, items) = plan();
    let mut s = MsaBackwardSchedule::from_plan(&l, &csr, &items, 6).unwrap();
    let with = |s: &MsaBackwardSchedule| build_backward_tasks(s, 140, 512, 2).unwrap().desc;
    assert_eq!(with(&s)[DESC_NUM_WORK], 6);
    let parts = |count: i32| super::super::ScheduleParts {
        row_ptr: super::super::Int32Array::new(s.row_ptr().to_vec(), &[4, 4]),
        q_indices: super::super::Int32Array::new(s.q_indices().to_vec(), &[4, 2240]),
        scheduler_metadata: super::super::Int32Array::new(s.scheduler_metadata().to_vec(), &[6, 6]),
        work_count: super::super::Int32Array::vector(vec![count]),
        cu_seqlens: super::super::Int32Array::vector(vec![0, 10, 140]),
        document_workspace_starts: super::super::Int32Array::vector(vec![0, 128]),
        query_offsets: None,
    };
    let high = MsaBackwardSchedule::new(parts(99)).unwrap();
    assert_eq!(with(&high)[DESC_NUM_WORK], 6);
    assert_eq!(with(&high)[DESC_NUM_TASKS], 21);
    s = MsaBackwardSchedule::new(parts(-5)).unwrap();
    assert_eq!(with(&s), [0, 4, 0, 1, 0, 0, 0, 0]);
}

#[test]
fn size_and_content_errors() {
    let (l, csr, items) = plan();
    let s = MsaBackwardSchedule::from_plan(&l, &csr, &items, 6).unwrap();
    let err = |tokens: usize, ws: usize, sms: usize| {
        build_backward_tasks(&s, tokens, ws, sms)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(140, (1 << 27) + 128, 2),
        "MiniMax M3 MSA backward supports at most 4194304 locality bins per microbatch, got \
         4194308 for 140 tokens and 134217856 workspace rows."
    );
    assert!(err(140, 500, 2).contains("multiple of 128, got 500"));
    assert!(err(140, 512, 0).contains("num_sms must be positive"));
    assert_eq!(
        err(140, 512, usize::MAX),
        format!(
            "grid CTAs (capacity bound + SMs) must fit int32 (2147483647), got {}",
            i64::MAX
        )
    );
    assert!(err(139, 512, 2).contains("query 129 of document 1 is not a token below 139"));
    assert!(err(140, 256, 2).contains("workspace kblock 2 is not below 2"));
    let mut bad = items.clone();
    bad[2].q_begin = 100;
    let s = MsaBackwardSchedule::from_plan(&l, &csr, &bad, 6).unwrap();
    let msg = build_backward_tasks(&s, 140, 512, 2)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("scheduler_metadata[2] = [0, 1, 100, 64, 1, 0]: edges [110, 174) leave row 1 = [10, 140) of q_indices (width 2240)"), "{msg}");
}
