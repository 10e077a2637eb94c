//! The backward task build on the device (docs/contract.md §5.2): four launches turn the forward
//! schedule into locality-ordered task rows and the CTA walk, bit-exact with
//! `msa_plan::build_backward_tasks` (scratch and tables word for word). The exact task count
//! stays on the device; the host launches the main kernel with [`DeviceTaskTables::grid_launch`]
//! CTAs and surplus CTAs find an empty interval in the descriptor.

use cudarc::driver::{CudaSlice, CudaView};
use msa_kernels::{launch, sys};
use msa_plan::backward::abi::{DESC_WORDS, META_WORDS, TASK_QUERIES};
use msa_plan::schedule::WORK_WORDS;
use msa_plan::topology::{BLOCK_SIZE, NUM_INDEX_HEADS, TOPK_BLOCKS};
use msa_plan::{
    build_backward_tasks, grid_launch_bound, task_build_sizes, Int32Array, MsaBackwardSchedule,
    PlanError, ScheduleParts, TaskBuildSizes,
};

use super::{dptr, CudaMsa, Metadata};
use crate::error::Result;

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

fn to_i32(what: &'static str, v: usize) -> Result<i32> {
    Ok(i32::try_from(v).map_err(|_| PlanError::Overflow {
        what,
        limit: i32::MAX as i64,
        got: v as i64,
    })?)
}

/// Shapes of one build (the fields of `MsaTaskBuildShape`).
struct Shape {
    rows: usize,
    edge_capacity: usize,
    work_capacity: usize,
    documents: usize,
    num_tokens: usize,
    workspace_rows: usize,
    num_sms: usize,
}

impl Shape {
    /// `msa_plan::task_build_sizes` for these shapes. The planner sizes a build from the
    /// schedule's shapes only; zero-filled tensors of those shapes (calloc'd, never touched) let
    /// the device path reuse its rules and error messages (MAX_BINS, int32 overflow).
    fn sizes(&self) -> Result<TaskBuildSizes> {
        let zeros = |shape: &[usize]| Int32Array::new(vec![0; shape.iter().product()], shape);
        let schedule = MsaBackwardSchedule::new(ScheduleParts {
            row_ptr: zeros(&[NUM_INDEX_HEADS, self.rows + 1]),
            q_indices: zeros(&[NUM_INDEX_HEADS, self.edge_capacity]),
            scheduler_metadata: zeros(&[self.work_capacity, WORK_WORDS]),
            work_count: zeros(&[1]),
            cu_seqlens: zeros(&[self.documents + 1]),
            document_workspace_starts: zeros(&[self.documents]),
            query_offsets: None,
        })?;
        Ok(task_build_sizes(
            &schedule,
            self.num_tokens,
            self.workspace_rows,
        )?)
    }

    fn to_sys(&self) -> Result<sys::MsaTaskBuildShape> {
        Ok(sys::MsaTaskBuildShape {
            rows: to_i32("CSR rows", self.rows)?,
            edge_capacity: to_i32("edge capacity", self.edge_capacity)?,
            work_capacity: to_i32("work capacity", self.work_capacity)?,
            documents: to_i32("documents", self.documents)?,
            num_tokens: to_i32("num_tokens", self.num_tokens)?,
            workspace_rows: to_i32("workspace_rows", self.workspace_rows)?,
            num_sms: to_i32("num_sms", self.num_sms)?,
        })
    }
}

impl CudaMsa {
    /// Build the backward task tables of `metadata` (its k2q CSR and work list) for this
    /// device's SM count; no host synchronization.
    pub fn task_build(&self, metadata: &Metadata) -> Result<DeviceTaskTables> {
        let host = metadata.layout().host();
        let shape = Shape {
            rows: host.total_rows(),
            edge_capacity: host.total_q() * TOPK_BLOCKS,
            work_capacity: metadata.work_capacity(),
            documents: host.batch(),
            num_tokens: host.total_q(),
            workspace_rows: host.padded_kv_blocks() * BLOCK_SIZE,
            num_sms: self.device().sm_count as usize,
        };
        let s = self.stream();
        let inputs = sys::MsaTaskBuildInputs {
            row_ptr: dptr(metadata.row_ptr(), s) as *const i32,
            q_indices: dptr(metadata.q_indices(), s) as *const i32,
            scheduler_metadata: dptr(metadata.scheduler_metadata(), s) as *const i32,
            work_count: dptr(metadata.work_count(), s) as *const i32,
            cu_seqlens: dptr(metadata.layout().cu_seqlens_q(), s) as *const i32,
            document_workspace_starts: dptr(metadata.document_workspace_starts(), s) as *const i32,
            query_offsets: dptr(metadata.query_offsets(), s) as *const i32,
        };
        // SAFETY: prepare built every input with the shapes above, and its work items lie
        // inside its CSR by construction.
        unsafe { self.build_tasks(inputs, &shape) }
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
        let shape = Shape {
            rows: h.rows(),
            edge_capacity: h.edge_capacity(),
            work_capacity: h.work_capacity(),
            documents: h.documents(),
            num_tokens,
            workspace_rows,
            num_sms,
        };
        let s = self.stream();
        let inputs = sys::MsaTaskBuildInputs {
            row_ptr: dptr(&schedule.row_ptr, s) as *const i32,
            q_indices: dptr(&schedule.q_indices, s) as *const i32,
            scheduler_metadata: dptr(&schedule.scheduler_metadata, s) as *const i32,
            work_count: dptr(&schedule.work_count, s) as *const i32,
            cu_seqlens: dptr(&schedule.cu_seqlens, s) as *const i32,
            document_workspace_starts: dptr(&schedule.document_workspace_starts, s) as *const i32,
            query_offsets: dptr(&schedule.query_offsets, s) as *const i32,
        };
        // SAFETY: the uploads have the host schedule's shapes, and the host check above proved
        // that its work items stay inside them.
        unsafe { self.build_tasks(inputs, &shape) }
    }

    /// # Safety
    /// `inputs` must be device arrays of `shape`'s sizes whose work items stay inside them.
    unsafe fn build_tasks(
        &self,
        inputs: sys::MsaTaskBuildInputs,
        shape: &Shape,
    ) -> Result<DeviceTaskTables> {
        let sizes = shape.sizes()?;
        let sys_shape = shape.to_sys()?;
        let tables = DeviceTaskTables {
            sizes,
            grid_launch: grid_launch_bound(sizes.capacity, shape.num_sms),
            scratch: self.output(sizes.scratch_words)?,
            tables: self.output(sizes.table_words)?,
        };
        let s = self.stream();
        launch::task_build::tables(
            inputs,
            sys_shape,
            dptr(&tables.scratch, s),
            sizes.scratch_words,
            dptr(&tables.tables, s),
            sizes.table_words,
            self.raw_stream(),
        )?;
        Ok(tables)
    }
}
