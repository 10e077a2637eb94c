//! Pure-Rust planner of MiniMax Sparse Attention (MSA v1): everything the kernels need that can
//! be decided on the host, with no CUDA and no GPU.

pub mod error;
pub mod layout;
pub mod topology;

pub use error::{PlanError, Result};
pub use layout::{Fragment, RowCoord, VarlenLayout};
pub use topology::Topology;
