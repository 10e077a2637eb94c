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

/// `(sm, sms)` of the current device: compute capability as `10·major + minor` and the
/// multiprocessor count, the values the launchers dispatch on (read once per device and cached
/// for the process).
pub fn device_sm() -> Result<(i32, i32), KernelError> {
    let (mut sm, mut sms) = (0, 0);
    // SAFETY: writes two ints; uses the runtime's current device (no pointer of the caller).
    let code = unsafe { sys::msa_util_device_sm(&mut sm, &mut sms) };
    KernelError::check("msa_util_device_sm", code)?;
    Ok((sm, sms))
}

/// Sets `bytes` bytes at `out` to zero, asynchronously on `stream`.
///
/// # Safety
/// `out` must be a device allocation of at least `bytes` bytes, usable from the current context,
/// and `stream` a stream of that context (or null).
pub unsafe fn zero(out: DevicePtr, bytes: usize, stream: Stream) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract.
    KernelError::check("msa_util_zero", unsafe {
        sys::msa_util_zero(out as *mut std::ffi::c_void, bytes, stream)
    })
}

/// Copies `dst.len()` i32 from the device address `src` into `dst` on `stream` and waits for
/// the stream (the one synchronizing launcher; not allowed while `stream` is being captured).
///
/// # Safety
/// `src` must be a device allocation of at least `dst.len()` i32, usable from the current
/// context, and `stream` a stream of that context (or null).
pub unsafe fn read_i32(src: DevicePtr, dst: &mut [i32], stream: Stream) -> Result<(), KernelError> {
    // SAFETY: the caller upholds this function's contract; `dst` is host memory of the length
    // copied.
    KernelError::check("msa_util_copy_to_host", unsafe {
        sys::msa_util_copy_to_host(
            dst.as_mut_ptr().cast(),
            src as *const std::ffi::c_void,
            std::mem::size_of_val(dst),
            stream,
        )
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn linked_archs_match_the_build() {
        assert_eq!(super::kernels_archs(), crate::built_archs().join(","));
    }
}
