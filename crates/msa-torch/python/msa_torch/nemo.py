"""NeMo AutoModel's ``minimax_m3_vl.kernels`` surface on the GPUs msa-rs serves.

NeMo's MiniMax-M3 MSA backend (``backend.sparse_attn='msa'``) binds its kernels through a small
package: memoized device probes, an SM100-only gate, the backward schedule helpers, the task
build, the three backward stages and ``sparse_attention(q, k, v, q2k, msa)``. This module keeps
those names, arguments and errors (/work/shared/spec/nemo-kernels.md §4-§6) and runs msa-rs
underneath, so a NeMo user on Hopper (or any GPU the built kernels serve) points the MSA backend
here instead of being refused:

- :func:`require_served` (alias :data:`require_sm100`, NeMo's call sites) accepts every compute
  capability a target compiled into the extension serves (``msa_torch.built_archs()``: 9.0 by
  the sm_90a kernels, 8.x by the sm_80 ones) and rejects the rest with NeMo's
  ``NotImplementedError`` wording;
- :func:`require_extension` is the twin of NeMo's ``require_cute_dsl``: :class:`UnavailableError`
  when ``msa_torch._C`` is missing;
- :func:`rows_per_cta`, :func:`chunk_map`, :func:`grid_launch_bound`, :func:`task_build_storage`,
  :class:`MSABackwardSchedule`'s shape checks and :func:`build_backward_tasks` are msa-plan's Rust
  mirrors (the same functions the planner and the task-build kernels follow), called through the
  extension;
- the backward stages map onto msa-rs's single fused backward (see each docstring).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from . import _device, _ext, attention

__all__ = [
    "MSA_KERNEL_IMPORT_ERROR",
    "UnavailableError",
    "sm_capability",
    "sm_count",
    "require_served",
    "require_sm100",
    "require_extension",
    "rows_per_cta",
    "chunk_map",
    "grid_launch_bound",
    "MSABackwardSchedule",
    "backward_schedule",
    "task_build_storage",
    "build_backward_tasks",
    "MSABackwardTaskTables",
    "run_preprocess",
    "run_backward",
    "run_grad_finalize",
    "sparse_attention",
]

# Topology of kernels/msa_schedule.py (the one MSA shape msa-rs serves).
BLOCK_SIZE = 128
HEAD_DIM = 128
NUM_Q_HEADS = 64
NUM_KV_HEADS = 4
NUM_INDEX_HEADS = 4
INDEX_DIM = 128
TOPK_BLOCKS = 16
QUERY_CHUNK = 8
SOFTMAX_SCALE = HEAD_DIM**-0.5
ROWS_PER_CTA_SMALL = 4
ROWS_PER_CTA_SWITCH = 2400
ROWS_PER_CTA_LARGE = 64

MSA_KERNEL_IMPORT_ERROR = (
    "BackendConfig.sparse_attn='msa' through msa_torch.nemo requires the compiled msa-rs "
    "extension msa_torch._C, which ships in the msa-torch wheel (Linux x86_64). Build it with "
    "`cargo xtask wheel` and install it with pip install target/wheels/msa_torch-*.whl on a "
    "CUDA system."
)


class UnavailableError(_ext.ExtensionUnavailableError):
    """NeMo's ``UnavailableError``: the kernels cannot be bound on this host (the extension is
    missing). Also an :class:`msa_torch.ExtensionUnavailableError`."""


class UnsupportedGPUError(NotImplementedError, _device.UnsupportedDeviceError):
    """NeMo's device rejection (``NotImplementedError``), also an
    :class:`msa_torch.UnsupportedDeviceError`."""


def require_extension():
    """The extension module, or :class:`UnavailableError` with :data:`MSA_KERNEL_IMPORT_ERROR`
    and why the import failed (NeMo's ``require_cute_dsl``)."""
    missing = _ext.extension_missing_reason()
    if missing is not None:
        raise UnavailableError(f"{MSA_KERNEL_IMPORT_ERROR} ({missing})")
    return _ext.ext()


# ---------------------------------------------------------------------------------------------
# device probes and the gate


def _index(device) -> int:
    device = torch.device(device)
    if device.type != "cuda":
        raise UnsupportedGPUError(
            f"MiniMax M3 MSA (msa-rs) runs on CUDA devices only; got {device}. Move the "
            "tensors to a GPU or use sparse_attn='generic'."
        )
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def sm_capability(device) -> tuple[int, int]:
    """Return the memoized CUDA compute capability of ``device`` (a CUDA device, e.g. a
    tensor's; no index means the current device). A device's capability cannot change, so it is
    looked up once per device."""
    return _capability(_index(device))


def sm_count(device) -> int:
    """Return the memoized streaming-multiprocessor count of ``device``; it sizes the backward
    CTA walk."""
    return _multiprocessors(_index(device))


def _served() -> str:
    """What the built targets serve, for the rejection message."""
    archs = require_extension().built_archs()
    parts = []
    if "sm_90a" in archs:
        parts.append("9.0 (sm_90a kernels)")
    if "sm_80" in archs:
        parts.append("8.x (sm_80 kernels)")
    if "compute_80" in archs:
        parts.append("newer ones through the compute_80 PTX")
    return ", ".join(parts) if parts else "none (" + ", ".join(archs) + ")"


def require_served(device) -> None:
    """Reject any device the msa-rs kernels are not built for, before compiling or launching
    one: a compute capability no target of ``msa_torch.built_archs()`` runs on (msa-probe's rule:
    SASS of the same major and no newer minor, or PTX of an older one) raises NeMo's
    ``NotImplementedError`` (:class:`UnsupportedGPUError`) naming it and the device; a non-CUDA
    device too."""
    major, minor = sm_capability(device)
    if require_extension().served_by(major, minor) is None:
        raise UnsupportedGPUError(
            f"MiniMax M3 MSA (msa-rs) supports compute capability {_served()} only; "
            f"got compute capability {major}.{minor} on {torch.device(device)}. Use "
            "sparse_attn='generic' on this GPU."
        )


#: NeMo's name for the gate, so its call sites keep working; it gates on what msa-rs serves.
require_sm100 = require_served


# ---------------------------------------------------------------------------------------------
# schedule helpers (msa-plan's mirrors)


def rows_per_cta(num_rows: int) -> int:
    """Select the CTA walk length: ``4`` up to 2400 task rows, else ``64``."""
    return require_extension().rows_per_cta(num_rows)


def chunk_map(num_rows: int, rows_per_cta: int, num_sms: int) -> tuple[int, int, int]:
    """Return ``(num_full_ctas, tail_rows, grid_ctas)`` for a walk covering every row once."""
    return tuple(require_extension().chunk_map(num_rows, rows_per_cta, num_sms))


def grid_launch_bound(capacity: int, num_sms: int) -> int:
    """Bound every count up to capacity: full CTAs plus at most one tail CTA per SM."""
    return require_extension().grid_launch_bound(capacity, num_sms)


_LAYOUTS = (
    ("row_ptr", "[4, rows + 1]", lambda s: len(s) == 2 and s[0] == 4 and s[1] >= 2),
    ("q_indices", "[4, edge_capacity]", lambda s: len(s) == 2 and s[0] == 4 and s[1] >= 1),
    (
        "scheduler_metadata",
        "[work_capacity, 6]",
        lambda s: len(s) == 2 and s[1] == 6 and s[0] >= 1,
    ),
    ("work_count", "[1]", lambda s: s == (1,)),
    ("cu_seqlens", "[documents + 1]", lambda s: len(s) == 1 and s[0] >= 2),
)


@dataclass(frozen=True, slots=True)
class MSABackwardSchedule:
    """Forward-derived int32 metadata the backward task build reads; save with
    ``ctx.save_for_backward``. ``scheduler_metadata`` columns are ``(index_head, row_linear,
    q_begin, q_count, document_ordinal, document_local_kblock)``, valid only up to
    ``work_count``. Shapes and dtypes are checked once, here (msa-plan's
    ``MsaBackwardSchedule::new`` rules and messages).

    msa-rs extension: ``metadata``, the :class:`msa_torch.attention.AttentionMetadata` the
    schedule came from (:func:`backward_schedule`); :func:`run_backward` needs it because
    msa-rs's backward derives its own task tables from the prepare metadata."""

    row_ptr: Tensor
    q_indices: Tensor
    scheduler_metadata: Tensor
    work_count: Tensor
    cu_seqlens: Tensor
    document_workspace_starts: Tensor
    metadata: Optional[attention.AttentionMetadata] = None

    def __post_init__(self):
        for name, layout, ok in _LAYOUTS:
            t = getattr(self, name)
            if t.dtype != torch.int32:
                raise TypeError(f"{name} must be int32, got {t.dtype}")
            if not ok(tuple(t.shape)):
                raise ValueError(f"{name} must have shape {layout}, got {tuple(t.shape)}")
        t = self.document_workspace_starts
        if t.dtype != torch.int32:
            raise TypeError(f"document_workspace_starts must be int32, got {t.dtype}")
        if tuple(t.shape) != (self.cu_seqlens.shape[0] - 1,):
            raise ValueError(
                f"document_workspace_starts must have shape [documents], got {tuple(t.shape)}"
            )

    def _parts(self):
        """The six tensors as ``(flat values, shape)`` for the Rust mirror (a host copy)."""
        fields = (
            self.row_ptr, self.q_indices, self.scheduler_metadata, self.work_count,
            self.cu_seqlens, self.document_workspace_starts,
        )
        return [(t.detach().cpu().flatten().tolist(), list(t.shape)) for t in fields]


def backward_schedule(metadata: attention.AttentionMetadata) -> MSABackwardSchedule:
    """NeMo's schedule of an ``attention.prepare`` result (plain documents: MSA's
    ``build_k2q_csr`` CSR and work items are what prepare builds)."""
    if metadata.fragment_indices is not None:
        raise NotImplementedError(
            "msa_torch.nemo: NeMo's backward schedule has no CP fragments (fragment_indices); "
            "use msa_torch.attention directly"
        )
    s = metadata.schedule
    return MSABackwardSchedule(
        metadata.k2q_row_ptr, metadata.k2q_q_indices, s.scheduler_metadata, s.work_count,
        metadata.cu_seqlens_q, s.document_workspace_starts, metadata,
    )


def task_build_storage(
    schedule: MSABackwardSchedule, num_tokens: int, workspace_rows: int
) -> tuple[int, int]:
    """Required scratch/table int32 words; the caller owns and may reuse both buffers."""
    return tuple(
        require_extension().task_build_storage(
            schedule.q_indices.shape[1], schedule.scheduler_metadata.shape[0], num_tokens,
            workspace_rows,
        )
    )


class MSABackwardTaskTables(NamedTuple):
    """Views of the caller's buffers: ``task_meta [capacity, 4]``, ``task_qrows`` /
    ``task_qpos [capacity, 8]`` (in ``tables``), ``desc [8]`` (scratch word 0) and the grid
    bound to launch."""

    task_meta: Tensor
    task_qrows: Tensor
    task_qpos: Tensor
    desc: Tensor
    grid_launch: int


def _int32_buffer(name: str, t: Tensor, words: int) -> None:
    if t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous() or t.numel() < words:
        raise ValueError(
            f"{name} must be a contiguous 1-D int32 tensor of at least {words} words, got "
            f"{t.dtype} {tuple(t.shape)}"
        )


def build_backward_tasks(
    schedule: MSABackwardSchedule,
    num_tokens: int,
    workspace_rows: int,
    *,
    num_sms: int,
    scratch: Tensor,
    tables: Tensor,
) -> MSABackwardTaskTables:
    """Build the locality-ordered backward task tables and their CTA walk into ``scratch``
    (``desc | task_ends | task_segments | bins | task_decode``) and ``tables`` (``task_meta |
    task_qrows | task_qpos``), word for word what NeMo's four task-build kernels write.

    msa-rs runs msa-plan's host mirror of those kernels (the one its tests hold the device
    build to): the schedule is copied to the host, built, and copied into the caller's buffers,
    so unlike NeMo this call synchronizes. msa-rs's own backward does not read these tables (it
    builds its KV-ordered work on the device inside :func:`run_backward`)."""
    scratch_words, table_words = task_build_storage(schedule, num_tokens, workspace_rows)
    _int32_buffer("scratch", scratch, scratch_words)
    _int32_buffer("tables", tables, table_words)
    img_scratch, img_tables, grid = require_extension().build_backward_tasks(
        schedule._parts(), num_tokens, workspace_rows, num_sms
    )
    scratch[:scratch_words].copy_(torch.tensor(img_scratch, dtype=torch.int32))
    tables[:table_words].copy_(torch.tensor(img_tables, dtype=torch.int32))
    cap = table_words // (4 + 2 * QUERY_CHUNK)
    meta_end, rows_end = cap * 4, cap * (4 + QUERY_CHUNK)
    return MSABackwardTaskTables(
        tables[:meta_end].view(cap, 4),
        tables[meta_end:rows_end].view(cap, QUERY_CHUNK),
        tables[rows_end:table_words].view(cap, QUERY_CHUNK),
        scratch[:8],
        grid,
    )


# ---------------------------------------------------------------------------------------------
# backward stages


def run_preprocess(out: Tensor, grad_out: Tensor, delta: Tensor) -> None:
    """Enqueue ``delta[t, h] = sum_d out[t, h, d] * grad_out[t, h, d]`` (FP32 from BF16 inputs)
    on the current stream. msa-rs computes delta inside its backward kernels; this stage is a
    torch reduction with NeMo's contract (all three tensors contiguous, on one CUDA device)."""
    _device.check_cuda("nemo.run_preprocess", out=out, grad_out=grad_out, delta=delta)
    for name, t in (("out", out), ("grad_out", grad_out), ("delta", delta)):
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if out.shape != grad_out.shape or tuple(delta.shape) != tuple(out.shape[:2]):
        raise ValueError(
            f"run_preprocess needs out, grad_out [T, 64, 128] and delta [T, 64]; got "
            f"{tuple(out.shape)}, {tuple(grad_out.shape)}, {tuple(delta.shape)}"
        )
    if delta.dtype != torch.float32:
        raise ValueError(f"delta must be float32, got {delta.dtype}")
    torch.sum(out.float() * grad_out.float(), dim=-1, out=delta)


def _workspace_positions(schedule: MSABackwardSchedule, num_tokens: int) -> Tensor:
    """int64 ``[T]``: the aligned workspace row of each compact token (no host sync)."""
    cu = schedule.cu_seqlens.long()
    lengths = cu[1:] - cu[:-1]
    doc = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=cu.device), lengths, output_size=num_tokens
    )
    t = torch.arange(num_tokens, device=cu.device)
    return schedule.document_workspace_starts.long()[doc] + t - cu[:-1][doc]


def run_backward(
    q: Tensor,
    k_aligned: Tensor,
    v_aligned: Tensor,
    grad_out: Tensor,
    lse: Tensor,
    out: Tensor,
    schedule: MSABackwardSchedule,
) -> tuple[Tensor, Tensor, Tensor]:
    """Run the main-attention backward on THD-contract tensors of one CUDA device.

    q BF16 ``[T, 64, 128]``; k_aligned and v_aligned BF16 ``[W, 4, 128]`` with W a positive
    multiple of 128; grad_out BF16 ``[T, 64, 128]``; lse FP32 ``[T, 64]``; out BF16
    ``[T, 64, 128]``. Returns BF16 ``(dq [T, 64, 128], dk_aligned [W, 4, 128], dv_aligned
    [W, 4, 128])``, zero outside the support.

    msa-rs maps this onto ``msa_torch.attention.backward`` (delta, task build, main kernel and
    finalize in one call, on compact K/V): K/V are gathered from the workspace rows of the
    schedule's documents and dK/dV scattered back. ``schedule.metadata`` (set by
    :func:`backward_schedule`) is required. With torch deterministic algorithms enabled the
    bitwise-repeatable backward runs (NeMo refuses; msa-rs has one)."""
    meta = schedule.metadata
    if meta is None:
        raise ValueError(
            "msa_torch.nemo.run_backward needs schedule.metadata (the attention.prepare "
            "result); build the schedule with msa_torch.nemo.backward_schedule(metadata)"
        )
    _device.check_cuda(
        "nemo.run_backward", q=q, k_aligned=k_aligned, v_aligned=v_aligned,
        grad_out=grad_out, lse=lse, out=out,
    )
    w = k_aligned.shape[0]
    if w <= 0 or w % BLOCK_SIZE or v_aligned.shape != k_aligned.shape:
        raise ValueError(
            f"k_aligned and v_aligned must be [W, 4, 128] with W a positive multiple of 128; got "
            f"{tuple(k_aligned.shape)} and {tuple(v_aligned.shape)}"
        )
    t = q.shape[0]
    pos = _workspace_positions(schedule, t)
    k, v = k_aligned.index_select(0, pos), v_aligned.index_select(0, pos)
    dq, dk, dv = attention.backward(
        q, k, v, grad_out, out, lse, meta,
        deterministic=torch.are_deterministic_algorithms_enabled(),
    )
    dk_aligned = torch.zeros_like(k_aligned).index_copy_(0, pos, dk)
    dv_aligned = torch.zeros_like(v_aligned).index_copy_(0, pos, dv)
    return dq, dk_aligned, dv_aligned


def run_grad_finalize(dq_pool: Tensor, dq_out: Tensor, kv_pool: Tensor, kv_out: Tensor) -> None:
    """Cast the accumulation pools to the BF16 gradients: ``dq_pool`` either head-pair
    interleaved ``[T, 32, 128, 2]`` (``(t, hp, d, e) = dQ[t, 2hp + e, d]``) or plain
    ``[T, 64, 128]`` into ``dq_out`` BF16 ``[T, 64, 128]``; ``kv_pool`` contiguous FP32 ``[N]``
    into ``kv_out`` BF16 ``[N]``. msa-rs's backward finalizes inside :func:`run_backward`; this
    stage is torch copies with NeMo's contract."""
    _device.check_cuda(
        "nemo.run_grad_finalize", dq_pool=dq_pool, dq_out=dq_out, kv_pool=kv_pool, kv_out=kv_out
    )
    t = dq_out.shape[0]
    if dq_pool.dim() == 4:
        if tuple(dq_pool.shape) != (t, NUM_Q_HEADS // 2, HEAD_DIM, 2):
            raise ValueError(
                f"interleaved dq_pool must be [T, 32, 128, 2], got {tuple(dq_pool.shape)}"
            )
        dq_out.copy_(dq_pool.permute(0, 1, 3, 2).reshape(t, NUM_Q_HEADS, HEAD_DIM))
    elif dq_pool.shape == dq_out.shape:
        dq_out.copy_(dq_pool)
    else:
        raise ValueError(
            f"dq_pool must be [T, 32, 128, 2] or [T, 64, 128] for dq_out {tuple(dq_out.shape)}, "
            f"got {tuple(dq_pool.shape)}"
        )
    if not kv_pool.is_contiguous() or kv_pool.dim() != 1 or kv_pool.shape != kv_out.shape:
        raise ValueError(
            f"kv_pool and kv_out must be contiguous [N], got {tuple(kv_pool.shape)} and "
            f"{tuple(kv_out.shape)}"
        )
    kv_out.copy_(kv_pool)


# ---------------------------------------------------------------------------------------------
# the attention entry point


def sparse_attention(q: Tensor, k: Tensor, v: Tensor, q2k: Tensor, msa) -> Tensor:
    """NeMo's ``sparse_attention``: BF16 ``out [T, 64, 128]`` of q ``[T, 64, 128]``, k and v
    ``[T, 4, 128]`` (BF16, packed documents) over the block selection ``q2k`` int32
    ``[4, T, 16]`` (document-local block ids, ``-1`` padding); differentiable in q, k, v.

    ``msa`` is shaped like NeMo's ``MSAMicrobatch``: ``cu_seqlens`` int32 ``[D+1]`` and
    ``max_seqlen``; ``workspace_size`` (the 128-aligned workspace) is used when present, else
    derived from ``cu_seqlens`` (one host sync). Runs ``attention.prepare`` (which validates
    ``q2k``: one sync, :class:`msa_torch.TopKError` for an invalid entry) and
    ``attention.forward``. With torch deterministic algorithms enabled the backward is msa-rs's
    bitwise-repeatable one, where NeMo refuses."""
    bad = [t.dtype for t in (q, k, v) if t.dtype != torch.bfloat16]
    if bad:
        raise ValueError(
            "MiniMax M3 MSA first supports BF16 q/k/v only; "
            f"got q={q.dtype}, k={k.dtype}, v={v.dtype}."
        )
    t = q.shape[0]
    if tuple(q2k.shape) != (NUM_INDEX_HEADS, t, TOPK_BLOCKS):
        raise ValueError(
            "MiniMax M3 MSA block selection must have shape (4, T, 16) for q with T tokens; "
            f"got {tuple(q2k.shape)}"
        )
    device = _device.check_cuda("nemo.sparse_attention", q=q, k=k, v=v, q2k=q2k)
    require_served(device)
    cu = msa.cu_seqlens
    workspace = getattr(msa, "workspace_size", None)
    if workspace is None:
        lengths = (cu[1:] - cu[:-1]).long()
        workspace = int(((lengths + BLOCK_SIZE - 1) // BLOCK_SIZE).sum().item()) * BLOCK_SIZE
    max_seqlen = int(msa.max_seqlen)
    meta = attention.prepare(
        q2k, cu, cu, total_k=k.shape[0], total_rows=int(workspace) // BLOCK_SIZE,
        max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen, prepare_kl_schedule=False,
    )
    return attention.forward(
        q, k, v, meta, deterministic=torch.are_deterministic_algorithms_enabled()
    )
