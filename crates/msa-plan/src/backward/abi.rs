//! Word layout of the backward task-build buffers (docs/contract.md §5.2): the device kernels
//! and [`super::task_build`] read and write exactly these positions. The device side takes them
//! from `kernels/include/msa/abi.h` (`MSA_*`); `msa::cuda`'s compile-time check and the
//! `abi_header` test keep the two equal.
//!
//! Fill convention (msa-rs, stricter than NeMo's uninitialized `torch.empty`): the caller sets
//! every word of the scratch and table buffers to [`TABLE_FILL`] (`cudaMemset(.., 0xFF, ..)`)
//! before the four launches, so entries no kernel writes are `-1` on both sides.

/// Value of every scratch/table word that the build does not write (`memset 0xFF`).
pub const TABLE_FILL: i32 = -1;
/// `INT32_MAX`, the empty value of `BIN_FIRST_TASKS`.
pub const INT32_MAX: i32 = i32::MAX;

/// Queries per locality window: tasks are grouped by the 512-query window of their first query.
pub const LOCALITY_WINDOW: usize = 512;
/// Most locality bins one build supports.
pub const MAX_BINS: usize = 1 << 22;

/// Descriptor words.
pub const DESC_WORDS: usize = 8;
/// Task rows the CTA walk covers (`min(total, capacity)`, 0 on overflow).
pub const DESC_NUM_TASK_ROWS: usize = 0;
pub const DESC_ROWS_PER_CTA: usize = 1;
pub const DESC_NUM_FULL_CTAS: usize = 2;
pub const DESC_TAIL_ROWS: usize = 3;
pub const DESC_GRID_CTAS: usize = 4;
/// Work items read, `clamp(work_count, 0, work_capacity)`.
pub const DESC_NUM_WORK: usize = 5;
/// Exact task count (may exceed the capacity).
pub const DESC_NUM_TASKS: usize = 6;
pub const DESC_FLAGS: usize = 7;

/// Flag: more tasks than capacity; the walk is disabled (`num_rows = 0`).
pub const FLAG_CAPACITY_OVERFLOW: i32 = 1;
/// Flag: some segment's tasks are not one contiguous run; tables keep source order.
pub const FLAG_NONCONTIGUOUS_SEGMENTS: i32 = 2;

/// Rows of the `[4, bins]` bin array.
pub const BIN_ROWS: usize = 4;
/// Tasks per segment.
pub const BIN_COUNTS: usize = 0;
/// Smallest task of a segment, `INT32_MAX` when empty.
pub const BIN_FIRST_TASKS: usize = 1;
/// Largest task of a segment, `-1` when empty.
pub const BIN_LAST_TASKS: usize = 2;
/// Exclusive prefix of the counts.
pub const BIN_OFFSETS: usize = 3;

/// Words per `task_decode` row.
pub const DEC_WORDS: usize = 3;
/// Valid queries of the task (1..=8).
pub const DEC_VALID: usize = 0;
/// Edge position of the task's slot 0 in its head's `q_indices`.
pub const DEC_EDGE: usize = 1;
/// Document (fragment) of the task.
pub const DEC_DOC: usize = 2;

/// Words per `task_meta` row: `(0, head, workspace kblock, valid)`.
pub const META_WORDS: usize = 4;
/// Always 0 (NeMo's batch column).
pub const META_BATCH: usize = 0;
pub const META_HEAD: usize = 1;
/// Workspace (physical) key block; with `META_HEAD` it names the task's bucket.
pub const META_KBLOCK: usize = 2;
pub const META_VALID: usize = 3;

/// Query slots per task row (`task_qrows`/`task_qpos` width).
pub const TASK_QUERIES: usize = crate::topology::QUERY_CHUNK;
