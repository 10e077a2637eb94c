//! CUDA backend: one device context and stream, typed device buffers, and the gate every entry
//! point passes first (built with `msa`, driver present, device served by the compiled
//! kernels), so an unsupported GPU gets a clear error instead of "no kernel image".
//!
//! [`CudaMsa`]'s entry points, one kernel family per file: [`CudaMsa::prepare`] (`prepare.rs`),
//! [`CudaMsa::forward`] and [`CudaMsa::backward`] (`attention.rs`), the backward's pieces
//! [`CudaMsa::task_build`] (`task_build.rs`) and `backward_*_into` (`pre_post.rs`),
//! [`CudaMsa::indexer_forward`] and [`CudaMsa::selection_lse`] (`indexer.rs`), and
//! [`CudaMsa::kl_backward`] (`kl.rs`). `reference.rs` holds the naive fp32 GPU references,
//! test oracles for the GPU suite ([`CudaMsa::reference_forward`] and its siblings).

mod attention;
mod attention_bwd;
mod attention_fwd;
mod indexer;
mod kl;
mod layout;
mod pre_post;
mod prepare;
mod reference;
mod task_build;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use half::bf16;

use crate::error::Result;
pub use attention::{BackwardOptions, DeviceForward, DeviceGrads};
pub use kl::KlInputs;
pub use layout::DeviceLayout;
pub use prepare::Metadata;
pub use reference::{ReferenceForward, ReferenceGrads};
pub use task_build::{DeviceSchedule, DeviceTaskTables};

/// A bit pattern written over outputs before a run when poisoning is on, so an element a
/// kernel forgot to write fails every check (NaN for floats, a huge sentinel for integers).
pub trait Poison: DeviceRepr {
    /// One 32-bit word of the pattern (two bf16 values, one f32 or one i32).
    const WORD: u32;
}
impl Poison for bf16 {
    const WORD: u32 = 0xFFC1_FFC1;
}
impl Poison for f32 {
    const WORD: u32 = 0x7FC0_0BAD;
}
impl Poison for i32 {
    const WORD: u32 = 0x5A5A_5A5A;
}

/// The CUDA side of msa-rs on one device.
pub struct CudaMsa {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    device: msa_probe::DeviceInfo,
    poison_outputs: bool,
}

impl CudaMsa {
    /// Open device `ordinal` after the probe confirmed the kernels serve it.
    pub fn new(ordinal: usize) -> Result<Self> {
        let device = msa_probe::kernels_available(ordinal, msa_kernels::built_archs())?;
        let ctx = CudaContext::new(ordinal)?;
        // One stream orders every launch and copy, so cudarc's per-buffer events add nothing.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        Ok(Self {
            ctx,
            stream,
            device,
            poison_outputs: false,
        })
    }

    /// Fill every output buffer the facade allocates with [`Poison`] before kernels run.
    pub fn with_poisoned_outputs(mut self, on: bool) -> Self {
        self.poison_outputs = on;
        self
    }

    pub fn device(&self) -> &msa_probe::DeviceInfo {
        &self.device
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The raw stream handle the C launchers take.
    pub(crate) fn raw_stream(&self) -> *mut std::ffi::c_void {
        self.stream.cu_stream() as *mut std::ffi::c_void
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        Ok(self.stream.clone_htod(host)?)
    }

    pub fn download<T: DeviceRepr + Default + Clone>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>> {
        Ok(self.stream.clone_dtoh(dev)?)
    }

    pub fn zeros<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>> {
        Ok(self.stream.alloc_zeros(len.max(1))?)
    }

    /// An output buffer: poisoned when poisoning is on, else left uninitialized (every element
    /// is written by the kernel that owns it).
    pub fn output<T: Poison>(&self, len: usize) -> Result<CudaSlice<T>> {
        // SAFETY: the buffer is either filled right here or written in full by its kernel.
        let mut buf = unsafe { self.stream.alloc::<T>(len.max(1))? };
        if self.poison_outputs {
            self.poison(&mut buf)?;
        }
        Ok(buf)
    }

    /// Overwrite `buf` with its [`Poison`] pattern.
    pub fn poison<T: Poison>(&self, buf: &mut CudaSlice<T>) -> Result<()> {
        let bytes = buf.num_bytes();
        debug_assert_eq!(bytes % 4, 0, "poisoned buffers hold whole 32-bit words");
        let (ptr, _g) = buf.device_ptr(&self.stream);
        unsafe { msa_kernels::launch::util::fill_u32(ptr, bytes / 4, T::WORD, self.raw_stream())? };
        Ok(())
    }

    /// Keep freed buffers in the device's stream-ordered pool instead of returning them to the
    /// driver at every synchronization (the pool's default threshold is 0), so repeated calls
    /// reuse their memory, as PyTorch's caching allocator does. The memory stays reserved for
    /// this process until the context ends.
    pub fn keep_pool_memory(&self) -> Result<()> {
        use cudarc::driver::result::{device, mem_pool};
        use cudarc::driver::sys::CUmemPool_attribute;
        if !self.ctx.has_async_alloc() {
            return Ok(());
        }
        let mut threshold = u64::MAX;
        // SAFETY: the pool is the context's device's current one; the attribute takes a u64.
        unsafe {
            let pool = device::get_mem_pool(self.ctx.cu_device())?;
            mem_pool::set_attribute(
                pool,
                CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )?;
        }
        Ok(())
    }

    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }
}

/// Device address of a buffer for a C launcher (single stream: no event bookkeeping needed).
pub(crate) fn dptr<T>(buf: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    buf.device_ptr(stream).0
}
