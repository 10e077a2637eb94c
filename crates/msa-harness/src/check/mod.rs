//! Checks of backend results: MSA's tolerances, report lines, the reference comparison (full
//! or sampled), the comparison with complete fp32 reference tensors (the naive GPU reference's),
//! an independent f64 oracle for spot checks, the comparison of two outputs, and which check a
//! run gets ([`plan_for`]).

pub mod compare;
mod full;
mod outputs;
mod plan;
mod reference;
mod sample;
mod spot;
pub mod structure;
mod tolerances;

pub use full::{against_full, FullReference};
/// The independent f64 oracle (crate `msa-oracle`).
pub use msa_oracle as oracle;
pub use outputs::against_outputs;
pub use plan::{plan_for, CheckPlan, Coverage, FULL_CHECK_MAX_ELEMENTS};
pub use reference::against_reference;
pub use sample::{gather_rows, Sample};
pub use spot::against_oracle;
pub use tolerances::{CheckLine, CheckReport, Tolerances};
