//! The backward task build on the device (docs/contract.md §5.2): four launches turn the forward
//! schedule into locality-ordered task rows and the CTA walk, bit-exact with
//! `msa_plan::build_backward_tasks` (scratch and tables word for word). The exact task count
//! stays on the device; the host launches the main kernel with [`DeviceTaskTables::grid_launch`]
//! CTAs and surplus CTAs find an empty interval in the descriptor.

use cudarc::driver::{CudaSlice, CudaView};
use msa_plan::backward::abi::{DESC_WORDS, META_WORDS, TASK_QUERIES};
use msa_plan::schedule::WORK_WORDS;
use msa_plan::topology::NUM_INDEX_HEADS;
use msa_plan::{build_backward_tasks, grid_launch_bound, MsaBackwardSchedule, TaskBuildSizes};

use super::{CudaMsa, Metadata, Views};
use crate::error::Result;
use crate::raw;

/// A forward schedule uploaded as is, e.g. a hand-made one (tests force capacity overflow or
/// noncontiguous segments with it). The host copy is kept so every build can first run
/// `msa_plan`'s checks of the work items, which the kernels trust.
pub struct DeviceSchedule {
    host: MsaBackwardSchedule,
    row_ptr: CudaSlice<i32>,
    q_indices: CudaSlice<i32>,
    scheduler_metadata: CudaSlice<i32>,
    work_count: CudaSlice<i32>,
    cu_seqlens: CudaSlice<i32>,
    document_workspace_starts: CudaSlice<i32>,
    query_offsets: CudaSlice<i32>,
}

impl DeviceSchedule {
    /// Upload every tensor of `schedule`.
    pub fn upload(msa: &CudaMsa, schedule: &MsaBackwardSchedule) -> Result<Self> {
        Ok(Self {
            row_ptr: msa.upload(schedule.row_ptr())?,
            q_indices: msa.upload(schedule.q_indices())?,
            scheduler_metadata: msa.upload(schedule.scheduler_metadata())?,
            work_count: msa.upload(&[schedule.work_count()])?,
            cu_seqlens: msa.upload(schedule.cu_seqlens())?,
            document_workspace_starts: msa.upload(schedule.document_workspace_starts())?,
            query_offsets: msa.upload(schedule.query_offsets())?,
            host: schedule.clone(),
        })
    }

    /// The host schedule that was uploaded.
    pub fn host(&self) -> &MsaBackwardSchedule {
        &self.host
    }
}

/// Scratch and table buffers of one build (`msa_plan::backward::abi` layouts).
pub struct DeviceTaskTables {
    sizes: TaskBuildSizes,
    grid_launch: usize,
    scratch: CudaSlice<i32>,
    tables: CudaSlice<i32>,
}

impl DeviceTaskTables {
    /// Buffer sizes (`msa_plan::task_build_sizes`).
    pub fn sizes(&self) -> &TaskBuildSizes {
        &self.sizes
    }
    /// CTAs to launch the main kernel with, `grid_launch_bound(capacity, num_sms)`.
    pub fn grid_launch(&self) -> usize {
        self.grid_launch
    }
    /// `desc | task_ends | task_segments | bins | task_decode` (`scratch_words` i32).
    pub fn scratch(&self) -> &CudaSlice<i32> {
        &self.scratch
    }
    /// `task_meta | task_qrows | task_qpos` (`table_words` i32).
    pub fn tables(&self) -> &CudaSlice<i32> {
        &self.tables
    }
    /// `[8]` descriptor: the CTA walk, work items, task count, flags.
    pub fn desc(&self) -> CudaView<'_, i32> {
        self.scratch.slice(..DESC_WORDS)
    }
    /// `[capacity, 4]` `(0, head, workspace kblock, valid)`.
    pub fn task_meta(&self) -> CudaView<'_, i32> {
        self.tables.slice(..self.sizes.capacity * META_WORDS)
    }
    /// `[capacity, 8]` packed query rows, `-1` past `valid`.
    pub fn task_qrows(&self) -> CudaView<'_, i32> {
        let at = self.sizes.capacity * META_WORDS;
        self.tables
            .slice(at..at + self.sizes.capacity * TASK_QUERIES)
    }
    /// `[capacity, 8]` workspace positions of the queries, `-1` past `valid`.
    pub fn task_qpos(&self) -> CudaView<'_, i32> {
        let at = self.sizes.capacity * (META_WORDS + TASK_QUERIES);
        self.tables
            .slice(at..at + self.sizes.capacity * TASK_QUERIES)
    }
}

impl CudaMsa {
    /// Build the backward task tables of `metadata` (its k2q CSR and work list) for this
    /// device's SM count; no host synchronization.
    pub fn task_build(&self, metadata: &Metadata) -> Result<DeviceTaskTables> {
        // Before any allocation (a poisoned one launches a fill).
        let csr = metadata.tables("task_build")?;
        let layout = metadata.layout();
        let shape = raw::TaskBuildShape::of(layout.shape());
        let sizes = shape.sizes()?;
        let mut tables = self.task_tables(&shape, sizes)?;
        {
            let mut g = Views::new(self)?;
            let lay = layout.views(&mut g)?;
            let m = metadata.views(&mut g, csr)?;
            let inputs = raw::TaskBuildInputs::of(&lay, &m);
            // SAFETY: prepare built every input with this shape, and its work items lie inside
            // its CSR by construction; guards held by `g` until the launches are enqueued.
            unsafe { tables.build(&mut g, &inputs, &shape)? };
        }
        Ok(tables)
    }

    /// Build the task tables of an uploaded schedule for `num_tokens` tokens, `workspace_rows`
    /// workspace rows and a walk over `num_sms` SMs. The host planner checks the sizes and every
    /// work item first (`msa_plan::build_backward_tasks`' errors), then four launches run.
    pub fn task_build_schedule(
        &self,
        schedule: &DeviceSchedule,
        num_tokens: usize,
        workspace_rows: usize,
        num_sms: usize,
    ) -> Result<DeviceTaskTables> {
        let h = &schedule.host;
        build_backward_tasks(h, num_tokens, workspace_rows, num_sms)?;
        let shape = raw::TaskBuildShape {
            rows: h.rows(),
            edge_capacity: h.edge_capacity(),
            work_capacity: h.work_capacity(),
            documents: h.documents(),
            num_tokens,
            workspace_rows,
            num_sms,
        };
        let sizes = shape.sizes()?;
        let mut tables = self.task_tables(&shape, sizes)?;
        {
            let mut g = Views::new(self)?;
            let docs = h.documents();
            let inputs = raw::TaskBuildInputs {
                row_ptr: g.read(
                    "row_ptr",
                    &schedule.row_ptr,
                    NUM_INDEX_HEADS * (h.rows() + 1),
                )?,
                q_indices: g.read(
                    "q_indices",
                    &schedule.q_indices,
                    NUM_INDEX_HEADS * h.edge_capacity(),
                )?,
                scheduler_metadata: g.read(
                    "scheduler_metadata",
                    &schedule.scheduler_metadata,
                    h.work_capacity() * WORK_WORDS,
                )?,
                work_count: g.read("work_count", &schedule.work_count, 1)?,
                cu_seqlens: g.read("cu_seqlens", &schedule.cu_seqlens, docs + 1)?,
                document_workspace_starts: g.read(
                    "document_workspace_starts",
                    &schedule.document_workspace_starts,
                    docs,
                )?,
                query_offsets: g.read("query_offsets", &schedule.query_offsets, docs)?,
            };
            // SAFETY: the uploads have the host schedule's shapes, and the host check above
            // proved that its work items stay inside them; guards held by `g`.
            unsafe { tables.build(&mut g, &inputs, &shape)? };
        }
        Ok(tables)
    }

    /// Output buffers of one build (poisoned when asked; the build fills them with -1 first).
    fn task_tables(
        &self,
        shape: &raw::TaskBuildShape,
        sizes: TaskBuildSizes,
    ) -> Result<DeviceTaskTables> {
        Ok(DeviceTaskTables {
            sizes,
            grid_launch: grid_launch_bound(sizes.capacity, shape.num_sms),
            scratch: self.output(sizes.scratch_words)?,
            tables: self.output(sizes.table_words)?,
        })
    }
}

impl DeviceTaskTables {
    /// # Safety
    /// `inputs` must be live device arrays of this context of `shape`'s sizes whose work items
    /// stay inside them, their guards held by `g`.
    unsafe fn build<'a>(
        &'a mut self,
        g: &mut Views<'a>,
        inputs: &raw::TaskBuildInputs,
        shape: &raw::TaskBuildShape,
    ) -> Result<()> {
        let sizes = self.sizes;
        let mut scratch = g.write("task-build scratch", &mut self.scratch, sizes.scratch_words)?;
        let mut tables = g.write("task tables", &mut self.tables, sizes.table_words)?;
        // SAFETY: the caller's contract plus the buffers sized for `shape`, guards held by `g`.
        unsafe { raw::task_build(inputs, shape, &mut scratch, &mut tables, g.stream())? };
        Ok(())
    }
}
