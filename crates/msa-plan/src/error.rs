//! One error type for every planner rule, with messages that name what was expected and got.

use thiserror::Error;

/// A rejected planner input. Every variant says what was expected and what was found.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    #[error("MSA v1 topology mismatch: {field} must be {expected}, got {got} (expected {all_expected}; got {all_got})")]
    Topology {
        field: &'static str,
        expected: String,
        got: String,
        all_expected: String,
        all_got: String,
    },

    #[error("{name} is malformed: {reason}")]
    Seqlens { name: &'static str, reason: String },

    #[error("{what} must fit int32 ({limit}), got {got}")]
    Overflow {
        what: &'static str,
        limit: i64,
        got: i64,
    },

    /// A size over a limit of the format other than int32 (a bit field).
    #[error("{what} must be at most {limit}, got {got}")]
    TooLarge {
        what: &'static str,
        limit: u64,
        got: u64,
    },

    #[error("{name} must have shape {expected}, got {got}")]
    Shape {
        name: &'static str,
        expected: String,
        got: String,
    },

    #[error("topk_indices[{head}, {query}, {slot}] = {value} is invalid: {reason}")]
    TopK {
        head: usize,
        query: usize,
        slot: usize,
        value: i32,
        reason: String,
    },

    #[error("document map is invalid: {0}")]
    DocumentMap(String),

    #[error("{0}")]
    Schedule(String),
}

pub type Result<T, E = PlanError> = std::result::Result<T, E>;
