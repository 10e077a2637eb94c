//! The error every launcher returns.

/// A kernel launch (or the launcher's argument check) failed with CUDA error `code`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kernel `{kernel}` failed: {message} (CUDA error {code})")]
pub struct KernelError {
    /// The launcher, e.g. `msa_util_fill_u32`.
    pub kernel: &'static str,
    /// The `cudaError_t` the launcher returned.
    pub code: i32,
    /// `cudaGetErrorString(code)`.
    pub message: String,
}

impl KernelError {
    /// `Ok` for code 0 (`cudaSuccess`), else the error with CUDA's text for `code`.
    #[cfg(feature = "msa")]
    pub fn check(kernel: &'static str, code: i32) -> Result<(), KernelError> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: msa_error_string returns a static NUL-terminated string for any code.
        let message = unsafe { std::ffi::CStr::from_ptr(crate::sys::msa_error_string(code)) };
        Err(KernelError {
            kernel,
            code,
            message: message.to_string_lossy().into_owned(),
        })
    }
}

#[cfg(all(test, feature = "msa"))]
mod tests {
    use super::KernelError;

    // Needs no GPU: cudaGetErrorString is a table lookup in the static cudart.
    #[test]
    fn check_names_the_kernel_and_the_cuda_error() {
        assert_eq!(KernelError::check("k", 0), Ok(()));
        let err = KernelError::check("msa_util_fill_u32", 1).unwrap_err();
        assert_eq!(err.code, 1);
        assert_eq!(err.message, "invalid argument");
        assert_eq!(
            err.to_string(),
            "kernel `msa_util_fill_u32` failed: invalid argument (CUDA error 1)"
        );
    }
}
