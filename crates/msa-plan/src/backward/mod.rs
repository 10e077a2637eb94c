//! NeMo's backward contract (docs/contract.md §5), generalized to CP fragments.
//!
//! - [`schedule`]: `MsaBackwardSchedule`, the forward-derived metadata, shape-checked once.
//! - [`walk`]: the CTA walk over task rows (`rows_per_cta`, `chunk_map`, `grid_launch_bound`,
//!   the per-CTA row interval) that the main kernel and the task build share.
//! - [`abi`]: word indices, flags and fills of the task-build buffers (the device ABI).
//! - [`task_build`]: the host mirror of the four task-build kernels, bit for bit.
//! - [`kv_items`], [`det_grid`]: the sm_90a backward's work items (with the deterministic mode's
//!   dK/dV parts) and its deterministic dQ grid.
//!
//! Generalization: NeMo's "document" is a fragment here; its `document_workspace_starts` entry is
//! the workspace start of the fragment's document, and `query_offsets = k_len − q_len` is added to
//! `task_qpos` so causal positions stay bottom-right aligned.

pub mod abi;
pub mod det_grid;
pub mod kv_items;
pub mod schedule;
pub mod task_build;
pub mod walk;

pub use schedule::{Int32Array, MsaBackwardSchedule, ScheduleParts};
pub use task_build::{
    build_backward_tasks, task_build_buffer_sizes, task_build_sizes, TaskBuildSizes, TaskTables,
};
pub use walk::{chunk_map, cta_row_interval, grid_launch_bound, rows_per_cta, CtaWalk};
