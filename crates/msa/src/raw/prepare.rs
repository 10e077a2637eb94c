//! `prepare` into caller buffers: top-k validation word, k2q CSR, work list, physical CSR and the
//! per-fragment schedule arrays of one selection (kernels/include/msa/prepare.h), and the
//! explicit synchronizing check of its validation word.

use msa_kernels::{launch, sys};
use msa_plan::topology::{NUM_INDEX_HEADS, TOPK_BLOCKS};

use super::check;
use super::layout::Layout;
use super::shape::CallShape;
use super::view::{DevSlice, DevSliceMut, Stream};
use crate::error::{MsaError, Result, TopkFault, TopkFaultCode};

/// The outputs of [`prepare`] (i32, shapes of [`Sizes`](super::Sizes)); every element is
/// written, no pre-fill needed.
#[derive(Debug)]
pub struct PrepareOutputs {
    /// `[4]`: `(code, head, query, slot)` of the first invalid top-k entry, zeros when valid.
    pub error_word: DevSliceMut<i32>,
    /// `[4, R + 1]`: k2q CSR offsets per head (level-major rows).
    pub row_ptr: DevSliceMut<i32>,
    /// `[4, T·16]`: fragment-local queries, ascending per row, `-1` tail.
    pub q_indices: DevSliceMut<i32>,
    /// `[4, T·16]`: `q_local | writer_rank << 24`, `-1` tail.
    pub qsplit: DevSliceMut<i32>,
    /// `[T, 4]`: entries `0 <= e < num_blocks` per (query, head).
    pub split_counts: DevSliceMut<i32>,
    /// `[cap, 6]`: work items `(head, row, q_begin, q_count, fragment, level)`.
    pub scheduler_metadata: DevSliceMut<i32>,
    /// `[1]`: number of work items.
    pub work_count: DevSliceMut<i32>,
    /// `[4, P + 1]`: physical CSR offsets per head.
    pub phys_row_ptr: DevSliceMut<i32>,
    /// `[4, T·16]`: packed queries per physical block, ascending, `-1` tail.
    pub phys_q_indices: DevSliceMut<i32>,
    /// `[4, T·16]`: `visible_keys | writer_rank << 8`, `-1` tail.
    pub phys_valid: DevSliceMut<i32>,
    /// `[B]`: workspace row of each fragment's document.
    pub document_workspace_starts: DevSliceMut<i32>,
    /// `[B]`: `k_len − q_len` of each fragment.
    pub query_offsets: DevSliceMut<i32>,
}

/// The metadata of one selection, read-only: the selection `[4, T, 16]` itself and every tensor
/// of [`PrepareOutputs`]. Forward, backward and KL read it.
#[derive(Debug, Clone, Copy)]
pub struct Metadata {
    pub topk: DevSlice<i32>,
    pub error_word: DevSlice<i32>,
    pub row_ptr: DevSlice<i32>,
    pub q_indices: DevSlice<i32>,
    pub qsplit: DevSlice<i32>,
    pub split_counts: DevSlice<i32>,
    pub scheduler_metadata: DevSlice<i32>,
    pub work_count: DevSlice<i32>,
    pub phys_row_ptr: DevSlice<i32>,
    pub phys_q_indices: DevSlice<i32>,
    pub phys_valid: DevSlice<i32>,
    pub document_workspace_starts: DevSlice<i32>,
    pub query_offsets: DevSlice<i32>,
}

impl PrepareOutputs {
    /// The metadata these outputs hold for the selection `topk` they were built from.
    pub fn metadata(&self, topk: DevSlice<i32>) -> Metadata {
        Metadata {
            topk,
            error_word: self.error_word.as_slice(),
            row_ptr: self.row_ptr.as_slice(),
            q_indices: self.q_indices.as_slice(),
            qsplit: self.qsplit.as_slice(),
            split_counts: self.split_counts.as_slice(),
            scheduler_metadata: self.scheduler_metadata.as_slice(),
            work_count: self.work_count.as_slice(),
            phys_row_ptr: self.phys_row_ptr.as_slice(),
            phys_q_indices: self.phys_q_indices.as_slice(),
            phys_valid: self.phys_valid.as_slice(),
            document_workspace_starts: self.document_workspace_starts.as_slice(),
            query_offsets: self.query_offsets.as_slice(),
        }
    }
}

impl Metadata {
    /// Checks every tensor against `shape`.
    pub(crate) fn check(&self, shape: &CallShape) -> Result<()> {
        check::tensor(
            "topk_indices",
            &self.topk,
            shape.sizes().selection,
            "[4, T, 16]",
        )?;
        self.check_tables(shape)
    }

    /// Checks every tensor but the selection against `shape`.
    fn check_tables(&self, shape: &CallShape) -> Result<()> {
        let s = shape.sizes();
        check::tensor("error_word", &self.error_word, s.error_word, "[4]")?;
        check::tensor("row_ptr", &self.row_ptr, s.row_ptr, "[4, R + 1]")?;
        check::tensor("q_indices", &self.q_indices, s.selection, "[4, T·16]")?;
        check::tensor("qsplit", &self.qsplit, s.selection, "[4, T·16]")?;
        check::tensor("split_counts", &self.split_counts, s.split_counts, "[T, 4]")?;
        check::tensor(
            "scheduler_metadata",
            &self.scheduler_metadata,
            s.scheduler_metadata,
            "[work_capacity, 6]",
        )?;
        check::tensor("work_count", &self.work_count, s.work_count, "[1]")?;
        check::tensor(
            "phys_row_ptr",
            &self.phys_row_ptr,
            s.phys_row_ptr,
            "[4, P + 1]",
        )?;
        check::tensor(
            "phys_q_indices",
            &self.phys_q_indices,
            s.selection,
            "[4, T·16]",
        )?;
        check::tensor("phys_valid", &self.phys_valid, s.selection, "[4, T·16]")?;
        check::tensor(
            "document_workspace_starts",
            &self.document_workspace_starts,
            s.batch,
            "[B]",
        )?;
        check::tensor("query_offsets", &self.query_offsets, s.batch, "[B]")
    }
}

impl PrepareOutputs {
    fn check(&self, shape: &CallShape) -> Result<()> {
        // The selection slot of the view is not checked here (the caller checks `topk`).
        self.metadata(self.error_word.as_slice())
            .check_tables(shape)
    }
}

/// Scratch bytes [`prepare`] needs for `shape`: the selection bitmap with its prefixes and the
/// row and count arrays (`msa_prepare_workspace_bytes`, the kernel library's own carve, so the
/// two cannot disagree). Host arithmetic: no CUDA call, no context needed.
pub fn prepare_workspace_bytes(shape: &CallShape) -> Result<usize> {
    Ok(launch::prepare::workspace_bytes(shape.varlen_sizes())?)
}

/// Validate `topk` (`[4, T, 16]` i32) and build every tensor of `out` from it on `stream`: one
/// launcher (one cooperative kernel), no host synchronization, never an out-of-bounds access on an
/// invalid selection (CSR edges are the entries `0 <= e < num_blocks`, a repeated value once),
/// graph-capturable. The selection is NOT checked on the host: read
/// `out.error_word` with [`validate_prepare`] (or on the device) before trusting the metadata;
/// kernels run on an invalid selection compute garbage. `workspace` must hold at least
/// [`prepare_workspace_bytes`] (any alignment). Lengths are checked before any launch.
///
/// # Safety
/// Every view must be device memory of its length, usable from the current CUDA context, that
/// stays allocated until the launches have run; `stream` must be a live stream of that context;
/// `layout` must be [`build_layout`](super::build_layout)'s arrays of the layout `shape`
/// describes.
pub unsafe fn prepare(
    shape: &CallShape,
    layout: &Layout,
    topk: DevSlice<i32>,
    out: &mut PrepareOutputs,
    workspace: DevSliceMut<u8>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    check::tensor("topk_indices", &topk, s.selection, "[4, T, 16]")?;
    out.check(shape)?;
    let needed = prepare_workspace_bytes(shape)?;
    if workspace.len() < needed {
        return Err(MsaError::Tensor {
            name: "prepare workspace",
            expected: format!("at least {needed} bytes"),
            got: format!("{} bytes", workspace.len()),
        });
    }
    let outputs = sys::MsaPrepareOutputs {
        error_word: out.error_word.ptr(),
        row_ptr: out.row_ptr.ptr(),
        q_indices: out.q_indices.ptr(),
        qsplit: out.qsplit.ptr(),
        split_counts: out.split_counts.ptr(),
        scheduler_metadata: out.scheduler_metadata.ptr(),
        work_count: out.work_count.ptr(),
        phys_row_ptr: out.phys_row_ptr.ptr(),
        phys_q_indices: out.phys_q_indices.ptr(),
        phys_valid: out.phys_valid.ptr(),
        document_workspace_starts: out.document_workspace_starts.ptr(),
        query_offsets: out.query_offsets.ptr(),
    };
    // Both fit i32: checked by `CallShape::new`.
    let target = s.target_q_per_cta as i32;
    let capacity = s.work_capacity as i32;
    // SAFETY: every length checked above against `shape` (the sizes prepare.h gives for this
    // layout, target and capacity); the caller's contract covers the memory, stream and layout.
    unsafe {
        launch::prepare::metadata(
            topk.addr(),
            layout.varlen(shape),
            target,
            capacity,
            outputs,
            workspace.addr(),
            workspace.len(),
            stream.as_raw(),
        )?
    };
    Ok(())
}

/// The outputs of [`prepare_validate`]: the two tensors of [`PrepareOutputs`] that the
/// validation writes, with the same shapes and values.
#[derive(Debug)]
pub struct ValidateOutputs {
    /// `[4]`: `(code, head, query, slot)` of the first invalid top-k entry, zeros when valid.
    pub error_word: DevSliceMut<i32>,
    /// `[T, 4]`: entries `0 <= e < num_blocks` per (query, head).
    pub split_counts: DevSliceMut<i32>,
}

/// Scratch bytes [`prepare_validate`] needs (the fault word).
pub const VALIDATE_WORKSPACE_BYTES: usize = launch::prepare::VALIDATE_WORKSPACE_BYTES;

/// The validation of [`prepare`] alone: `out.error_word` and `out.split_counts` exactly as
/// [`prepare`] writes them, none of the CSR tables. It is all the forward needs (it reads only
/// the validated selection); the backward and the KL backward need [`prepare`]'s tables. Two
/// kernels (the second reduces the first's per-CTA words and lets the stream's next kernel
/// launch early, which must wait with `griddepcontrol.wait` if launched as a programmatic
/// dependent), no host synchronization, graph-capturable; read the word with
/// [`validate_prepare`]. `workspace` must hold at least [`VALIDATE_WORKSPACE_BYTES`], 256-byte
/// aligned. Lengths are checked before any launch.
///
/// # Safety
/// As [`prepare`].
pub unsafe fn prepare_validate(
    shape: &CallShape,
    layout: &Layout,
    topk: DevSlice<i32>,
    out: &mut ValidateOutputs,
    workspace: DevSliceMut<u8>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    check::tensor("topk_indices", &topk, s.selection, "[4, T, 16]")?;
    check::output("error_word", &out.error_word, s.error_word, "[4]")?;
    check::output("split_counts", &out.split_counts, s.split_counts, "[T, 4]")?;
    check::workspace("validation workspace", &workspace, VALIDATE_WORKSPACE_BYTES)?;
    // SAFETY: every length checked above against `shape`; the caller's contract covers the
    // memory, stream and layout.
    unsafe {
        launch::prepare::validate(
            topk.addr(),
            layout.varlen(shape),
            out.error_word.ptr(),
            out.split_counts.ptr(),
            workspace.addr(),
            workspace.len(),
            stream.as_raw(),
        )?
    };
    Ok(())
}

/// Read prepare's error word `[4]` (one device-to-host copy, then the stream is synchronized):
/// the raw word `(code, head, query, slot)`, zeros when the selection is valid.
///
/// # Safety
/// As [`validate_prepare`].
pub unsafe fn read_error_word(error_word: DevSlice<i32>, stream: Stream) -> Result<[i32; 4]> {
    check::tensor("error_word", &error_word, 4, "[4]")?;
    let mut word = [0i32; 4];
    // SAFETY: four i32 at a checked device view; the caller's contract covers context and stream.
    unsafe { launch::util::read_i32(error_word.addr(), &mut word, stream.as_raw())? };
    Ok(word)
}

/// The explicit, synchronizing check of a selection (MSA's eager `prepare`): reads `error_word`
/// after the stream's work and returns the first invalid entry as [`MsaError::TopK`] with its
/// code, head, query and slot (the smallest `(head·T + query)·16 + slot`; the raw layer has no
/// host layout, so the fault is the device's word, typed). A word that is no fault of this shape
/// is a kernel or ABI fault: [`MsaError::DeviceValidation`]. Never call it while `stream` is
/// being captured; capture [`prepare`] and check afterwards.
///
/// # Safety
/// `error_word` must be device memory of 4 i32 written by [`prepare`] on `stream` (or any
/// stream ordered before it), usable from the current CUDA context; `stream` a live stream of
/// that context.
pub unsafe fn validate_prepare(
    shape: &CallShape,
    error_word: DevSlice<i32>,
    stream: Stream,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let word = unsafe { read_error_word(error_word, stream)? };
    fault_of(shape.total_q(), word)
}

/// `Ok` for the zero word, the typed fault for a fault word of a `total_q`-query selection, else
/// a device validation error.
pub(crate) fn fault_of(total_q: usize, word: [i32; 4]) -> Result<()> {
    if word == [0; 4] {
        return Ok(());
    }
    let [code, head, query, slot] = word;
    let code = TopkFaultCode::from_code(code);
    match code {
        Some(code)
            if (0..NUM_INDEX_HEADS as i32).contains(&head)
                && (0..total_q as i64).contains(&(query as i64))
                && (0..TOPK_BLOCKS as i32).contains(&slot) =>
        {
            Err(MsaError::TopK(TopkFault {
                code,
                head: head as usize,
                query: query as usize,
                slot: slot as usize,
            }))
        }
        _ => Err(MsaError::DeviceValidation {
            word,
            detail: format!("which is no fault word for T = {total_q}"),
        }),
    }
}
