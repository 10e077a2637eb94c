//! The attention into caller buffers (kernels/include/msa/attention.h, task_build.h): the
//! forward, the backward on one of three paths, and the backward's pieces.

use half::bf16;
use msa_kernels::{launch, sys, KernelError};
use msa_plan::backward::abi::{META_WORDS, TASK_QUERIES};
use msa_plan::schedule::WORK_WORDS;
use msa_plan::topology::{BLOCK_SIZE, NUM_INDEX_HEADS, TOPK_BLOCKS};
use msa_plan::{task_build_buffer_sizes, PlanError, TaskBuildSizes};

use super::check;
use super::layout::Layout;
use super::prepare::Metadata;
use super::shape::{BackwardPath, CallShape, KernelSet};
use super::view::{DevSlice, DevSliceMut, Stream};
use crate::error::Result;

/// `cudaErrorNotSupported`, what the sm_90a launchers return on other devices.
const CUDA_ERROR_NOT_SUPPORTED: i32 = 801;

/// The attention's inputs: q `[T, 64, 128]`, k and v `[Tk, 4, 128]` (bf16).
#[derive(Debug, Clone, Copy)]
pub struct AttentionInputs {
    pub q: DevSlice<bf16>,
    pub k: DevSlice<bf16>,
    pub v: DevSlice<bf16>,
}

impl AttentionInputs {
    pub(super) fn check(&self, shape: &CallShape) -> Result<()> {
        let s = shape.sizes();
        check::tensor("q", &self.q, s.queries, "[T, 64, 128]")?;
        check::tensor("k", &self.k, s.keys, "[Tk, 4, 128]")?;
        check::tensor("v", &self.v, s.keys, "[Tk, 4, 128]")
    }
}

/// The forward's outputs: out bf16 `[T, 64, 128]`, lse f32 `[T, 64]` (natural log), every
/// element written.
#[derive(Debug)]
pub struct ForwardOutputs {
    pub out: DevSliceMut<bf16>,
    pub lse: DevSliceMut<f32>,
}

/// The backward's inputs: q, dout, out `[T, 64, 128]`, k, v `[Tk, 4, 128]` (bf16) and the
/// forward's lse `[T, 64]` (f32).
#[derive(Debug, Clone, Copy)]
pub struct BackwardInputs {
    pub q: DevSlice<bf16>,
    pub k: DevSlice<bf16>,
    pub v: DevSlice<bf16>,
    pub dout: DevSlice<bf16>,
    pub out: DevSlice<bf16>,
    pub lse: DevSlice<f32>,
}

impl BackwardInputs {
    fn check(&self, shape: &CallShape) -> Result<()> {
        let s = shape.sizes();
        AttentionInputs {
            q: self.q,
            k: self.k,
            v: self.v,
        }
        .check(shape)?;
        check::tensor("dout", &self.dout, s.queries, "[T, 64, 128]")?;
        check::tensor("out", &self.out, s.queries, "[T, 64, 128]")?;
        check::tensor("lse", &self.lse, s.query_heads, "[T, 64]")
    }
}

/// The gradients: dq `[T, 64, 128]`, dk and dv `[Tk, 4, 128]` (bf16), every element written (keys
/// no query selected get exact zeros).
#[derive(Debug)]
pub struct Gradients {
    pub dq: DevSliceMut<bf16>,
    pub dk: DevSliceMut<bf16>,
    pub dv: DevSliceMut<bf16>,
}

impl Gradients {
    fn check(&self, shape: &CallShape) -> Result<()> {
        let s = shape.sizes();
        check::output("dq", &self.dq, s.queries, "[T, 64, 128]")?;
        check::output("dk", &self.dk, s.keys, "[Tk, 4, 128]")?;
        check::output("dv", &self.dv, s.keys, "[Tk, 4, 128]")
    }
}

/// The sparse attention forward over the selection `topk` (`[4, T, 16]`, which must be valid:
/// [`prepare_validate`](super::prepare_validate) or [`prepare`](super::prepare) checked it; the
/// forward reads nothing else of the metadata):
/// `out` and `lse`, deterministic. With [`KernelSet::Sm90a`] on compute capability 9.0 the
/// warp-specialized wgmma/TMA kernel runs (its TMA descriptors are encoded on the host at each
/// launch, by value, so a captured graph replays with the same buffers); [`KernelSet::Sm80`]
/// forces the mma.sync kernel on any device. `workspace` holds at least
/// [`Sizes::forward_workspace_bytes`](super::Sizes::forward_workspace_bytes)`(kernels)`, 256-byte
/// aligned. Lengths are checked before the launch.
///
/// # Safety
/// Every view must be device memory of its length, usable from the current CUDA context, that
/// stays allocated until the launches have run; `stream` must be a live stream of that context;
/// `layout` must be the layout of `shape` and `topk` a selection for it that passed validation
/// (the kernels trust it).
// One argument per role, as the C launchers.
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward(
    shape: &CallShape,
    layout: &Layout,
    topk: DevSlice<i32>,
    inputs: &AttentionInputs,
    out: &mut ForwardOutputs,
    kernels: KernelSet,
    workspace: DevSliceMut<u8>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    check::tensor("topk_indices", &topk, s.selection, "[4, T, 16]")?;
    inputs.check(shape)?;
    check::output("out", &out.out, s.queries, "[T, 64, 128]")?;
    check::output("lse", &out.lse, s.query_heads, "[T, 64]")?;
    let bytes = s.forward_workspace_bytes(kernels);
    check::workspace("forward workspace", &workspace, bytes)?;
    let params = sys::MsaAttnFwdParams {
        q: inputs.q.ptr().cast(),
        k: inputs.k.ptr().cast(),
        v: inputs.v.ptr().cast(),
        topk: topk.ptr(),
        varlen: layout.varlen(shape),
        out: out.out.ptr().cast(),
        lse: out.lse.ptr(),
        workspace: workspace.ptr().cast(),
        workspace_bytes: workspace.len(),
        force_sm80: i32::from(kernels == KernelSet::Sm80),
    };
    // SAFETY: lengths and alignment checked above; the caller's contract covers the memory, the
    // stream, the layout and the validated selection.
    unsafe { launch::attention::forward(&params, stream.as_raw())? };
    Ok(())
}

/// dq, dk, dv from the forward's out and lse on `path` (MSA's choice:
/// [`BackwardPath::select`]); every path first computes `delta = rowsum(dout · out)` into the
/// workspace, then
/// - [`BackwardPath::Sm90`] (compute capability 9.0 only; another device is rejected before any
///   launch): KV-outer over prepare's physical CSR;
/// - [`BackwardPath::Deterministic`] (compute capability 9.0 only, as `Sm90`): the same kernel
///   with a fixed accumulation order, bitwise repeatable on one device;
/// - [`BackwardPath::Sm80Atomic`]: zeroes the fp32 accumulators, builds the task tables on the
///   device ([`task_build`]), runs the KV-parallel main kernel (fp32 atomics) and the bf16
///   postprocess;
/// - [`BackwardPath::Sm80Deterministic`]: dQ query-outer and dK/dV physical-block-outer, bitwise
///   repeatable.
///
/// `workspace` holds at least
/// [`Sizes::backward_workspace_bytes`](super::Sizes::backward_workspace_bytes)`(path)`, 256-byte
/// aligned; its contents are scratch. No host synchronization: task counts stay on the device.
/// Lengths are checked before any launch.
///
/// # Safety
/// As [`forward`].
// One argument per role, as the C launchers.
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward(
    shape: &CallShape,
    layout: &Layout,
    meta: &Metadata,
    inputs: &BackwardInputs,
    grads: &mut Gradients,
    path: BackwardPath,
    workspace: DevSliceMut<u8>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    meta.check(shape)?;
    inputs.check(shape)?;
    grads.check(shape)?;
    let carve = s.backward_carve(path);
    check::workspace("backward workspace", &workspace, carve.bytes)?;
    let task_sizes = match path {
        BackwardPath::Sm80Atomic if shape.total_q() > 0 => Some(TaskBuildShape::of(shape).sizes()?),
        _ => None,
    };
    if path.is_sm90a() {
        let (sm, _) = launch::util::device_sm()?;
        if KernelSet::for_sm(sm) != KernelSet::Sm90a {
            let launcher = match path {
                BackwardPath::Deterministic => "msa_attn_backward_sm90_det",
                _ => "msa_attn_backward_sm90",
            };
            return Err(KernelError::check(launcher, CUDA_ERROR_NOT_SUPPORTED)
                .expect_err("a nonzero code is an error")
                .into());
        }
    }
    let mut delta = workspace.carve::<f32>(carve.delta, s.query_heads);
    // The deterministic sm_90a path also needs |dout| per row (its dQ grid), from the same pass.
    let mut dout_norm = (path == BackwardPath::Deterministic)
        .then(|| workspace.carve::<f32>(carve.dout_norm, s.query_heads));
    // SAFETY: lengths checked above; the delta and dout_norm parts lie inside the checked
    // workspace.
    unsafe {
        backward_preprocess(
            shape,
            inputs.out,
            inputs.dout,
            &mut delta,
            dout_norm.as_mut(),
            stream,
        )?
    };
    let base = sys::MsaAttnBwdParams {
        q: inputs.q.ptr().cast(),
        k: inputs.k.ptr().cast(),
        v: inputs.v.ptr().cast(),
        dout: inputs.dout.ptr().cast(),
        lse: inputs.lse.ptr(),
        delta: delta.ptr(),
        varlen: layout.varlen(shape),
        ..Default::default()
    };
    let csr = sys::MsaAttnBwdParams {
        phys_row_ptr: meta.phys_row_ptr.ptr(),
        phys_q_indices: meta.phys_q_indices.ptr(),
        phys_valid: meta.phys_valid.ptr(),
        dq: grads.dq.ptr().cast(),
        dk: grads.dk.ptr().cast(),
        dv: grads.dv.ptr().cast(),
        ..base
    };
    match path {
        BackwardPath::Sm90 | BackwardPath::Deterministic => {
            let det = path == BackwardPath::Deterministic;
            let bytes = if det {
                s.backward_sm90_det_bytes
            } else {
                s.backward_sm90_bytes
            };
            let ws = workspace.carve::<u8>(carve.sm90, bytes);
            // The deterministic mode bounds each dQ row over its selected blocks.
            let params = sys::MsaAttnBwdParams {
                workspace: ws.ptr().cast(),
                workspace_bytes: ws.len(),
                topk: meta.topk.ptr(),
                dout_norm: dout_norm.as_ref().map_or(std::ptr::null(), |n| n.ptr()),
                ..csr
            };
            // SAFETY: lengths checked above, the sm_90a part of the workspace holds the bytes
            // the launcher needs; the caller's contract covers the rest.
            unsafe {
                if det {
                    launch::attention::backward_sm90_det(&params, stream.as_raw())?
                } else {
                    launch::attention::backward_sm90(&params, stream.as_raw())?
                }
            };
        }
        BackwardPath::Sm80Deterministic => {
            let params = sys::MsaAttnBwdParams {
                topk: meta.topk.ptr(),
                ..csr
            };
            // SAFETY: as above (the deterministic pair needs no workspace beyond delta).
            unsafe {
                launch::attention::backward_dq(&params, stream.as_raw())?;
                launch::attention::backward_dkv(&params, stream.as_raw())?;
            }
        }
        BackwardPath::Sm80Atomic => {
            let dq_accum = workspace.carve::<f32>(carve.dq_accum, s.queries);
            let dk_pool = workspace.carve::<f32>(carve.dk_pool, s.pool);
            let dv_pool = workspace.carve::<f32>(carve.dv_pool, s.pool);
            for acc in [&dq_accum, &dk_pool, &dv_pool] {
                // SAFETY: a part of the checked workspace.
                unsafe { launch::util::zero(acc.addr(), acc.bytes(), stream.as_raw())? };
            }
            if let Some(sizes) = task_sizes {
                let mut scratch = workspace.carve::<i32>(carve.task_scratch, sizes.scratch_words);
                let mut tables = workspace.carve::<i32>(carve.task_tables, sizes.table_words);
                let inputs = TaskBuildInputs::of(layout, meta);
                // SAFETY: prepare built the inputs for this shape, so its work items lie inside
                // them; scratch and tables are parts of the checked workspace.
                unsafe {
                    task_build(
                        &inputs,
                        &TaskBuildShape::of(shape),
                        &mut scratch,
                        &mut tables,
                        stream,
                    )?
                };
                let cap = sizes.capacity;
                let word = std::mem::size_of::<i32>() as u64;
                let t = tables.addr();
                let params = sys::MsaAttnBwdParams {
                    task_meta: t as *const i32,
                    task_qrows: (t + (cap * META_WORDS) as u64 * word) as *const i32,
                    task_qpos: (t + (cap * (META_WORDS + TASK_QUERIES)) as u64 * word)
                        as *const i32,
                    desc: scratch.ptr(),
                    // Fits i32: the task-build sizes do.
                    grid_launch: s.grid_launch as i32,
                    dq_accum: dq_accum.ptr(),
                    dk_pool: dk_pool.ptr(),
                    dv_pool: dv_pool.ptr(),
                    ..base
                };
                // SAFETY: the task tables of this shape and selection, the zeroed accumulators
                // of the checked workspace, the table sub-ranges inside `tables`.
                unsafe { launch::attention::backward_main(&params, stream.as_raw())? };
            }
            // SAFETY: the accumulators and gradients were checked above.
            unsafe {
                backward_postprocess_dq(shape, dq_accum.as_slice(), &mut grads.dq, stream)?;
                backward_postprocess_dkv(
                    shape,
                    layout,
                    dk_pool.as_slice(),
                    dv_pool.as_slice(),
                    &mut grads.dk,
                    &mut grads.dv,
                    stream,
                )?;
            }
        }
    }
    Ok(())
}

/// Backward preprocess: `delta[t, h] = Σ_d out[t, h, d]·dout[t, h, d]` in fp32 (`out`, `dout`
/// bf16 `[T, 64, 128]`, `delta` f32 `[T, 64]`), and with `dout_norm` also
/// `dout_norm[t, h] = |dout[t, h, :]|₂` (f32 `[T, 64]`, the same pass; the deterministic sm_90a
/// backward's dQ grid reads it). Deterministic.
///
/// # Safety
/// Every view must be device memory of its length, usable from the current CUDA context, that
/// stays allocated until the launch has run; `stream` must be a live stream of that context.
pub unsafe fn backward_preprocess(
    shape: &CallShape,
    out: DevSlice<bf16>,
    dout: DevSlice<bf16>,
    delta: &mut DevSliceMut<f32>,
    dout_norm: Option<&mut DevSliceMut<f32>>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    check::tensor("out", &out, s.queries, "[T, 64, 128]")?;
    check::tensor("dout", &dout, s.queries, "[T, 64, 128]")?;
    check::output("delta", delta, s.query_heads, "[T, 64]")?;
    if let Some(norm) = &dout_norm {
        check::output("dout_norm", norm, s.query_heads, "[T, 64]")?;
    }
    let (t, stream) = (shape.total_q() as i32, stream.as_raw());
    // SAFETY: lengths and alignment checked above; the caller's contract covers the rest. T fits
    // i32 (`CallShape::new`).
    unsafe {
        match dout_norm {
            Some(norm) => launch::attention::backward_preprocess_norm(
                out.addr(),
                dout.addr(),
                t,
                delta.addr(),
                norm.addr(),
                stream,
            )?,
            None => launch::attention::backward_preprocess(
                out.addr(),
                dout.addr(),
                t,
                delta.addr(),
                stream,
            )?,
        }
    };
    Ok(())
}

/// Backward postprocess of dQ: `dq = bf16(dq_accum)` (round to nearest even), both
/// `[T, 64, 128]`.
///
/// # Safety
/// As [`backward_preprocess`].
pub unsafe fn backward_postprocess_dq(
    shape: &CallShape,
    dq_accum: DevSlice<f32>,
    dq: &mut DevSliceMut<bf16>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    check::tensor("dq_accum", &dq_accum, s.queries, "[T, 64, 128]")?;
    check::output("dq", dq, s.queries, "[T, 64, 128]")?;
    // SAFETY: lengths and alignment checked above; the caller's contract covers the rest.
    unsafe {
        launch::attention::backward_postprocess_dq(
            dq_accum.addr(),
            shape.total_q() as i32,
            dq.addr(),
            stream.as_raw(),
        )?
    };
    Ok(())
}

/// Backward postprocess of dK/dV: `dk, dv = bf16(pool)` (round to nearest even) gathered from
/// the workspace pools (`[W, 4, 128]` f32) to the packed key rows (`[Tk, 4, 128]`) through the
/// layout's block key ranges.
///
/// # Safety
/// As [`backward_preprocess`]; `layout` must be the layout of `shape`.
pub unsafe fn backward_postprocess_dkv(
    shape: &CallShape,
    layout: &Layout,
    dk_pool: DevSlice<f32>,
    dv_pool: DevSlice<f32>,
    dk: &mut DevSliceMut<bf16>,
    dv: &mut DevSliceMut<bf16>,
    stream: Stream,
) -> Result<()> {
    let s = shape.sizes();
    layout.check(shape)?;
    check::tensor("dk_pool", &dk_pool, s.pool, "[W, 4, 128]")?;
    check::tensor("dv_pool", &dv_pool, s.pool, "[W, 4, 128]")?;
    check::output("dk", dk, s.keys, "[Tk, 4, 128]")?;
    check::output("dv", dv, s.keys, "[Tk, 4, 128]")?;
    // SAFETY: lengths and alignment checked above; the layout's block tables hold P entries.
    unsafe {
        launch::attention::backward_postprocess_dkv(
            dk_pool.addr(),
            dv_pool.addr(),
            layout.varlen(shape),
            dk.addr(),
            dv.addr(),
            stream.as_raw(),
        )?
    };
    Ok(())
}

/// The inputs of one task build (`MsaTaskBuildInputs`): prepare's k2q CSR and work list, the
/// query cu_seqlens and the per-fragment schedule arrays.
#[derive(Debug, Clone, Copy)]
pub struct TaskBuildInputs {
    /// `[4, rows + 1]`.
    pub row_ptr: DevSlice<i32>,
    /// `[4, edge_capacity]`: document-local queries.
    pub q_indices: DevSlice<i32>,
    /// `[work_capacity, 6]`.
    pub scheduler_metadata: DevSlice<i32>,
    /// `[1]`.
    pub work_count: DevSlice<i32>,
    /// `[documents + 1]`: the query cu_seqlens.
    pub cu_seqlens: DevSlice<i32>,
    /// `[documents]`.
    pub document_workspace_starts: DevSlice<i32>,
    /// `[documents]`.
    pub query_offsets: DevSlice<i32>,
}

impl TaskBuildInputs {
    /// The inputs prepare's metadata gives for a layout.
    pub fn of(layout: &Layout, meta: &Metadata) -> Self {
        Self {
            row_ptr: meta.row_ptr,
            q_indices: meta.q_indices,
            scheduler_metadata: meta.scheduler_metadata,
            work_count: meta.work_count,
            cu_seqlens: layout.cu_seqlens_q,
            document_workspace_starts: meta.document_workspace_starts,
            query_offsets: meta.query_offsets,
        }
    }
}

/// The shapes of one task build (`MsaTaskBuildShape`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskBuildShape {
    /// CSR rows per head (>= 1).
    pub rows: usize,
    /// `q_indices` width (>= 1).
    pub edge_capacity: usize,
    /// `scheduler_metadata` rows (>= 1).
    pub work_capacity: usize,
    /// Documents (fragments, >= 1).
    pub documents: usize,
    /// T: 512-query locality windows.
    pub num_tokens: usize,
    /// W, a multiple of 128.
    pub workspace_rows: usize,
    /// SMs the CTA walk is planned for (>= 1).
    pub num_sms: usize,
}

impl TaskBuildShape {
    /// The build of a call's metadata.
    pub fn of(shape: &CallShape) -> Self {
        Self {
            rows: shape.total_rows(),
            edge_capacity: shape.total_q() * TOPK_BLOCKS,
            work_capacity: shape.sizes().work_capacity,
            documents: shape.batch(),
            num_tokens: shape.total_q(),
            workspace_rows: shape.padded_kv_blocks() * BLOCK_SIZE,
            num_sms: shape.sm_count(),
        }
    }

    /// The buffer sizes (`msa_plan::task_build_buffer_sizes`), after the shape's own limits.
    pub fn sizes(&self) -> Result<TaskBuildSizes, PlanError> {
        for (name, v) in [
            ("task-build rows", self.rows),
            ("task-build edge capacity", self.edge_capacity),
            ("task-build work capacity", self.work_capacity),
            ("task-build documents", self.documents),
            ("task-build num_sms", self.num_sms),
        ] {
            if v == 0 {
                return Err(PlanError::Shape {
                    name,
                    expected: "at least 1".into(),
                    got: "0".into(),
                });
            }
        }
        task_build_buffer_sizes(
            self.edge_capacity,
            self.work_capacity,
            self.num_tokens,
            self.workspace_rows,
        )
    }

    fn to_sys(self) -> Result<sys::MsaTaskBuildShape, PlanError> {
        let i = |what: &'static str, v: usize| {
            i32::try_from(v).map_err(|_| PlanError::Overflow {
                what,
                limit: i32::MAX as i64,
                got: v as i64,
            })
        };
        Ok(sys::MsaTaskBuildShape {
            rows: i("CSR rows", self.rows)?,
            edge_capacity: i("edge capacity", self.edge_capacity)?,
            work_capacity: i("work capacity", self.work_capacity)?,
            documents: i("documents", self.documents)?,
            num_tokens: i("num_tokens", self.num_tokens)?,
            workspace_rows: i("workspace_rows", self.workspace_rows)?,
            num_sms: i("num_sms", self.num_sms)?,
        })
    }
}

/// The backward task build (4 kernels after a -1 fill of both buffers), bit-exact with
/// `msa_plan::build_backward_tasks`: `scratch` (`desc | task_ends | task_segments | bins |
/// task_decode`) and `tables` (`task_meta | task_qrows | task_qpos`) of exactly the returned
/// sizes' words (`tables` 16-byte aligned). Exact task counts stay on the device; the main
/// kernel is launched with `grid_launch_bound(capacity, num_sms)` CTAs. Lengths are checked
/// before any launch.
///
/// # Safety
/// Every view must be device memory of its length, usable from the current CUDA context, that
/// stays allocated until the launches have run; `stream` must be a live stream of that context;
/// the work items of `inputs` must lie inside its arrays (prepare's do;
/// `msa_plan::build_backward_tasks` checks a hand-made schedule on the host).
pub unsafe fn task_build(
    inputs: &TaskBuildInputs,
    shape: &TaskBuildShape,
    scratch: &mut DevSliceMut<i32>,
    tables: &mut DevSliceMut<i32>,
    stream: Stream,
) -> Result<TaskBuildSizes> {
    let sizes = shape.sizes()?;
    let sys_shape = shape.to_sys()?;
    let docs = shape.documents;
    check::tensor(
        "row_ptr",
        &inputs.row_ptr,
        NUM_INDEX_HEADS * (shape.rows + 1),
        "[4, rows + 1]",
    )?;
    check::tensor(
        "q_indices",
        &inputs.q_indices,
        NUM_INDEX_HEADS * shape.edge_capacity,
        "[4, edge_capacity]",
    )?;
    check::tensor(
        "scheduler_metadata",
        &inputs.scheduler_metadata,
        shape.work_capacity * WORK_WORDS,
        "[work_capacity, 6]",
    )?;
    check::tensor("work_count", &inputs.work_count, 1, "[1]")?;
    check::index_array(
        "cu_seqlens",
        &inputs.cu_seqlens,
        docs + 1,
        "[documents + 1]",
    )?;
    check::tensor(
        "document_workspace_starts",
        &inputs.document_workspace_starts,
        docs,
        "[documents]",
    )?;
    check::tensor("query_offsets", &inputs.query_offsets, docs, "[documents]")?;
    check::output(
        "task-build scratch",
        scratch,
        sizes.scratch_words,
        "scratch_words",
    )?;
    check::output("task tables", tables, sizes.table_words, "[capacity · 20]")?;
    let sys_inputs = sys::MsaTaskBuildInputs {
        row_ptr: inputs.row_ptr.ptr(),
        q_indices: inputs.q_indices.ptr(),
        scheduler_metadata: inputs.scheduler_metadata.ptr(),
        work_count: inputs.work_count.ptr(),
        cu_seqlens: inputs.cu_seqlens.ptr(),
        document_workspace_starts: inputs.document_workspace_starts.ptr(),
        query_offsets: inputs.query_offsets.ptr(),
    };
    // SAFETY: every length checked above against the shape; the caller's contract covers the
    // work items, the memory and the stream.
    unsafe {
        launch::task_build::tables(
            sys_inputs,
            sys_shape,
            scratch.addr(),
            sizes.scratch_words,
            tables.addr(),
            sizes.table_words,
            stream.as_raw(),
        )?
    };
    Ok(sizes)
}
