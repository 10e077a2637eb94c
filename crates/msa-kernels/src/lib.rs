//! FFI layer of msa-rs: the CUDA C++ kernels in `kernels/` behind a C ABI.
//!
//! Layers, as in cudarc: [`sys`] (bindgen, raw `extern "C"`; regenerate with
//! `cargo xtask bindings`) → [`launch`] (one module per kernel family; `unsafe` functions over
//! raw device pointers that return [`KernelError`] naming the kernel). Without feature `msa`
//! only the error type and [`built_archs`] (empty) exist, and the crate needs no CUDA.

pub mod error;

pub use error::KernelError;

#[cfg(feature = "msa")]
#[allow(
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    dead_code,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    rustdoc::broken_intra_doc_links
)]
pub mod sys;

#[cfg(feature = "msa")]
pub mod launch;

/// The targets the linked kernels were compiled for (`sm_90a`, `sm_80`, `compute_80`), the
/// `built` argument of `msa_probe::require_arch`; empty without feature `msa`.
pub fn built_archs() -> &'static [&'static str] {
    #[cfg(feature = "msa")]
    {
        static ARCHS: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
        ARCHS.get_or_init(|| env!("MSA_KERNEL_ARCHS").split(',').collect())
    }
    #[cfg(not(feature = "msa"))]
    {
        &[]
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn built_archs_follow_the_feature() {
        if cfg!(feature = "msa") {
            assert_eq!(super::built_archs(), ["sm_90a", "sm_80", "compute_80"]);
        } else {
            assert!(super::built_archs().is_empty());
        }
    }
}
