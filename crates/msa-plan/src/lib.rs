//! Pure-Rust planner of MiniMax Sparse Attention (MSA v1): everything the kernels need that can
//! be decided on the host, with no CUDA and no GPU.
//!
//! The device `prepare` and backward task build implement the same rules; GPU tests compare their
//! tables with the ones built here word for word, so each module documents its exact layout and
//! fill values (they are the device ABI):
//!
//! - [`layout`]: fragments, level-major rows, physical blocks, workspace rows;
//! - [`topk`]: validation of `topk_indices` and its device error word;
//! - [`csr`]: the k2q CSR (`row_ptr`, `q_indices`, `qsplit`, `split_counts`) and the physical CSR;
//! - [`schedule`]: the forward work list (`target_q_per_cta`, capacity, `scheduler_metadata`);
//! - [`backward`]: `MsaBackwardSchedule`, the CTA walk and the task-build host mirror;
//! - [`lpt`]: the longest-first order of the persistent sm_90a kernels' work lists;
//! - [`tiles`]: the sm_90a forward's tiles and their block unions;
//! - [`flops`]: MSA's FLOP model;
//! - [`packed`]: NeMo's packed layout of a document-id map.

pub mod backward;
pub mod csr;
pub mod error;
pub mod flops;
pub mod layout;
pub mod lpt;
pub mod packed;
pub mod peak;
pub mod schedule;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tiles;
pub mod topk;
pub mod topology;

#[cfg(test)]
mod proptests;

pub use backward::task_build;
pub use backward::{
    build_backward_tasks, chunk_map, cta_row_interval, grid_launch_bound, rows_per_cta,
    task_build_buffer_sizes, task_build_sizes, CtaWalk, Int32Array, MsaBackwardSchedule,
    ScheduleParts, TaskBuildSizes, TaskTables,
};
pub use csr::{build_k2q_csr, build_physical_csr, K2qCsr, PhysicalCsr};
pub use error::{PlanError, Result};
pub use flops::{causal_elements, selected_elements, sparse_elements, FlopModel};
pub use layout::{Fragment, RowCoord, VarlenLayout};
pub use packed::PackedLayout;
pub use schedule::{
    balanced_target_q_per_cta, build_work_items, flat_schedule_capacity, WorkItem, WorkTable,
};
pub use topk::{first_topk_fault, topk_error_word, validate_topk, TopKFault};
pub use topology::Topology;
