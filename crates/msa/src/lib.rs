//! msa-rs: MiniMax Sparse Attention (MSA v1) training kernels for Hopper, the library a training
//! framework links.
//!
//! Two layers over the same kernels:
//! - [`raw`] (feature `kernels`, no cudarc): for callers that own the device, the stream and the
//!   memory (PyTorch, candle). It plans from integers ([`raw::CallShape`], [`raw::Sizes`]) and
//!   launches `prepare` → forward → backward, the indexer forward, the selection LSE and the KL
//!   backward into caller-provided device buffers on a caller-provided stream; it allocates
//!   nothing and never synchronizes except in its explicit validation.
//! - [`cuda`] (feature `msa` = `kernels` + cudarc + the device probe): the cudarc facade
//!   `CudaMsa`, which owns a context and a stream, allocates with cudarc and calls [`raw`].
//!
//! Without either feature only the error type and the planner's types exist, so dependents build
//! on any host. The CPU reference, tensor files, checks and the `msa` command live in
//! `msa-harness` and `msa-cli`.

pub mod error;

#[cfg(feature = "kernels")]
pub mod raw;

#[cfg(feature = "msa")]
pub mod cuda;

pub use error::{MsaError, Result, TopkFault, TopkFaultCode};
pub use msa_plan::{PlanError, Topology, VarlenLayout};
