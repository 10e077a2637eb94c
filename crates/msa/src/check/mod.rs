//! Checks of backend results: MSA's tolerances, report lines, the reference comparison (full
//! or sampled), and an independent f64 oracle for spot checks.

pub mod compare;
pub mod oracle;
mod reference;
mod sample;
mod spot;
pub mod structure;
mod tolerances;

pub use reference::against_reference;
pub use sample::{gather_rows, Sample};
pub use spot::against_oracle;
pub use tolerances::{CheckLine, CheckReport, Tolerances};
