//! The one error type of msa-workloads; messages name the file line, field or rule that failed.

use std::path::PathBuf;

use msa_plan::PlanError;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum WorkloadError {
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// `line` is 1-based; `field` is a dotted path such as `metrics.median_seqlen`.
    #[error("manifest line {line}, field `{field}`: {reason}")]
    Manifest {
        line: usize,
        field: String,
        reason: String,
    },

    #[error("cannot split the pack: {0}")]
    Pack(String),

    #[error("unknown selection pattern `{0}` (known: {known})", known = crate::patterns::Pattern::all().iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    UnknownPattern(String),

    #[error(transparent)]
    Plan(#[from] PlanError),
}

pub type Result<T, E = WorkloadError> = std::result::Result<T, E>;
