//! The cudarc facade: one device context and stream, typed device buffers, and the gate every
//! entry point passes first (built with `msa`, driver present, device served by the compiled
//! kernels), so an unsupported GPU gets a clear error instead of "no kernel image".
//!
//! Built on [`crate::raw`]: every entry point allocates its outputs and workspaces with cudarc,
//! takes the device views of its buffers through one guard-holding helper ([`Views`]: the
//! buffer's context is checked, cudarc's guards live until the raw call has enqueued its
//! launches) and calls the raw function, which checks every length before any launch. No
//! launcher is called from here directly.
//!
//! [`CudaMsa`]'s entry points, one kernel family per file: [`CudaMsa::prepare`] (`prepare.rs`),
//! [`CudaMsa::forward`] and [`CudaMsa::backward`] (`attention.rs`), the backward's pieces
//! [`CudaMsa::task_build`] (`task_build.rs`) and `backward_*_into` (`pre_post.rs`),
//! [`CudaMsa::indexer_forward`] and [`CudaMsa::selection_lse`] (`indexer.rs`), and
//! [`CudaMsa::kl_backward`] (`kl.rs`). `reference.rs` holds the naive fp32 GPU references,
//! test oracles for the GPU suite ([`CudaMsa::reference_forward`] and its siblings).

mod abi_check;
mod attention;
mod indexer;
mod kl;
mod layout;
mod pre_post;
mod prepare;
mod reference;
mod task_build;
mod views;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr};
use half::bf16;

use crate::error::Result;
use crate::raw;
pub use attention::{BackwardOptions, DeviceForward, DeviceGrads};
pub use kl::KlInputs;
pub use layout::DeviceLayout;
pub use prepare::{Metadata, Tables};
pub use reference::{ReferenceForward, ReferenceGrads};
pub use task_build::{DeviceSchedule, DeviceTaskTables};
pub(crate) use views::Views;

/// A bit pattern written over outputs before a run when poisoning is on, so an element a
/// kernel forgot to write fails every check (NaN for floats, a huge sentinel for integers).
pub trait Poison: DeviceRepr + raw::Elem {
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
    sm80_kernels: std::sync::atomic::AtomicBool,
}

impl CudaMsa {
    /// Open device `ordinal` after the probe confirmed the kernels serve it.
    pub fn new(ordinal: usize) -> Result<Self> {
        let device = msa_probe::kernels_available(ordinal, msa_kernels::built_archs())?;
        let ctx = CudaContext::new(ordinal)?;
        // One stream orders every launch and copy, so cudarc's per-buffer events add nothing.
        // SAFETY: every launch and copy goes through the one stream below, which orders them.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        Ok(Self {
            ctx,
            stream,
            device,
            poison_outputs: false,
            sm80_kernels: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Run the mma.sync (sm_80) attention kernels even on Hopper: the reference path the sm_90a
    /// kernels are checked and benchmarked against. Off by default.
    pub fn with_sm80_kernels(self, on: bool) -> Self {
        self.set_sm80_kernels(on);
        self
    }

    /// [`CudaMsa::with_sm80_kernels`] on a shared handle, for the calls that follow (the
    /// benchmark times both kernel sets on one set of buffers).
    pub fn set_sm80_kernels(&self, on: bool) {
        self.sm80_kernels
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the attention runs the sm_90a kernels: a compute capability 9.0 device and
    /// [`CudaMsa::with_sm80_kernels`] off.
    pub fn uses_sm90_kernels(&self) -> bool {
        !self.sm80_kernels.load(std::sync::atomic::Ordering::Relaxed)
            && self.device.capability == (9, 0)
    }

    /// The kernel set the attention runs ([`CudaMsa::uses_sm90_kernels`]).
    pub fn kernel_set(&self) -> raw::KernelSet {
        if self.uses_sm90_kernels() {
            raw::KernelSet::Sm90a
        } else {
            raw::KernelSet::Sm80
        }
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

    /// The stream as the raw layer takes it.
    pub fn raw_stream(&self) -> raw::Stream {
        raw::Stream::from_raw(self.stream.cu_stream().cast())
    }

    /// The raw layer's shape of a host layout on this device.
    pub fn call_shape(&self, layout: &msa_plan::VarlenLayout) -> Result<raw::CallShape> {
        Ok(raw::CallShape::from_layout(
            layout,
            self.device.sm_count as usize,
        )?)
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
        let len = buf.len();
        let mut v = Views::new(self)?;
        let mut view = v.write("poisoned buffer", buf, len)?;
        // SAFETY: the view covers a live allocation of this context (its guard is held by `v`
        // until the fill is enqueued) and the stream is the context's.
        unsafe { raw::fill_words(&mut view, T::WORD, v.stream())? };
        Ok(())
    }

    /// Allocate `bytes` bytes of scratch (at least one byte; cudarc allocations are 256-byte
    /// aligned). Its contents are undefined: the launch that takes it writes every word it reads.
    pub(crate) fn scratch(&self, bytes: usize) -> Result<CudaSlice<u8>> {
        // SAFETY: scratch; every word is written before it is read by the kernels that use it.
        Ok(unsafe { self.stream.alloc::<u8>(bytes.max(1))? })
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
