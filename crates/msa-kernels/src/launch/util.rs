//! Utility family (`kernels/include/msa/util.h`).

use super::{DevicePtr, Stream};
use crate::{sys, KernelError};

/// The targets compiled into the linked kernel library (`sm_90a,sm_80,compute_80`); matches
/// [`crate::built_archs`] unless the link mixed builds.
pub fn kernels_archs() -> &'static str {
    // SAFETY: returns a static NUL-terminated string literal.
    let archs = unsafe { std::ffi::CStr::from_ptr(sys::msa_kernels_archs()) };
    archs.to_str().unwrap_or("")
}

/// Fills `n` u32 words at `out` with `value`, asynchronously on `stream`.
///
/// # Safety
/// `out` must be a 4-byte-aligned device allocation of at least `n` u32 words, usable from the
/// current context, and `stream` a stream of that context (or null).
pub unsafe fn fill_u32(
    out: DevicePtr,
    n: usize,
    value: u32,
    stream: Stream,
) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract.
    KernelError::check("msa_util_fill_u32", unsafe {
        sys::msa_util_fill_u32(out as *mut u32, n, value, stream)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn linked_archs_match_the_build() {
        assert_eq!(super::kernels_archs(), crate::built_archs().join(","));
    }
}
