//! The raw layer for callers that own the device (feature `kernels`; no cudarc): plan from
//! integers, launch into caller-provided device buffers on a caller-provided stream.
//!
//! A framework (the PyTorch extension, a candle op) keeps its own context, stream and allocator
//! and calls this layer with addresses:
//!
//! 1. [`CallShape::new`] validates the integers of one call (MSA's `prepare` takes them as host
//!    ints: total_q, total_k, batch, total_rows, max_seqlen_k) and [`CallShape::sizes`] gives the
//!    element count of every device tensor and the bytes of every workspace ([`Sizes`]; prepare's
//!    scratch comes from the kernel library, [`prepare_workspace_bytes`]).
//! 2. [`build_layout`] derives the layout arrays (fragment of each query, first fragment, block
//!    key ranges) on the device from cu_seqlens_q/k and fragment_indices.
//! 3. [`prepare`] (unchecked, never synchronizes) builds the metadata of one selection;
//!    [`validate_prepare`] is the explicit synchronizing check of its error word.
//! 4. [`forward`], [`backward`] (a [`BackwardPath`]: the sm_90a kernel in default or
//!    deterministic mode, the sm_80 task build + atomics, or the sm_80 deterministic pair),
//!    [`indexer_forward`], [`selection_lse`], [`kl_backward`], and the backward's pieces
//!    ([`backward_preprocess`], [`task_build`], [`backward_postprocess_dq`],
//!    [`backward_postprocess_dkv`]).
//!
//! Every entry point is an `unsafe fn` over [`DevSlice`] / [`DevSliceMut`] views (an address
//! and an element count) and a [`Stream`]. Each checks the length (and alignment) of every
//! buffer against [`Sizes`] before any launch and returns [`MsaError::Tensor`] naming the
//! tensor, the expected and the actual length; none allocates, none synchronizes except
//! [`validate_prepare`]. So everything between [`build_layout`] and [`kl_backward`] can be
//! captured in a CUDA graph, as long as one eager call ran first in the process (the launchers
//! read the device's SM version and count once and cache them; [`device_kernels`] does that read
//! explicitly). The cudarc facade `msa::cuda::CudaMsa` (feature `msa`) is built on this layer.
//!
//! [`MsaError::Tensor`]: crate::MsaError::Tensor

mod attention;
mod check;
mod indexer;
mod kl;
mod layout;
mod prepare;
mod reference;
mod shape;
#[cfg(test)]
mod tests;
mod view;

pub use attention::{
    backward, backward_postprocess_dkv, backward_postprocess_dq, backward_preprocess, forward,
    task_build, AttentionInputs, BackwardInputs, ForwardOutputs, Gradients, TaskBuildInputs,
    TaskBuildShape,
};
pub use indexer::{indexer_forward, selection_lse};
pub use kl::{kl_backward, KlInputs};
pub use layout::{build_layout, Layout, LayoutOutputs};
pub use prepare::{
    prepare, prepare_validate, prepare_workspace_bytes, read_error_word, validate_prepare,
    Metadata, PrepareOutputs, ValidateOutputs, VALIDATE_WORKSPACE_BYTES,
};
pub use reference::{
    reference_backward, reference_forward, reference_kl_backward, ReferenceBackwardInputs,
    ReferenceGradients, ReferenceInputs, ReferenceKlInputs,
};
pub use shape::{BackwardPath, CallShape, KernelSet, Sizes};
pub use view::{DevSlice, DevSliceMut, Elem, Stream};

pub use crate::error::{TopkFault, TopkFaultCode};

#[cfg(feature = "msa")]
pub(crate) use check::length as check_length;

use crate::error::Result;

/// The kernel set of the current device (the runtime's current device of the calling thread):
/// [`KernelSet::Sm90a`] on compute capability 9.0, else [`KernelSet::Sm80`]. The first call per
/// device reads its compute capability and SM count with `cudaDeviceGetAttribute` and caches
/// them for the process, as the launchers do; call it (or any launcher) once before capturing a
/// CUDA graph.
pub fn device_kernels() -> Result<KernelSet> {
    let (sm, _sms) = msa_kernels::launch::util::device_sm()?;
    Ok(KernelSet::for_sm(sm))
}

/// Fill every 32-bit word of `out` with `word` on `stream` (poisoning outputs before a test).
///
/// # Safety
/// `out` must be device memory of its length, usable from the current context, and `stream` a
/// stream of that context (or null).
pub unsafe fn fill_words<T: Elem>(
    out: &mut DevSliceMut<T>,
    word: u32,
    stream: Stream,
) -> Result<()> {
    let bytes = out.bytes();
    check::whole_words("fill target", bytes)?;
    // SAFETY: the caller's contract; the length is a whole number of 32-bit words.
    unsafe { msa_kernels::launch::util::fill_u32(out.addr(), bytes / 4, word, stream.as_raw())? };
    Ok(())
}
