//! Real MSA training workloads: the CP16 manifest loader, the context-parallel rank split and
//! its row maps (all-gather, packed K/V, reduce-scatter),
//! seeded inputs and top-k selection patterns.

pub mod cp;
pub mod cp_plan;
pub mod error;
pub mod inputs;
pub mod manifest;
pub mod patterns;

pub use cp::{
    chunk_workloads, magi_dispatch, split_pack, split_rank, CpConfig, RankCase, RankFragment,
    RankSplit,
};
pub use cp_plan::{add_rows, copy_grouped, copy_rows, truncate_pack, CpPlan, Segment};
pub use error::{Result, WorkloadError};
pub use inputs::{case_seed, InputMode, Inputs, Rng, Tensor};
pub use manifest::{load_manifest, parse_manifest, Metrics, RealCase, DEV_MANIFEST};
pub use patterns::{make_topk, make_topk_in, Pattern, POOL_SIZES};
