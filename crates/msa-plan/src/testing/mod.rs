//! Random valid inputs for property tests, shared with other crates through the `testing`
//! feature: layouts with documents and CP fragments (docs/contract.md §2.2), lengths that are not
//! multiples of 128 and single tokens, and valid top-k selections (unique causal blocks, `-1`
//! padding in random slots).
//!
//! Large per-token data is derived from a `u64` seed with [`SplitMix64`], so a failing case
//! shrinks over the layout and the seed rather than over thousands of entries.

pub mod layouts;
pub mod rng;
pub mod selection;

pub use crate::topk::recent_topk;
pub use layouts::{layout_from_documents, layouts, DocumentFragments, LayoutConfig};
pub use rng::SplitMix64;
pub use selection::{layouts_with_topk, messy_topk, random_topk};
