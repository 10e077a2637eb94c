//! Length and alignment checks of caller buffers, run before any launch.

use super::view::{DevSlice, DevSliceMut, Elem};
use crate::error::{MsaError, Result};

/// Alignment every tensor pointer of the kernels needs (16-byte vector accesses).
pub(crate) const TENSOR_ALIGN: u64 = 16;
/// Alignment of a workspace base (each part of a workspace is 256-byte aligned from it).
pub(crate) const WORKSPACE_ALIGN: u64 = 256;

fn len_error(
    name: &'static str,
    expected: usize,
    shape: &str,
    dtype: &str,
    got: usize,
) -> MsaError {
    MsaError::Tensor {
        name,
        expected: format!("{expected} {dtype} elements ({shape})"),
        got: format!("{got} elements"),
    }
}

fn align_error(name: &'static str, align: u64, addr: u64) -> MsaError {
    MsaError::Tensor {
        name,
        expected: format!("a {align}-byte aligned device address"),
        got: format!("{addr:#x}"),
    }
}

fn aligned(name: &'static str, addr: u64, len: usize, align: u64) -> Result<()> {
    if len > 0 && !addr.is_multiple_of(align) {
        return Err(align_error(name, align, addr));
    }
    Ok(())
}

/// A tensor of exactly `expected` elements (`shape` names it in the message), 16-byte aligned.
pub(crate) fn tensor<T: Elem>(
    name: &'static str,
    view: &DevSlice<T>,
    expected: usize,
    shape: &str,
) -> Result<()> {
    if view.len() != expected {
        return Err(len_error(name, expected, shape, T::NAME, view.len()));
    }
    aligned(name, view.addr(), view.len(), TENSOR_ALIGN)
}

/// [`tensor`] for an output.
pub(crate) fn output<T: Elem>(
    name: &'static str,
    view: &DevSliceMut<T>,
    expected: usize,
    shape: &str,
) -> Result<()> {
    tensor(name, &view.as_slice(), expected, shape)
}

/// A small host-provided index array (cu_seqlens, fragment_indices): exact length, element
/// alignment only (the kernels read it with scalar loads).
pub(crate) fn index_array(
    name: &'static str,
    view: &DevSlice<i32>,
    expected: usize,
    shape: &str,
) -> Result<()> {
    if view.len() != expected {
        return Err(len_error(name, expected, shape, "i32", view.len()));
    }
    aligned(name, view.addr(), view.len(), 4)
}

/// A workspace of at least `needed` bytes, 256-byte aligned (larger ones are fine: a caching
/// allocator may hand out a bigger block).
pub(crate) fn workspace(name: &'static str, view: &DevSliceMut<u8>, needed: usize) -> Result<()> {
    if view.len() < needed {
        return Err(MsaError::Tensor {
            name,
            expected: format!("at least {needed} bytes"),
            got: format!("{} bytes", view.len()),
        });
    }
    aligned(name, view.addr(), needed, WORKSPACE_ALIGN)
}

/// A byte count that is a whole number of 32-bit words.
pub(crate) fn whole_words(name: &'static str, bytes: usize) -> Result<()> {
    if !bytes.is_multiple_of(4) {
        return Err(MsaError::Tensor {
            name,
            expected: "a whole number of 32-bit words".into(),
            got: format!("{bytes} bytes"),
        });
    }
    Ok(())
}

/// `x` rounded up to the workspace part alignment.
pub(crate) fn align_up(x: usize) -> usize {
    x.div_ceil(WORKSPACE_ALIGN as usize) * WORKSPACE_ALIGN as usize
}

/// A length check alone, for a caller that checks before it allocates (the facade).
#[cfg(feature = "msa")]
pub(crate) fn length<T: Elem>(
    name: &'static str,
    got: usize,
    expected: usize,
    shape: &str,
) -> Result<()> {
    if got != expected {
        return Err(len_error(name, expected, shape, T::NAME, got));
    }
    Ok(())
}
