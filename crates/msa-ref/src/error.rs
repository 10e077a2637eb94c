//! Input errors of the reference: wrong tensor sizes or out-of-range indices.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RefError {
    #[error("{name} must have {expected} elements (shape {shape}), got {got}")]
    Length {
        name: &'static str,
        shape: String,
        expected: usize,
        got: usize,
    },

    #[error("{what} {value} is out of range (limit {limit})")]
    OutOfRange {
        what: &'static str,
        value: String,
        limit: usize,
    },
}

pub type Result<T, E = RefError> = std::result::Result<T, E>;

/// Check that a flat tensor has `dims.product()` elements.
pub(crate) fn expect_len(name: &'static str, got: usize, dims: &[usize]) -> Result<()> {
    let expected = dims.iter().product();
    if got != expected {
        let shape = format!("{dims:?}");
        return Err(RefError::Length {
            name,
            shape,
            expected,
            got,
        });
    }
    Ok(())
}

/// Check that every index is below `limit`.
pub(crate) fn expect_indices(what: &'static str, indices: &[usize], limit: usize) -> Result<()> {
    match indices.iter().find(|&&i| i >= limit) {
        Some(&i) => Err(RefError::OutOfRange {
            what,
            value: i.to_string(),
            limit,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_tensor_and_both_sizes() {
        let e = expect_len("q", 5, &[2, 64, 128]).unwrap_err().to_string();
        assert_eq!(e, "q must have 16384 elements (shape [2, 64, 128]), got 5");
        assert!(expect_len("q", 16384, &[2, 64, 128]).is_ok());
        let e = expect_indices("query", &[0, 9], 4).unwrap_err().to_string();
        assert_eq!(e, "query 9 is out of range (limit 4)");
    }
}
