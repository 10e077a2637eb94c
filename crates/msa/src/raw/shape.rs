//! The integers of one call and the sizes of every device tensor and workspace they imply.

use msa_kernels::{launch, sys};
use msa_plan::layout::MAX_QUERY_INDEX;
use msa_plan::schedule::{balanced_target_q_per_cta, flat_schedule_capacity, WORK_WORDS};
use msa_plan::topology::{
    BLOCK_SIZE, HEAD_DIM, INDEX_DIM, NUM_INDEX_HEADS, NUM_KV_HEADS, NUM_Q_HEADS, TOPK_BLOCKS,
};
use msa_plan::{
    grid_launch_bound, task_build_buffer_sizes, PlanError, TaskBuildSizes, VarlenLayout,
};

use super::check::align_up;

const I32_MAX: usize = i32::MAX as usize;

/// The kernel set a device runs: the sm_90a kernels (wgmma/TMA attention forward and backward)
/// on compute capability 9.0, the sm_80 (mma.sync) kernels everywhere else. The sm_80 set also
/// runs on 9.0 (the reference path the sm_90a kernels are checked against).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelSet {
    Sm90a,
    Sm80,
}

impl KernelSet {
    /// The set of a device of compute capability `major.minor`.
    pub fn for_capability(major: u32, minor: u32) -> Self {
        if (major, minor) == (9, 0) {
            Self::Sm90a
        } else {
            Self::Sm80
        }
    }

    /// The set of a device of compute capability `10·major + minor`.
    pub(crate) fn for_sm(sm: i32) -> Self {
        if sm == 90 {
            Self::Sm90a
        } else {
            Self::Sm80
        }
    }
}

/// Which kernels compute the attention backward, and so which workspace it needs
/// ([`Sizes::backward_workspace_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackwardPath {
    /// `msa_attn_backward_sm90`: KV-outer wgmma/TMA over prepare's physical CSR (compute
    /// capability 9.0 only). dQ is reduced in arrival order: not bitwise repeatable.
    Sm90,
    /// `msa_attn_backward_sm90_det`: the same kernel with each dQ contribution rounded to its
    /// row's power-of-two grid (exact fp32 sums in any order) and each item of a split dK/dV row
    /// kept in a part of its own, the parts summed in id order: bitwise repeatable on one device
    /// (compute capability 9.0 only).
    Deterministic,
    /// The sm_80 backward: device task build, KV-parallel main kernel with fp32 atomics, bf16
    /// postprocess. Not bitwise repeatable.
    Sm80Atomic,
    /// The sm_80 deterministic pair (dQ query-outer, dK/dV physical-block-outer), no atomics:
    /// bitwise repeatable, on every device; the reference of [`BackwardPath::Deterministic`].
    Sm80Deterministic,
}

impl BackwardPath {
    /// MSA's choice: the sm_90a kernel on [`KernelSet::Sm90a`] ([`BackwardPath::Deterministic`]
    /// when `deterministic`, else [`BackwardPath::Sm90`]), the sm_80 kernels on
    /// [`KernelSet::Sm80`] ([`BackwardPath::Sm80Deterministic`] or
    /// [`BackwardPath::Sm80Atomic`]).
    pub fn select(deterministic: bool, kernels: KernelSet) -> Self {
        match (deterministic, kernels) {
            (true, KernelSet::Sm90a) => Self::Deterministic,
            (false, KernelSet::Sm90a) => Self::Sm90,
            (true, KernelSet::Sm80) => Self::Sm80Deterministic,
            (false, KernelSet::Sm80) => Self::Sm80Atomic,
        }
    }

    /// Whether the path runs the sm_90a kernel (compute capability 9.0 only).
    pub fn is_sm90a(self) -> bool {
        matches!(self, Self::Sm90 | Self::Deterministic)
    }
}

/// The validated integers of one call: everything the raw layer plans from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallShape {
    total_q: usize,
    total_k: usize,
    batch: usize,
    total_rows: usize,
    max_seqlen_k: usize,
    has_fragments: bool,
    sm_count: usize,
    padded_kv_blocks: usize,
    sizes: Sizes,
}

fn overflow(what: &'static str, limit: usize, got: usize) -> PlanError {
    PlanError::Overflow {
        what,
        limit: limit as i64,
        got: i64::try_from(got).unwrap_or(i64::MAX),
    }
}

fn fits_i32(what: &'static str, got: Option<usize>) -> Result<usize, PlanError> {
    match got {
        Some(v) if v <= I32_MAX => Ok(v),
        other => Err(overflow(what, I32_MAX, other.unwrap_or(usize::MAX))),
    }
}

fn shape_error(name: &'static str, expected: String, got: String) -> PlanError {
    PlanError::Shape {
        name,
        expected,
        got,
    }
}

impl CallShape {
    /// Validate the integers of one call (MSA's `prepare` arguments, plus the SM count the
    /// schedules are balanced for):
    /// - `total_q` = T = `cu_seqlens_q[B]`, `total_k` = Tk = `cu_seqlens_k[B]`, `batch` = B ≥ 1;
    /// - `total_rows` = Σ_b ceil(klen_b / 128) exactly (klen_b the logical K length of fragment
    ///   b), `max_seqlen_k` = max_b klen_b;
    /// - `has_fragments`: whether `fragment_indices` is given (CP fragments);
    /// - `sm_count` ≥ 1: multiprocessors of the device (prepare's chunk size, the backward walk).
    ///
    /// Rejected: int32 overflow of any device size (edge capacity 64·T, workspace rows 128·P,
    /// CSR rows 4·R, the work capacity), `max_seqlen_k` > Tk or > 2^24 (it bounds each fragment's
    /// queries, which `qsplit` packs into 24 bits), and integers no layout can have
    /// (`total_rows` < ceil(max_seqlen_k / 128) or > B·ceil(max_seqlen_k / 128); without
    /// fragments T > Tk or `total_rows` > (Tk + 127·B) / 128; T or Tk > 0 with
    /// `max_seqlen_k` = 0).
    /// The integers must still match the device cu_seqlens: the kernels trust them, as MSA's.
    pub fn new(
        total_q: usize,
        total_k: usize,
        batch: usize,
        total_rows: usize,
        max_seqlen_k: usize,
        has_fragments: bool,
        sm_count: usize,
    ) -> Result<Self, PlanError> {
        if batch == 0 {
            return Err(shape_error(
                "cu_seqlens",
                "B+1 entries with B >= 1".into(),
                "batch 0".into(),
            ));
        }
        fits_i32("batch", Some(batch))?;
        fits_i32("queries x 16 x 4 (edge capacity)", total_q.checked_mul(64))?;
        let padded_kv_blocks = batch
            .checked_add(1)
            .and_then(|b| b.checked_mul(BLOCK_SIZE))
            .and_then(|p| p.checked_add(total_k))
            .map(|p| (p - 1) / BLOCK_SIZE);
        fits_i32(
            "workspace rows (padded K blocks x 128)",
            padded_kv_blocks.and_then(|p| p.checked_mul(BLOCK_SIZE)),
        )?;
        let padded_kv_blocks = padded_kv_blocks.unwrap_or(0);
        fits_i32("CSR rows x 4", total_rows.checked_mul(NUM_KV_HEADS))?;
        fits_i32("sm_count", Some(sm_count))?;
        if sm_count == 0 {
            return Err(shape_error("sm_count", "at least 1".into(), "0".into()));
        }
        if max_seqlen_k > total_k {
            return Err(shape_error(
                "max_seqlen_k",
                format!("at most total_k = {total_k} (a K range lies in the packed keys)"),
                max_seqlen_k.to_string(),
            ));
        }
        if max_seqlen_k > MAX_QUERY_INDEX + 1 {
            return Err(overflow(
                "max_seqlen_k (bounds a fragment's queries: 24-bit qsplit field)",
                MAX_QUERY_INDEX + 1,
                max_seqlen_k,
            ));
        }
        if (total_k > 0 || total_q > 0) && max_seqlen_k == 0 {
            return Err(shape_error(
                "max_seqlen_k",
                format!("at least 1 when total_q = {total_q}, total_k = {total_k} (a fragment with keys or queries has a K range)"),
                "0".into(),
            ));
        }
        let max_blocks = max_seqlen_k.div_ceil(BLOCK_SIZE);
        let most_rows = if has_fragments {
            batch * max_blocks
        } else {
            (total_k + (BLOCK_SIZE - 1) * batch) / BLOCK_SIZE
        };
        if total_rows < max_blocks || total_rows > most_rows {
            return Err(shape_error(
                "total_rows",
                format!(
                    "sum over fragments of ceil(klen / 128), between {max_blocks} and {most_rows} \
                     for B = {batch}, total_k = {total_k}, max_seqlen_k = {max_seqlen_k}"
                ),
                total_rows.to_string(),
            ));
        }
        if !has_fragments && total_q > total_k {
            return Err(shape_error(
                "total_q",
                format!("at most total_k = {total_k} without fragments (queries are a suffix of their document)"),
                total_q.to_string(),
            ));
        }
        let target_q_per_cta = balanced_target_q_per_cta(total_q, sm_count);
        let work_capacity = fits_i32(
            "work capacity",
            Some(flat_schedule_capacity(
                total_rows,
                total_q,
                target_q_per_cta,
            )),
        )?;
        let mut shape = Self {
            total_q,
            total_k,
            batch,
            total_rows,
            max_seqlen_k,
            has_fragments,
            sm_count,
            padded_kv_blocks,
            sizes: Sizes::default(),
        };
        shape.sizes = Sizes::of(&shape, target_q_per_cta, work_capacity)?;
        Ok(shape)
    }

    /// The shape of a host layout (whose integers are validated by construction) on a device
    /// with `sm_count` SMs.
    pub fn from_layout(layout: &VarlenLayout, sm_count: usize) -> Result<Self, PlanError> {
        Self::new(
            layout.total_q(),
            layout.total_k(),
            layout.batch(),
            layout.total_rows(),
            layout.max_seqlen_k(),
            layout.fragment_indices().is_some(),
            sm_count,
        )
    }

    /// Packed queries T.
    pub fn total_q(&self) -> usize {
        self.total_q
    }
    /// Packed keys Tk.
    pub fn total_k(&self) -> usize {
        self.total_k
    }
    /// Fragments (batch entries) B.
    pub fn batch(&self) -> usize {
        self.batch
    }
    /// CSR rows per head R.
    pub fn total_rows(&self) -> usize {
        self.total_rows
    }
    /// Longest logical K range.
    pub fn max_seqlen_k(&self) -> usize {
        self.max_seqlen_k
    }
    /// Most key blocks of a fragment, `ceil(max_seqlen_k / 128)`.
    pub fn max_blocks(&self) -> usize {
        self.max_seqlen_k.div_ceil(BLOCK_SIZE)
    }
    /// Whether the call has `fragment_indices`.
    pub fn has_fragments(&self) -> bool {
        self.has_fragments
    }
    /// SMs the schedules are balanced for.
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }
    /// Physical blocks P, `(Tk + (B+1)·128 − 1) / 128`.
    pub fn padded_kv_blocks(&self) -> usize {
        self.padded_kv_blocks
    }
    /// Workspace rows W = 128·P.
    pub fn workspace_rows(&self) -> usize {
        self.padded_kv_blocks * BLOCK_SIZE
    }
    /// The size of every device tensor and workspace of the call.
    pub fn sizes(&self) -> &Sizes {
        &self.sizes
    }

    /// `MsaVarlen` with these sizes and null arrays (the host-arithmetic workspace queries read
    /// only the size fields).
    pub(crate) fn varlen_sizes(&self) -> sys::MsaVarlen {
        // Every field fits i32: checked in `new`.
        sys::MsaVarlen {
            batch: self.batch as i32,
            total_q: self.total_q as i32,
            total_k: self.total_k as i32,
            total_rows: self.total_rows as i32,
            padded_kv_blocks: self.padded_kv_blocks as i32,
            max_blocks: self.max_blocks() as i32,
            ..Default::default()
        }
    }
}

/// Element counts of every device tensor of one call (`_bytes`: workspace bytes). Tensors named
/// as in docs/design.md; T = total_q, Tk = total_k, B = batch, R = total_rows, P =
/// padded_kv_blocks, W = 128·P, cap = `work_capacity`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sizes {
    // ---- Layout (build_layout).
    /// `cu_seqlens_q`, `cu_seqlens_k`: `[B + 1]` each.
    pub cu_seqlens: usize,
    /// `fragment_indices` (when given), `fragment_first`, `document_workspace_starts`,
    /// `query_offsets`: `[B]`.
    pub batch: usize,
    /// `query_fragment`: `[T]`.
    pub query_fragment: usize,
    /// `block_key_start`, `block_key_count`: `[P]`.
    pub block_keys: usize,

    // ---- Prepare.
    /// `topk_indices` (and the indexer's top-k), `q_indices`, `qsplit`, `phys_q_indices`,
    /// `phys_valid`: `[4, T, 16]` / `[4, T·16]`.
    pub selection: usize,
    /// `error_word`: `[4]`.
    pub error_word: usize,
    /// `row_ptr`: `[4, R + 1]`.
    pub row_ptr: usize,
    /// `split_counts`: `[T, 4]`.
    pub split_counts: usize,
    /// Chunk size of the work list, `balanced_target_q_per_cta(T, sm_count)`.
    pub target_q_per_cta: usize,
    /// Rows of `scheduler_metadata`, `flat_schedule_capacity(R, T, target)`.
    pub work_capacity: usize,
    /// `scheduler_metadata`: `[cap, 6]`.
    pub scheduler_metadata: usize,
    /// `work_count`: `[1]`.
    pub work_count: usize,
    /// `phys_row_ptr`: `[4, P + 1]`.
    pub phys_row_ptr: usize,

    // ---- Attention.
    /// `q`, `out`, `dout`, `dq` (bf16) and the f32 `dq_accum`: `[T, 64, 128]`.
    pub queries: usize,
    /// `k`, `v`, `dk`, `dv`: `[Tk, 4, 128]`.
    pub keys: usize,
    /// `lse`, `delta`: `[T, 64]`.
    pub query_heads: usize,
    /// The f32 dK/dV pools of the sm_80 atomic backward: `[W, 4, 128]` each.
    pub pool: usize,
    /// Task build of the sm_80 atomic backward (`msa_plan::task_build_buffer_sizes`): `None`
    /// when T = 0 (nothing to build) or when the layout exceeds its limits (more than
    /// `MAX_BINS` locality bins); the other backward paths serve such calls.
    pub task_build: Option<TaskBuildSizes>,
    /// CTAs the atomic main kernel is launched with, `grid_launch_bound(capacity, sm_count)`.
    pub grid_launch: usize,

    // ---- Indexer and KL.
    /// `qi`, `dqi`: `[T, 4, 128]`.
    pub index_queries: usize,
    /// `ki`, `dki`: `[Tk, 1, 128]`.
    pub index_keys: usize,
    /// Indexer and selection LSE: `[4, T]`.
    pub index_lse: usize,

    // ---- Workspaces (bytes; each carved into 256-byte aligned parts from a 256-byte aligned base).
    /// `msa_attn_forward_workspace_bytes`: the sm_90a forward's tile unions and claim order
    /// ([`Sizes::forward_workspace_bytes`]).
    pub forward_sm90_bytes: usize,
    /// `msa_attn_backward_sm90_workspace_bytes`: the sm_90a part of the backward workspace.
    pub backward_sm90_bytes: usize,
    /// `msa_attn_backward_sm90_det_workspace_bytes`: that part in deterministic mode.
    pub backward_sm90_det_bytes: usize,
    /// `msa_indexer_workspace_bytes`.
    pub indexer_workspace_bytes: usize,
    /// `msa_kl_workspace_bytes`.
    pub kl_workspace_bytes: usize,
}

/// The parts of the backward workspace of one path: byte offsets from its base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BackwardCarve {
    /// `delta [T, 64]` f32, every path.
    pub delta: usize,
    /// `dout_norm [T, 64]` f32 (deterministic sm_90a path).
    pub dout_norm: usize,
    /// The sm_90a launcher's scratch.
    pub sm90: usize,
    /// `dq_accum [T, 64, 128]`, `dk_pool`, `dv_pool [W, 4, 128]` f32, task scratch and tables
    /// i32 (sm_80 atomic path).
    pub dq_accum: usize,
    pub dk_pool: usize,
    pub dv_pool: usize,
    pub task_scratch: usize,
    pub task_tables: usize,
    pub bytes: usize,
}

impl Sizes {
    fn of(
        shape: &CallShape,
        target_q_per_cta: usize,
        work_capacity: usize,
    ) -> Result<Self, PlanError> {
        let (t, tk, b, r, p) = (
            shape.total_q,
            shape.total_k,
            shape.batch,
            shape.total_rows,
            shape.padded_kv_blocks,
        );
        let varlen = shape.varlen_sizes();
        // The header functions reject only negative sizes, which `CallShape::new` excludes.
        let host = |what: &'static str, r: Result<usize, msa_kernels::KernelError>| {
            r.map_err(|e| shape_error(what, "sizes the kernels accept".into(), e.to_string()))
        };
        let task_build = if t == 0 {
            None
        } else {
            task_build_buffer_sizes(t * TOPK_BLOCKS, work_capacity, t, p * BLOCK_SIZE).ok()
        };
        Ok(Self {
            cu_seqlens: b + 1,
            batch: b,
            query_fragment: t,
            block_keys: p,
            selection: NUM_INDEX_HEADS * t * TOPK_BLOCKS,
            error_word: 4,
            row_ptr: NUM_INDEX_HEADS * (r + 1),
            split_counts: t * NUM_INDEX_HEADS,
            target_q_per_cta,
            work_capacity,
            scheduler_metadata: work_capacity * WORK_WORDS,
            work_count: 1,
            phys_row_ptr: NUM_INDEX_HEADS * (p + 1),
            queries: t * NUM_Q_HEADS * HEAD_DIM,
            keys: tk * NUM_KV_HEADS * HEAD_DIM,
            query_heads: t * NUM_Q_HEADS,
            pool: p * BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM,
            grid_launch: task_build.map_or(0, |s| grid_launch_bound(s.capacity, shape.sm_count)),
            task_build,
            index_queries: t * NUM_INDEX_HEADS * INDEX_DIM,
            index_keys: tk * INDEX_DIM,
            index_lse: NUM_INDEX_HEADS * t,
            forward_sm90_bytes: host(
                "forward workspace",
                launch::attention::forward_workspace_bytes(varlen),
            )?,
            backward_sm90_bytes: host(
                "sm_90a backward workspace",
                launch::attention::backward_sm90_workspace_bytes(varlen),
            )?,
            backward_sm90_det_bytes: host(
                "deterministic sm_90a backward workspace",
                launch::attention::backward_sm90_det_workspace_bytes(varlen),
            )?,
            indexer_workspace_bytes: host(
                "indexer workspace",
                launch::indexer::workspace_bytes(varlen),
            )?,
            kl_workspace_bytes: host("KL workspace", launch::kl::workspace_bytes(varlen))?,
        })
    }

    /// The carve of the backward workspace of `path`: `delta [T, 64]` f32, then
    /// - [`BackwardPath::Sm90`]: the sm_90a launcher's scratch ([`Sizes::backward_sm90_bytes`]);
    /// - [`BackwardPath::Deterministic`]: `dout_norm [T, 64]` f32 and its deterministic mode's
    ///   scratch ([`Sizes::backward_sm90_det_bytes`]);
    /// - [`BackwardPath::Sm80Atomic`]: `dq_accum [T, 64, 128]`, `dk_pool`, `dv_pool [W, 4, 128]`
    ///   f32, the task-build scratch and tables i32;
    /// - [`BackwardPath::Sm80Deterministic`]: nothing more;
    ///
    /// each part 256-byte aligned.
    pub(crate) fn backward_carve(&self, path: BackwardPath) -> BackwardCarve {
        let f32s = |n: usize| align_up(n * 4);
        let mut c = BackwardCarve {
            delta: 0,
            dout_norm: 0,
            sm90: 0,
            dq_accum: 0,
            dk_pool: 0,
            dv_pool: 0,
            task_scratch: 0,
            task_tables: 0,
            bytes: f32s(self.query_heads),
        };
        match path {
            BackwardPath::Sm80Deterministic => {}
            BackwardPath::Sm90 => {
                c.sm90 = c.bytes;
                c.bytes += align_up(self.backward_sm90_bytes);
            }
            BackwardPath::Deterministic => {
                c.dout_norm = c.bytes;
                c.sm90 = c.dout_norm + f32s(self.query_heads);
                c.bytes = c.sm90 + align_up(self.backward_sm90_det_bytes);
            }
            BackwardPath::Sm80Atomic => {
                c.dq_accum = c.bytes;
                c.dk_pool = c.dq_accum + f32s(self.queries);
                c.dv_pool = c.dk_pool + f32s(self.pool);
                c.task_scratch = c.dv_pool + f32s(self.pool);
                let (scratch, tables) = self
                    .task_build
                    .map_or((0, 0), |s| (s.scratch_words, s.table_words));
                c.task_tables = c.task_scratch + f32s(scratch);
                c.bytes = c.task_tables + f32s(tables);
            }
        }
        c
    }

    /// Bytes of the workspace [`forward`](super::forward) needs with `kernels`: the tile unions
    /// and claim order on [`KernelSet::Sm90a`], nothing on [`KernelSet::Sm80`].
    pub fn forward_workspace_bytes(&self, kernels: KernelSet) -> usize {
        match kernels {
            KernelSet::Sm90a => self.forward_sm90_bytes,
            KernelSet::Sm80 => 0,
        }
    }

    /// Bytes of the workspace [`backward`](super::backward) needs on `path` (the carve above).
    /// The sm_80 atomic path needs the task build: a layout beyond its limits
    /// ([`Sizes::task_build`] `None` with T > 0) is rejected by `backward` on that path.
    pub fn backward_workspace_bytes(&self, path: BackwardPath) -> usize {
        self.backward_carve(path).bytes
    }
}
