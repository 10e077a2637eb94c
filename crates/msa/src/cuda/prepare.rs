//! `prepare` on the device (docs/design.md "Device data of one call"): top-k validation, the k2q
//! CSR, the forward work list and the physical CSR of one selection, built by one launcher with
//! no host synchronization. Every table equals `msa_plan`'s host build word for word.
//!
//! The metadata belongs to one top-k result (docs/contract.md §4), so [`Metadata`] owns the device
//! selection it was built from; kernels that need the selection take it from there.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use msa_kernels::{launch, sys};
use msa_plan::schedule::{balanced_target_q_per_cta, flat_schedule_capacity, WORK_WORDS};
use msa_plan::topology::{NUM_INDEX_HEADS, TOPK_BLOCKS};
use msa_plan::{topk_error_word, validate_topk};

use super::layout::Shape;
use super::{dptr, CudaMsa, DeviceLayout};
use crate::error::{MsaError, Result};

/// Words of the validation result `(code, head, query, slot)`.
const ERROR_WORDS: usize = 4;

/// The device metadata of one top-k selection (int32 tensors, layouts of `msa_plan`).
pub struct Metadata {
    layout: Arc<DeviceLayout>,
    topk: CudaSlice<i32>,
    target_q_per_cta: usize,
    work_capacity: usize,
    error_word: CudaSlice<i32>,
    row_ptr: CudaSlice<i32>,
    q_indices: CudaSlice<i32>,
    qsplit: CudaSlice<i32>,
    split_counts: CudaSlice<i32>,
    scheduler_metadata: CudaSlice<i32>,
    work_count: CudaSlice<i32>,
    phys_row_ptr: CudaSlice<i32>,
    phys_q_indices: CudaSlice<i32>,
    phys_valid: CudaSlice<i32>,
    document_workspace_starts: CudaSlice<i32>,
    query_offsets: CudaSlice<i32>,
}

impl Metadata {
    /// The layout the metadata was built for.
    pub fn layout(&self) -> &Arc<DeviceLayout> {
        &self.layout
    }
    /// The selection `[4, T, 16]` the metadata was built from.
    pub fn topk(&self) -> &CudaSlice<i32> {
        &self.topk
    }
    /// Chunk size of the work list (`balanced_target_q_per_cta(T, SMs)`).
    pub fn target_q_per_cta(&self) -> usize {
        self.target_q_per_cta
    }
    /// Rows of `scheduler_metadata` (`flat_schedule_capacity`).
    pub fn work_capacity(&self) -> usize {
        self.work_capacity
    }
    /// `[4]`: `(code, head, query, slot)` of the first invalid entry, zeros when valid.
    pub fn error_word(&self) -> &CudaSlice<i32> {
        &self.error_word
    }
    /// `[4, R+1]` k2q row offsets.
    pub fn row_ptr(&self) -> &CudaSlice<i32> {
        &self.row_ptr
    }
    /// `[4, T·16]` fragment-local queries, ascending per row, `-1` tail.
    pub fn q_indices(&self) -> &CudaSlice<i32> {
        &self.q_indices
    }
    /// `[4, T·16]` `q_local | writer_rank << 24`, `-1` tail.
    pub fn qsplit(&self) -> &CudaSlice<i32> {
        &self.qsplit
    }
    /// `[T, 4]` valid entries per (query, head).
    pub fn split_counts(&self) -> &CudaSlice<i32> {
        &self.split_counts
    }
    /// `[work_capacity, 6]` work items `(head, row, q_begin, q_count, fragment, level)`.
    pub fn scheduler_metadata(&self) -> &CudaSlice<i32> {
        &self.scheduler_metadata
    }
    /// `[1]` number of work items.
    pub fn work_count(&self) -> &CudaSlice<i32> {
        &self.work_count
    }
    /// `[4, P+1]` physical row offsets.
    pub fn phys_row_ptr(&self) -> &CudaSlice<i32> {
        &self.phys_row_ptr
    }
    /// `[4, T·16]` packed queries per physical block, ascending, `-1` tail.
    pub fn phys_q_indices(&self) -> &CudaSlice<i32> {
        &self.phys_q_indices
    }
    /// `[4, T·16]` `visible_keys | writer_rank << 8`, `-1` tail.
    pub fn phys_valid(&self) -> &CudaSlice<i32> {
        &self.phys_valid
    }
    /// `[B]` workspace row of each fragment's document (the backward schedule's
    /// `document_workspace_starts`).
    pub fn document_workspace_starts(&self) -> &CudaSlice<i32> {
        &self.document_workspace_starts
    }
    /// `[B]` `k_len − q_len` of each fragment (the backward schedule's `query_offsets`).
    pub fn query_offsets(&self) -> &CudaSlice<i32> {
        &self.query_offsets
    }

    /// Read the validation word (one synchronization) and turn a fault into the host planner's
    /// error: `MsaError::Plan(PlanError::TopK { .. })` naming the first offending
    /// (head, query, slot) with `msa_plan::topk`'s message.
    pub fn check(&self, msa: &CudaMsa) -> Result<()> {
        let mut word = [0i32; ERROR_WORDS];
        msa.stream().memcpy_dtoh(&self.error_word, &mut word[..])?;
        if word == [0; ERROR_WORDS] {
            return Ok(());
        }
        let host = self.layout.host();
        let t = host.total_q();
        let (head, query) = match word {
            [1..=4, h, q, s]
                if (0..NUM_INDEX_HEADS as i32).contains(&h)
                    && (0..t as i32).contains(&q)
                    && (0..TOPK_BLOCKS as i32).contains(&s) =>
            {
                (h as usize, q as usize)
            }
            _ => {
                return Err(MsaError::DeviceValidation {
                    word,
                    detail: format!("which is no fault word for T = {t}"),
                })
            }
        };
        // The host message needs the offending row (its value, and for a duplicate the earlier
        // slot). That row alone in an all-padding selection has the same first fault, because
        // the device reported its earliest faulting slot.
        let at = (head * t + query) * TOPK_BLOCKS;
        let row = msa
            .stream()
            .clone_dtoh(&self.topk.slice(at..at + TOPK_BLOCKS))?;
        let mut selection = vec![-1; NUM_INDEX_HEADS * t * TOPK_BLOCKS];
        selection[at..at + TOPK_BLOCKS].copy_from_slice(&row);
        let host_word = topk_error_word(host, &selection)?;
        if host_word != word {
            return Err(MsaError::DeviceValidation {
                word,
                detail: format!("but the host rule finds {host_word:?} in row {row:?}"),
            });
        }
        validate_topk(host, &selection)?;
        unreachable!("a non-zero error word is a fault of the host rule")
    }
}

impl CudaMsa {
    /// Build the metadata of `topk` (`[4, T, 16]`, taken over by the result) for `layout` and
    /// validate the selection: one synchronization reads the validation word, and an invalid
    /// entry is returned as `MsaError::Plan(PlanError::TopK { .. })`.
    pub fn prepare(&self, layout: &Arc<DeviceLayout>, topk: CudaSlice<i32>) -> Result<Metadata> {
        let metadata = self.prepare_unchecked(layout, topk)?;
        metadata.check(self)?;
        Ok(metadata)
    }

    /// [`CudaMsa::prepare`] without reading the validation word: no host synchronization, so it
    /// can be captured in a CUDA graph; call [`Metadata::check`] later. Invalid entries cannot
    /// make the build read or write out of bounds (edges are the entries `0 <= e < num_blocks`,
    /// as on the host), but kernels run on an unchecked selection compute garbage.
    pub fn prepare_unchecked(
        &self,
        layout: &Arc<DeviceLayout>,
        topk: CudaSlice<i32>,
    ) -> Result<Metadata> {
        let host = layout.host();
        let (t, rows, blocks, batch) = (
            host.total_q(),
            host.total_rows(),
            host.padded_kv_blocks(),
            host.batch(),
        );
        let edges = NUM_INDEX_HEADS * t * TOPK_BLOCKS;
        layout.check("topk_indices", &topk, Shape::Selection)?;
        let target_q_per_cta = balanced_target_q_per_cta(t, self.device().sm_count as usize);
        let work_capacity = flat_schedule_capacity(rows, t, target_q_per_cta);
        let work_capacity_i32 =
            i32::try_from(work_capacity).map_err(|_| msa_plan::PlanError::Overflow {
                what: "work capacity",
                limit: i32::MAX as i64,
                got: work_capacity as i64,
            })?;

        let metadata = Metadata {
            layout: layout.clone(),
            error_word: self.output(ERROR_WORDS)?,
            row_ptr: self.output(NUM_INDEX_HEADS * (rows + 1))?,
            q_indices: self.output(edges)?,
            qsplit: self.output(edges)?,
            split_counts: self.output(t * NUM_INDEX_HEADS)?,
            scheduler_metadata: self.output(work_capacity * WORK_WORDS)?,
            work_count: self.output(1)?,
            phys_row_ptr: self.output(NUM_INDEX_HEADS * (blocks + 1))?,
            phys_q_indices: self.output(edges)?,
            phys_valid: self.output(edges)?,
            document_workspace_starts: self.output(batch)?,
            query_offsets: self.output(batch)?,
            topk,
            target_q_per_cta,
            work_capacity,
        };
        let varlen = layout.varlen(self);
        self.context().bind_to_thread()?;
        // SAFETY: a context is current (bound above).
        let bytes = unsafe { launch::prepare::workspace_bytes(varlen)? };
        // SAFETY: scratch; every word is written before it is read.
        let workspace = unsafe { self.stream().alloc::<u8>(bytes)? };
        let s = self.stream();
        let m = &metadata;
        let out = sys::MsaPrepareOutputs {
            error_word: dptr(&m.error_word, s) as *mut i32,
            row_ptr: dptr(&m.row_ptr, s) as *mut i32,
            q_indices: dptr(&m.q_indices, s) as *mut i32,
            qsplit: dptr(&m.qsplit, s) as *mut i32,
            split_counts: dptr(&m.split_counts, s) as *mut i32,
            scheduler_metadata: dptr(&m.scheduler_metadata, s) as *mut i32,
            work_count: dptr(&m.work_count, s) as *mut i32,
            phys_row_ptr: dptr(&m.phys_row_ptr, s) as *mut i32,
            phys_q_indices: dptr(&m.phys_q_indices, s) as *mut i32,
            phys_valid: dptr(&m.phys_valid, s) as *mut i32,
            document_workspace_starts: dptr(&m.document_workspace_starts, s) as *mut i32,
            query_offsets: dptr(&m.query_offsets, s) as *mut i32,
        };
        // SAFETY: every buffer was allocated above (or checked) with the sizes prepare.h gives
        // for this layout, target and capacity; the workspace holds `bytes`. Dropping the
        // workspace after the launches is safe: cudarc frees in stream order (memory pools) or
        // synchronizes first.
        unsafe {
            launch::prepare::metadata(
                dptr(&m.topk, s),
                varlen,
                target_q_per_cta as i32,
                work_capacity_i32,
                out,
                dptr(&workspace, s),
                bytes,
                self.raw_stream(),
            )?
        };
        Ok(metadata)
    }
}
