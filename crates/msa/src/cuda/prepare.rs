//! `prepare` on the device (docs/design.md "Device data of one call"): top-k validation, the k2q
//! CSR, the forward work list and the physical CSR of one selection, built by one launcher with
//! no host synchronization. Every table equals `msa_plan`'s host build word for word.
//!
//! The forward reads only the validated selection, so `prepare_forward` validates alone and
//! `build_tables` adds the CSR tables where the backward starts (docs/perf/schedule.md,
//! "Session 17"): a forward-only call never builds them.
//!
//! The metadata belongs to one top-k result (docs/contract.md §4), so [`Metadata`] owns the device
//! selection it was built from; kernels that need the selection take it from there.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use msa_plan::topology::{NUM_INDEX_HEADS, TOPK_BLOCKS};
use msa_plan::{topk_error_word, validate_topk};

use super::{CudaMsa, DeviceLayout, Views};
use crate::error::{MsaError, Result};
use crate::raw;

/// Words of the validation result `(code, head, query, slot)`.
const ERROR_WORDS: usize = 4;

/// The CSR tables of one selection (int32 tensors, layouts of `msa_plan`): what the backward and
/// the KL backward read. [`CudaMsa::prepare`] builds them; [`CudaMsa::prepare_forward`] leaves
/// them to [`CudaMsa::build_tables`].
pub struct Tables {
    row_ptr: CudaSlice<i32>,
    q_indices: CudaSlice<i32>,
    qsplit: CudaSlice<i32>,
    scheduler_metadata: CudaSlice<i32>,
    work_count: CudaSlice<i32>,
    phys_row_ptr: CudaSlice<i32>,
    phys_q_indices: CudaSlice<i32>,
    phys_valid: CudaSlice<i32>,
    document_workspace_starts: CudaSlice<i32>,
    query_offsets: CudaSlice<i32>,
}

impl Tables {
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

    fn new(msa: &CudaMsa, s: &raw::Sizes) -> Result<Self> {
        Ok(Tables {
            row_ptr: msa.output(s.row_ptr)?,
            q_indices: msa.output(s.selection)?,
            qsplit: msa.output(s.selection)?,
            scheduler_metadata: msa.output(s.scheduler_metadata)?,
            work_count: msa.output(s.work_count)?,
            phys_row_ptr: msa.output(s.phys_row_ptr)?,
            phys_q_indices: msa.output(s.selection)?,
            phys_valid: msa.output(s.selection)?,
            document_workspace_starts: msa.output(s.batch)?,
            query_offsets: msa.output(s.batch)?,
        })
    }
}

/// The device metadata of one top-k selection: the selection, its validation word and
/// per-(query, head) edge counts, and (unless it came from [`CudaMsa::prepare_forward`]) the CSR
/// [`Tables`].
pub struct Metadata {
    layout: Arc<DeviceLayout>,
    topk: CudaSlice<i32>,
    target_q_per_cta: usize,
    work_capacity: usize,
    error_word: CudaSlice<i32>,
    split_counts: CudaSlice<i32>,
    tables: Option<Tables>,
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
    /// `[T, 4]` valid entries per (query, head).
    pub fn split_counts(&self) -> &CudaSlice<i32> {
        &self.split_counts
    }
    /// Whether the CSR tables are built (the backward and the KL backward need them).
    pub fn has_tables(&self) -> bool {
        self.tables.is_some()
    }
    /// The CSR tables; [`MsaError::NoTables`] naming `op` when the metadata came from
    /// [`CudaMsa::prepare_forward`] and [`CudaMsa::build_tables`] has not run on it.
    pub fn tables(&self, op: &'static str) -> Result<&Tables> {
        self.tables.as_ref().ok_or(MsaError::NoTables { op })
    }

    /// The raw views of the selection and every metadata tensor, guards held by `v`; `t` is this
    /// metadata's tables, which the caller took with [`Metadata::tables`] before allocating.
    pub(crate) fn views<'a>(&'a self, v: &mut Views<'a>, t: &'a Tables) -> Result<raw::Metadata> {
        let s = self.layout.shape().sizes();
        Ok(raw::Metadata {
            topk: v.read("topk_indices", &self.topk, s.selection)?,
            error_word: v.read("error_word", &self.error_word, s.error_word)?,
            row_ptr: v.read("row_ptr", &t.row_ptr, s.row_ptr)?,
            q_indices: v.read("q_indices", &t.q_indices, s.selection)?,
            qsplit: v.read("qsplit", &t.qsplit, s.selection)?,
            split_counts: v.read("split_counts", &self.split_counts, s.split_counts)?,
            scheduler_metadata: v.read(
                "scheduler_metadata",
                &t.scheduler_metadata,
                s.scheduler_metadata,
            )?,
            work_count: v.read("work_count", &t.work_count, s.work_count)?,
            phys_row_ptr: v.read("phys_row_ptr", &t.phys_row_ptr, s.phys_row_ptr)?,
            phys_q_indices: v.read("phys_q_indices", &t.phys_q_indices, s.selection)?,
            phys_valid: v.read("phys_valid", &t.phys_valid, s.selection)?,
            document_workspace_starts: v.read(
                "document_workspace_starts",
                &t.document_workspace_starts,
                s.batch,
            )?,
            query_offsets: v.read("query_offsets", &t.query_offsets, s.batch)?,
        })
    }

    /// Read the validation word (one synchronization) and turn a fault into the host planner's
    /// error: `MsaError::Plan(PlanError::TopK { .. })` naming the first offending
    /// (head, query, slot) with `msa_plan::topk`'s message.
    pub fn check(&self, msa: &CudaMsa) -> Result<()> {
        let word = {
            let mut v = Views::new(msa)?;
            let error_word = v.read("error_word", &self.error_word, ERROR_WORDS)?;
            // SAFETY: a live 4-word allocation of this context written by prepare on this
            // stream; the stream is the context's and is not being captured by the facade.
            unsafe { raw::read_error_word(error_word, v.stream())? }
        };
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
    /// Build the metadata of `topk` (`[4, T, 16]`, taken over by the result) for `layout`, CSR
    /// tables included, and validate the selection: one synchronization reads the validation
    /// word, and an invalid entry is returned as `MsaError::Plan(PlanError::TopK { .. })`.
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
        let mut metadata = self.metadata_without_tables(layout, topk)?;
        self.build_tables(&mut metadata)?;
        Ok(metadata)
    }

    /// The validation alone (one short kernel): the metadata the forward needs, which reads only
    /// the validated selection; the backward and the KL backward need [`CudaMsa::build_tables`]
    /// on it first (else [`MsaError::NoTables`] before any launch). A training step pays the
    /// tables where its backward starts; a forward-only call never does. Checked as
    /// [`CudaMsa::prepare`]: one synchronization, the planner's typed error.
    pub fn prepare_forward(
        &self,
        layout: &Arc<DeviceLayout>,
        topk: CudaSlice<i32>,
    ) -> Result<Metadata> {
        let metadata = self.prepare_forward_unchecked(layout, topk)?;
        metadata.check(self)?;
        Ok(metadata)
    }

    /// [`CudaMsa::prepare_forward`] without reading the validation word: no host
    /// synchronization, graph-capturable; call [`Metadata::check`] later.
    pub fn prepare_forward_unchecked(
        &self,
        layout: &Arc<DeviceLayout>,
        topk: CudaSlice<i32>,
    ) -> Result<Metadata> {
        let mut metadata = self.metadata_without_tables(layout, topk)?;
        let shape = layout.shape();
        let s = shape.sizes();
        self.context().bind_to_thread()?;
        let mut workspace = self.scratch(raw::VALIDATE_WORKSPACE_BYTES)?;
        let mut v = Views::new(self)?;
        let m = &mut metadata;
        let lay = layout.views(&mut v)?;
        let topk = v.read("topk_indices", &m.topk, s.selection)?;
        let mut out = raw::ValidateOutputs {
            error_word: v.write("error_word", &mut m.error_word, s.error_word)?,
            split_counts: v.write("split_counts", &mut m.split_counts, s.split_counts)?,
        };
        let ws = v.workspace("validation workspace", &mut workspace)?;
        // SAFETY: every view is a live allocation of this context (guards held by `v` until
        // the launch is enqueued; the workspace is freed in stream order after it), the stream
        // is the context's, and the layout's arrays are this shape's.
        unsafe { raw::prepare_validate(shape, &lay, topk, &mut out, ws, v.stream())? };
        drop(v);
        Ok(metadata)
    }

    /// Build `meta`'s CSR tables on the device (one cooperative kernel, no host synchronization,
    /// graph-capturable; it validates the selection again, writing the same word). Rebuilds
    /// them when present, so a graph that captures this call refreshes them on replay.
    pub fn build_tables(&self, meta: &mut Metadata) -> Result<()> {
        let layout = meta.layout.clone();
        let shape = layout.shape();
        let s = shape.sizes();
        let mut tables = match meta.tables.take() {
            Some(t) => t,
            None => Tables::new(self, s)?,
        };
        self.context().bind_to_thread()?;
        let bytes = raw::prepare_workspace_bytes(shape)?;
        let mut workspace = self.scratch(bytes)?;
        {
            let mut v = Views::new(self)?;
            let m = &mut *meta;
            let t = &mut tables;
            let lay = layout.views(&mut v)?;
            let topk = v.read("topk_indices", &m.topk, s.selection)?;
            let mut out = raw::PrepareOutputs {
                error_word: v.write("error_word", &mut m.error_word, s.error_word)?,
                row_ptr: v.write("row_ptr", &mut t.row_ptr, s.row_ptr)?,
                q_indices: v.write("q_indices", &mut t.q_indices, s.selection)?,
                qsplit: v.write("qsplit", &mut t.qsplit, s.selection)?,
                split_counts: v.write("split_counts", &mut m.split_counts, s.split_counts)?,
                scheduler_metadata: v.write(
                    "scheduler_metadata",
                    &mut t.scheduler_metadata,
                    s.scheduler_metadata,
                )?,
                work_count: v.write("work_count", &mut t.work_count, s.work_count)?,
                phys_row_ptr: v.write("phys_row_ptr", &mut t.phys_row_ptr, s.phys_row_ptr)?,
                phys_q_indices: v.write("phys_q_indices", &mut t.phys_q_indices, s.selection)?,
                phys_valid: v.write("phys_valid", &mut t.phys_valid, s.selection)?,
                document_workspace_starts: v.write(
                    "document_workspace_starts",
                    &mut t.document_workspace_starts,
                    s.batch,
                )?,
                query_offsets: v.write("query_offsets", &mut t.query_offsets, s.batch)?,
            };
            let ws = v.workspace("prepare workspace", &mut workspace)?;
            // SAFETY: every view is a live allocation of this context (guards held by `v` until
            // the launches are enqueued; the workspace is freed in stream order after them), the
            // stream is the context's, and the layout's arrays are this shape's.
            unsafe { raw::prepare(shape, &lay, topk, &mut out, ws, v.stream())? };
        }
        meta.tables = Some(tables);
        Ok(())
    }

    /// The metadata of `topk` with its validation outputs allocated, no tables, nothing
    /// launched: the length check comes before any allocation (a poisoned one launches a fill).
    fn metadata_without_tables(
        &self,
        layout: &Arc<DeviceLayout>,
        topk: CudaSlice<i32>,
    ) -> Result<Metadata> {
        let s = layout.shape().sizes();
        if !(s.selection == 0 && topk.len() == 1) {
            raw::check_length::<i32>("topk_indices", topk.len(), s.selection, "[4, T, 16]")?;
        }
        Ok(Metadata {
            layout: layout.clone(),
            error_word: self.output(s.error_word)?,
            split_counts: self.output(s.split_counts)?,
            topk,
            target_q_per_cta: s.target_q_per_cta,
            work_capacity: s.work_capacity,
            tables: None,
        })
    }
}
