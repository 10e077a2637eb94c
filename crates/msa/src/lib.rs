//! msa-rs: MiniMax Sparse Attention (MSA v1) training kernels for Hopper, the library a training
//! framework links.
//!
//! [`cuda`] (feature `msa`): `prepare` → forward → backward, the indexer forward, the selection
//! LSE and the KL backward on device buffers, behind the device probe. Without `msa` only the
//! error type and the planner's types exist, so dependents build on any host. The CPU reference,
//! tensor files, checks and the `msa` command live in `msa-harness` and `msa-cli`.

pub mod error;

#[cfg(feature = "msa")]
pub mod cuda;

pub use error::{MsaError, Result};
pub use msa_plan::{PlanError, Topology, VarlenLayout};
