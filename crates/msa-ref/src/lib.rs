//! Exact CPU reference of the MSA v1 training contract (docs/contract.md
//! §2-§3): sparse attention forward and backward, the lightning indexer, the KL backward, and
//! the metrics every GPU check uses.
//!
//! The reference depends only on `msa_plan::VarlenLayout`, never on the planner rules it checks.
//! Results are deterministic and independent of the thread count (every output element has one
//! owner that sums in a fixed order). Subset variants (`*_queries`, `*_keys`) return exactly the
//! corresponding rows of the full results, so large cases can be checked on samples.
//!
//! Numerics (results are f32 and never rounded to bf16, except `dz` of the KL, as specified):
//! - bf16 inputs convert exactly to f32; dot products over the 128 dims (scores, dO·Vᵀ,
//!   qi·ki) accumulate in 8 f32 lanes summed by a fixed tree; sums over keys or heads (P·V,
//!   dS·K, dSᵀ·Q, Pᵀ·dO, dz·ki, dz·qi) accumulate in f32 in key order, block by block, in query
//!   order for the per-key gradients; fused multiply-add on the AVX2 path;
//! - scores are `f32(dot · scale)`; `exp` is f32 (libm); softmax denominators and LSEs are
//!   summed in f64 and rounded once (`lse = m + ln Σ exp(s − m)`); `O = (Σ P·V) / l`;
//! - backward: `delta = Σ dout·out` from the bf16 tensors in f64, rounded once to f32;
//!   `P = exp(s − lse)` with the given LSE (`-inf` read as 0, like the kernels' preprocess);
//!   dQ and dK are scaled by `scale` after accumulation;
//! - KL: teacher and student probabilities in f32, `dz = bf16(σ − t̄)`, `grad_scale` (computed
//!   in f64) applied after accumulation; [`kl::kl_loss`] is all f64.

pub mod attention;
mod blocks;
pub mod compare;
pub mod error;
mod gemm;
pub mod indexer;
pub mod kl;
mod selection;
mod softmax;
#[cfg(test)]
mod testing;

pub use attention::{AttentionInputs, Forward, Grads};
pub use compare::CloseReport;
pub use error::{RefError, Result};
pub use indexer::{IndexerInputs, IndexerOut};
pub use kl::KlGrads;
