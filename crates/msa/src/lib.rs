//! msa-rs: MiniMax Sparse Attention (MSA v1) training kernels for Hopper, with a CPU
//! reference that runs on any host.
//!
//! - [`cuda`] (feature `msa`): `prepare` → forward → backward, indexer forward, KL backward
//!   on device buffers, behind the device probe.
//! - [`backend`]: one call of the contract on the CPU reference or the GPU.
//! - [`bench`]: device-timed repeats of each GPU stage (medians, useful TFLOP/s).
//! - [`io`]: the safetensors tensor contract (MSA's tensor names and layouts).
//! - [`check`]: MSA's tolerances, reference comparisons and an independent f64 oracle.

pub mod backend;
pub mod bench;
pub mod cases;
pub mod check;
pub mod error;
pub mod io;

#[cfg(feature = "msa")]
pub mod cuda;

pub use error::{MsaError, Result};
pub use msa_plan::{Topology, VarlenLayout};
