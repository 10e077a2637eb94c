//! Host mirror of the backward task build (docs/contract.md §5.2): four device kernels turn the
//! forward work items into locality-ordered task rows of at most 8 queries, and the CTA walk
//! over them. The CUDA build is compared with this code bit for bit, so every intermediate is
//! kept ([`TaskTables`]) and the four stages below follow the kernels step by step:
//!
//! 1. `scan_work`: inclusive task offsets per work item, exact counts, cleared bins;
//! 2. `assign_segments`: decode each task and give it a segment
//!    `(head·num_windows + first_query/512)·num_kblocks + kblock`, with count/first/last atomics;
//! 3. `scan_bins`: exclusive bin offsets; flag 2 when a segment is not one contiguous run;
//! 4. `scatter_tables`: move each task to `offsets[seg] + task − first[seg]` (source order under
//!    flag 2) and write its meta/qrows/qpos rows; task 0's thread writes the walk descriptor.
//!
//! Fill: every word of the scratch and table buffers starts as [`TABLE_FILL`] (`-1`); see
//! [`super::abi`] for the word positions. Fragment generalization:
//! `qpos = document_workspace_starts[doc] + query_offsets[doc] + q_local` and
//! `qrow = cu_seqlens[doc] + q_local`.

use super::abi::*;
use super::schedule::MsaBackwardSchedule;
use super::walk::CtaWalk;
use crate::error::{PlanError, Result};
use crate::schedule::WORK_WORDS;
use crate::topology::{BLOCK_SIZE, NUM_INDEX_HEADS};

/// Buffer sizes of one build (NeMo's `_task_build_sizes`), from the schedule's shapes only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskBuildSizes {
    /// Task rows: `4·edge_capacity/8 + work_capacity`, a bound for disjoint work items.
    pub capacity: usize,
    /// `ceil(num_tokens / 512)`.
    pub num_windows: usize,
    /// `workspace_rows / 128`.
    pub num_kblocks: usize,
    /// `4 · num_windows · max(num_kblocks, 1)`.
    pub bins: usize,
    /// `8 + work_capacity + capacity + 4·bins + 3·capacity` int32 words.
    pub scratch_words: usize,
    /// `capacity · (4 + 2·8)` int32 words.
    pub table_words: usize,
}

fn schedule_err(msg: String) -> PlanError {
    PlanError::Schedule(msg)
}

fn fits_i32(what: &'static str, got: usize) -> Result<()> {
    if got > i32::MAX as usize {
        return Err(PlanError::Overflow {
            what,
            limit: i32::MAX as i64,
            got: i64::try_from(got).unwrap_or(i64::MAX),
        });
    }
    Ok(())
}

/// Sizes of the scratch and table buffers; rejects a workspace that is not a multiple of 128,
/// more than `MAX_BINS` bins (NeMo's message) and int32 overflow.
pub fn task_build_sizes(
    schedule: &MsaBackwardSchedule,
    num_tokens: usize,
    workspace_rows: usize,
) -> Result<TaskBuildSizes> {
    task_build_buffer_sizes(
        schedule.edge_capacity(),
        schedule.work_capacity(),
        num_tokens,
        workspace_rows,
    )
}

/// [`task_build_sizes`] from the schedule's shapes alone (`q_indices` width `edge_capacity`,
/// `scheduler_metadata` rows `work_capacity`), for callers that hold the schedule on the device
/// only (`msa::raw`); the same rules and messages.
pub fn task_build_buffer_sizes(
    edge_capacity: usize,
    work_capacity: usize,
    num_tokens: usize,
    workspace_rows: usize,
) -> Result<TaskBuildSizes> {
    fits_i32("num_tokens", num_tokens)?;
    fits_i32("workspace_rows", workspace_rows)?;
    if !workspace_rows.is_multiple_of(BLOCK_SIZE) {
        return Err(schedule_err(format!(
            "workspace_rows must be a multiple of {BLOCK_SIZE}, got {workspace_rows}"
        )));
    }
    fits_i32("edge capacity", edge_capacity)?;
    fits_i32("work capacity", work_capacity)?;
    let capacity = NUM_INDEX_HEADS * edge_capacity / TASK_QUERIES + work_capacity;
    let num_windows = num_tokens.div_ceil(LOCALITY_WINDOW);
    let num_kblocks = workspace_rows / BLOCK_SIZE;
    let bins = NUM_INDEX_HEADS * num_windows * num_kblocks.max(1);
    if bins > MAX_BINS {
        return Err(schedule_err(format!(
            "MiniMax M3 MSA backward supports at most {MAX_BINS} locality bins per microbatch, got \
             {bins} for {num_tokens} tokens and {workspace_rows} workspace rows."
        )));
    }
    let scratch_words =
        DESC_WORDS + work_capacity + capacity + BIN_ROWS * bins + DEC_WORDS * capacity;
    let table_words = capacity * (META_WORDS + 2 * TASK_QUERIES);
    fits_i32("task-build scratch words", scratch_words)?;
    fits_i32("task-build table words", table_words)?;
    Ok(TaskBuildSizes {
        capacity,
        num_windows,
        num_kblocks,
        bins,
        scratch_words,
        table_words,
    })
}

/// Everything the four kernels write, in device layout (row-major int32).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskTables {
    pub sizes: TaskBuildSizes,
    /// `[8]`, indexed by `DESC_*`.
    pub desc: [i32; DESC_WORDS],
    /// `[work_capacity]`: inclusive task-count prefix of work items `< num_work`; `-1` after.
    pub task_ends: Vec<i32>,
    /// `[capacity]`: segment of forward-order task t; `-1` past the decoded tasks.
    pub task_segments: Vec<i32>,
    /// `[4, bins]`: rows `BIN_COUNTS`, `BIN_FIRST_TASKS` (`INT32_MAX` when empty),
    /// `BIN_LAST_TASKS` (`-1` when empty), `BIN_OFFSETS` (exclusive prefix of counts).
    pub bins: Vec<i32>,
    /// `[capacity, 3]`: `(valid, edge_start, doc)` of forward-order task t; `-1` rows after.
    pub task_decode: Vec<i32>,
    /// `[capacity, 4]`: `(0, head, workspace kblock, valid)` per output row; `-1` rows after.
    pub task_meta: Vec<i32>,
    /// `[capacity, 8]`: packed query rows, `-1` in slots `>= valid` and rows after.
    pub task_qrows: Vec<i32>,
    /// `[capacity, 8]`: workspace positions of the queries, `-1` like `task_qrows`.
    pub task_qpos: Vec<i32>,
    /// CTAs to launch, `grid_launch_bound(capacity, num_sms)`.
    pub grid_launch: usize,
}

impl TaskTables {
    /// The buffers as the device sees them after the `0xFF` memset.
    fn memset(sizes: TaskBuildSizes, work_capacity: usize, grid_launch: usize) -> Self {
        let cap = sizes.capacity;
        Self {
            sizes,
            desc: [TABLE_FILL; DESC_WORDS],
            task_ends: vec![TABLE_FILL; work_capacity],
            task_segments: vec![TABLE_FILL; cap],
            bins: vec![TABLE_FILL; BIN_ROWS * sizes.bins],
            task_decode: vec![TABLE_FILL; cap * DEC_WORDS],
            task_meta: vec![TABLE_FILL; cap * META_WORDS],
            task_qrows: vec![TABLE_FILL; cap * TASK_QUERIES],
            task_qpos: vec![TABLE_FILL; cap * TASK_QUERIES],
            grid_launch,
        }
    }

    /// The scratch buffer word for word: `desc | task_ends | task_segments | bins | task_decode`.
    pub fn scratch_image(&self) -> Vec<i32> {
        let mut out = Vec::with_capacity(self.sizes.scratch_words);
        out.extend_from_slice(&self.desc);
        for part in [
            &self.task_ends,
            &self.task_segments,
            &self.bins,
            &self.task_decode,
        ] {
            out.extend_from_slice(part);
        }
        out
    }

    /// The table buffer word for word: `task_meta | task_qrows | task_qpos`.
    pub fn table_image(&self) -> Vec<i32> {
        [&self.task_meta[..], &self.task_qrows, &self.task_qpos].concat()
    }

    /// The CTA walk recorded in the descriptor.
    pub fn walk(&self) -> CtaWalk {
        CtaWalk::from_desc(&self.desc)
    }

    /// Task rows that hold a task, `min(total tasks, capacity)`.
    pub fn num_tasks(&self) -> usize {
        (self.desc[DESC_NUM_TASKS] as usize).min(self.sizes.capacity)
    }

    /// One row `BIN_*` of the bin array.
    pub fn bin_row(&self, row: usize) -> &[i32] {
        &self.bins[row * self.sizes.bins..(row + 1) * self.sizes.bins]
    }

    fn bin_mut(&mut self, row: usize, seg: usize) -> &mut i32 {
        &mut self.bins[row * self.sizes.bins + seg]
    }
}

/// One `scheduler_metadata` row.
struct Work {
    head: usize,
    row: usize,
    q_begin: usize,
    q_count: usize,
    doc: usize,
    kblock: usize,
}

fn work(schedule: &MsaBackwardSchedule, w: usize) -> Work {
    let m = &schedule.scheduler_metadata()[w * WORK_WORDS..(w + 1) * WORK_WORDS];
    Work {
        head: m[0] as usize,
        row: m[1] as usize,
        q_begin: m[2] as usize,
        q_count: m[3] as usize,
        doc: m[4] as usize,
        kblock: m[5] as usize,
    }
}

fn num_work(schedule: &MsaBackwardSchedule) -> usize {
    schedule
        .work_count()
        .clamp(0, schedule.work_capacity() as i32) as usize
}

/// Check every value the kernels dereference for the work items they read, so the mirror never
/// indexes out of bounds (the device would read garbage): fields in range, edges inside the
/// item's CSR row, queries inside `num_tokens`, kblocks inside the workspace,
/// positions and the task count inside int32.
fn check_work_items(
    s: &MsaBackwardSchedule,
    sizes: &TaskBuildSizes,
    num_tokens: usize,
) -> Result<()> {
    let e = s.edge_capacity();
    let mut total = 0usize;
    for w in 0..num_work(s) {
        let m = &s.scheduler_metadata()[w * WORK_WORDS..(w + 1) * WORK_WORDS];
        let bad = |why: String| {
            Err(schedule_err(format!(
                "scheduler_metadata[{w}] = {m:?}: {why}"
            )))
        };
        let (head, row, q_begin, q_count, doc, kb_local) = (m[0], m[1], m[2], m[3], m[4], m[5]);
        if !(0..NUM_INDEX_HEADS as i32).contains(&head) {
            return bad(format!(
                "index head {head} is not in [0, {NUM_INDEX_HEADS})"
            ));
        }
        if row < 0 || row as usize >= s.rows() {
            return bad(format!("row {row} is not in [0, {})", s.rows()));
        }
        if q_begin < 0 || q_count < 0 || kb_local < 0 {
            return bad("q_begin, q_count and kblock must be non-negative".into());
        }
        if doc < 0 || doc as usize >= s.documents() {
            return bad(format!("document {doc} is not in [0, {})", s.documents()));
        }
        let d = doc as usize;
        let ws = s.document_workspace_starts()[d] as i64;
        let qoff = s.query_offsets()[d] as i64;
        let cu = s.cu_seqlens()[d] as i64;
        if ws < 0 || qoff < 0 || cu < 0 {
            return bad(format!(
                "document {d} has workspace start {ws}, query offset {qoff}, cu_seqlens {cu}"
            ));
        }
        let kblock = ws / BLOCK_SIZE as i64 + kb_local as i64;
        if kblock >= sizes.num_kblocks as i64 {
            return bad(format!(
                "workspace kblock {kblock} is not below {}",
                sizes.num_kblocks
            ));
        }
        let ptr = head as usize * (s.rows() + 1) + row as usize;
        let (base, end) = (s.row_ptr()[ptr] as i64, s.row_ptr()[ptr + 1] as i64);
        let (lo, hi) = (
            base + q_begin as i64,
            base + q_begin as i64 + q_count as i64,
        );
        if base < 0 || hi > end || end > e as i64 {
            return bad(format!(
                "edges [{lo}, {hi}) leave row {row} = [{base}, {end}) of q_indices (width {e})"
            ));
        }
        let edges = &s.q_indices()[head as usize * e..(head as usize + 1) * e];
        for &q in &edges[lo as usize..hi as usize] {
            if q < 0 || cu + q as i64 >= num_tokens as i64 {
                return bad(format!(
                    "query {q} of document {d} is not a token below {num_tokens}"
                ));
            }
            if ws + qoff + q as i64 > i32::MAX as i64 {
                return bad(format!("workspace position of query {q} overflows int32"));
            }
        }
        total += (q_count as usize).div_ceil(TASK_QUERIES);
    }
    fits_i32("backward task count", total)
}

/// Kernel 1: inclusive task offsets, exact counts, cleared bins.
fn scan_work(s: &MsaBackwardSchedule, t: &mut TaskTables) {
    let n = num_work(s);
    let mut acc = 0i32;
    for w in 0..n {
        acc += work(s, w).q_count.div_ceil(TASK_QUERIES) as i32;
        t.task_ends[w] = acc;
    }
    t.desc[DESC_NUM_WORK] = n as i32;
    t.desc[DESC_NUM_TASKS] = acc;
    t.desc[DESC_FLAGS] = 0;
    for seg in 0..t.sizes.bins {
        *t.bin_mut(BIN_COUNTS, seg) = 0;
        *t.bin_mut(BIN_FIRST_TASKS, seg) = INT32_MAX;
        *t.bin_mut(BIN_LAST_TASKS, seg) = -1;
    }
}

/// Kernel 2: decode forward-order tasks, give each a segment, count the segments.
fn assign_segments(s: &MsaBackwardSchedule, t: &mut TaskTables) {
    let n = t.num_tasks();
    let ends = &t.task_ends[..num_work(s)];
    let (nw, nk) = (t.sizes.num_windows, t.sizes.num_kblocks);
    let mut decoded = Vec::with_capacity(n);
    for task in 0..n {
        // First work item whose inclusive end passes `task`.
        let w = ends.partition_point(|&end| end as usize <= task);
        let m = work(s, w);
        let first_task = ends[w] as usize - m.q_count.div_ceil(TASK_QUERIES);
        let query_offset = (task - first_task) * TASK_QUERIES;
        let valid = (m.q_count - query_offset).min(TASK_QUERIES);
        let edge_start =
            s.row_ptr()[m.head * (s.rows() + 1) + m.row] as usize + m.q_begin + query_offset;
        let first_q = s.q_indices()[m.head * s.edge_capacity() + edge_start] as usize;
        let first_query = s.cu_seqlens()[m.doc] as usize + first_q;
        let kblock = s.document_workspace_starts()[m.doc] as usize / BLOCK_SIZE + m.kblock;
        let seg = (m.head * nw + first_query / LOCALITY_WINDOW) * nk + kblock;
        decoded.push((seg, [valid, edge_start, m.doc]));
    }
    for (task, (seg, dec)) in decoded.into_iter().enumerate() {
        t.task_segments[task] = seg as i32;
        for (i, v) in dec.into_iter().enumerate() {
            t.task_decode[task * DEC_WORDS + i] = v as i32;
        }
        *t.bin_mut(BIN_COUNTS, seg) += 1;
        let first = t.bin_mut(BIN_FIRST_TASKS, seg);
        *first = (*first).min(task as i32);
        let last = t.bin_mut(BIN_LAST_TASKS, seg);
        *last = (*last).max(task as i32);
    }
}

/// Kernel 3: exclusive bin offsets; flag segments that are not contiguous task runs.
fn scan_bins(t: &mut TaskTables) {
    let mut acc = 0i32;
    for seg in 0..t.sizes.bins {
        let count = *t.bin_mut(BIN_COUNTS, seg);
        *t.bin_mut(BIN_OFFSETS, seg) = acc;
        acc += count;
        let (first, last) = (
            *t.bin_mut(BIN_FIRST_TASKS, seg),
            *t.bin_mut(BIN_LAST_TASKS, seg),
        );
        if count > 0 && last - first + 1 != count {
            t.desc[DESC_FLAGS] |= FLAG_NONCONTIGUOUS_SEGMENTS;
        }
    }
}

/// Kernel 4: locality-ordered task rows and the CTA-walk descriptor.
fn scatter_tables(s: &MsaBackwardSchedule, t: &mut TaskTables, num_sms: usize) {
    let source_order = t.desc[DESC_FLAGS] & FLAG_NONCONTIGUOUS_SEGMENTS != 0;
    let (nw, nk) = (t.sizes.num_windows, t.sizes.num_kblocks);
    let e = s.edge_capacity();
    for task in 0..t.num_tasks() {
        let seg = t.task_segments[task] as usize;
        let out = if source_order {
            task
        } else {
            (t.bin_row(BIN_OFFSETS)[seg] + task as i32 - t.bin_row(BIN_FIRST_TASKS)[seg]) as usize
        };
        let kblock = seg % nk;
        let head = seg / nk / nw;
        let dec = &t.task_decode[task * DEC_WORDS..(task + 1) * DEC_WORDS];
        let (valid, edge, doc) = (
            dec[DEC_VALID] as usize,
            dec[DEC_EDGE] as usize,
            dec[DEC_DOC] as usize,
        );
        let meta = [0, head as i32, kblock as i32, valid as i32];
        t.task_meta[out * META_WORDS..(out + 1) * META_WORDS].copy_from_slice(&meta);
        let (cu, ws, qoff) = (
            s.cu_seqlens()[doc],
            s.document_workspace_starts()[doc],
            s.query_offsets()[doc],
        );
        for slot in 0..TASK_QUERIES {
            let i = out * TASK_QUERIES + slot;
            if slot < valid {
                let q = s.q_indices()[head * e + edge + slot];
                t.task_qrows[i] = cu + q;
                t.task_qpos[i] = ws + qoff + q;
            } else {
                t.task_qrows[i] = -1;
                t.task_qpos[i] = -1;
            }
        }
    }
    // Thread 0: the walk, disabled on overflow.
    let total = t.desc[DESC_NUM_TASKS] as usize;
    let overflow = total > t.sizes.capacity;
    let num_rows = if overflow { 0 } else { total };
    let walk = CtaWalk::new(num_rows, num_sms);
    t.desc[DESC_NUM_TASK_ROWS] = walk.num_rows as i32;
    t.desc[DESC_ROWS_PER_CTA] = walk.rows_per_cta as i32;
    t.desc[DESC_NUM_FULL_CTAS] = walk.num_full as i32;
    t.desc[DESC_TAIL_ROWS] = walk.tail_rows as i32;
    t.desc[DESC_GRID_CTAS] = walk.grid as i32;
    if overflow {
        t.desc[DESC_FLAGS] |= FLAG_CAPACITY_OVERFLOW;
    }
}

/// Run the four task-build stages on `schedule` and return every buffer they write; errors for
/// bad sizes (see [`task_build_sizes`]), `num_sms == 0`, or work items that would read outside
/// the schedule.
pub fn build_backward_tasks(
    schedule: &MsaBackwardSchedule,
    num_tokens: usize,
    workspace_rows: usize,
    num_sms: usize,
) -> Result<TaskTables> {
    if num_sms == 0 {
        return Err(schedule_err("num_sms must be positive, got 0".into()));
    }
    let sizes = task_build_sizes(schedule, num_tokens, workspace_rows)?;
    check_work_items(schedule, &sizes, num_tokens)?;
    let grid_launch = super::walk::grid_launch_bound(sizes.capacity, num_sms);
    // The grid is a descriptor word: an absurd SM count must not wrap into it.
    fits_i32("grid CTAs (capacity bound + SMs)", grid_launch)?;
    let mut t = TaskTables::memset(sizes, schedule.work_capacity(), grid_launch);
    scan_work(schedule, &mut t);
    assign_segments(schedule, &mut t);
    scan_bins(&mut t);
    scatter_tables(schedule, &mut t, num_sms);
    Ok(t)
}

#[cfg(test)]
mod tests;
