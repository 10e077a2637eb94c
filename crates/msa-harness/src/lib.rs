//! msa-harness: runs and checks calls of msa-rs, on the CPU reference (`msa-ref`) or on the GPU
//! (`msa`, feature `msa`). What the `msa` command and the GPU suite are built from; a training
//! framework links `msa` alone.
//!
//! - [`io`]: the safetensors tensor contract (MSA's tensor names and layouts), [`CallInputs`].
//! - [`backend`]: one call of the contract, written once over an [`backend::Executor`] with a
//!   CPU and a CUDA implementation.
//! - [`cp`]: one call over a pack spread over context-parallel ranks (KV all-gather), with the
//!   collective simulated in one process or over NCCL (feature `msa`).
//! - [`cases`]: reproducible calls from real CP16 workloads.
//! - [`check`]: MSA's tolerances, reference comparisons, an independent f64 oracle, and which of
//!   them a run gets.
//! - [`bench`]: device-timed repeats of each GPU [`Stage`] (medians, useful TFLOP/s).
//! - [`output_path`]: files are written whole, over nothing but a regular file or a new path.
//! - [`memory`]: the memory limit, what a call needs, and the refusal before any allocation.
//!
//! [`CallInputs`]: io::CallInputs

pub mod backend;
pub mod bench;
pub mod cases;
pub mod check;
pub mod cp;
pub mod error;
pub mod io;
pub mod memory;
pub mod output_path;
mod stage;

pub use error::{HarnessError, Result};
pub use stage::Stage;
