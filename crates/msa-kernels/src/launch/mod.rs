//! The result layer: one module per kernel family (`kernels/include/msa/<family>.h`), each
//! launcher an `unsafe fn` over raw device pointers that returns [`KernelError`] naming the
//! kernel. Callers (`msa::cuda`) validate shapes and own the buffers.
//!
//! [`KernelError`]: crate::KernelError

/// A device address (`CUdeviceptr`, what cudarc's `DevicePtr::device_ptr` yields).
pub type DevicePtr = u64;

/// A `CUstream` / `cudaStream_t` (cudarc: `CudaStream::cu_stream()`); null is the legacy
/// default stream.
pub type Stream = *mut std::ffi::c_void;

pub mod attention;
pub mod indexer;
pub mod kl;
pub mod prepare;
pub mod reference;
pub mod task_build;
pub mod util;
