"""MSA v1 sparse attention: ``prepare``, ``forward``, ``backward`` and ``AttentionMetadata``,
call for call the training API of MSA's ``msa_v1.attention`` (argument names, defaults, shapes,
dtypes and return values), on the msa-rs kernels.

Differences, all explicit:

- ``prepare`` validates the selection (one synchronization: the device's error word is read
  and an invalid entry raises :class:`msa_torch.TopKError` naming ``(code, head, query,
  slot)``), as MSA's eager mode. While the current stream is being captured in a CUDA graph it
  skips the check (a capture cannot synchronize); :func:`prepare_unchecked` never checks and
  never synchronizes, so it is the one to capture or to call in a hot loop once selections are
  trusted. Kernels run on an invalid unchecked selection compute garbage.
- Not implemented (``NotImplementedError`` naming the option): FP8 inputs, ``sparse_attn_p_mode
  ="fp8"``, ``partial_dtype`` other than ``torch.bfloat16`` (msa-rs's forward is one pass with no
  partials), ``return_temperature_lse`` / ``lse_temperature_scale != 1``, a ``softmax_scale``
  other than ``128 ** -0.5`` (the kernels fix it), ``q_fp8`` / ``k_fp8``.
- The metadata carries msa-rs's own tables after MSA's fields (``layout``,
  ``physical_schedule``, ``error_word``); ``prepare_kl_schedule=False`` sets ``kl_schedule`` to
  ``None`` as in MSA, but the physical CSR is built anyway (the backward reads it), so
  ``kl.backward`` still works.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from . import _device, _eager, _ops

__all__ = ["AttentionMetadata", "backward", "forward", "prepare"]

_DEFAULT_SCALE = 128**-0.5


@dataclass(frozen=True, eq=False)
class SparseAttentionSchedule:
    """The attention work list of one selection and what the backward derives from it."""

    #: int32 ``[work_capacity, 6]``: ``(kv_head, row, q_begin, q_count, fragment, kv_block)``.
    scheduler_metadata: Tensor
    #: int32 ``[1]``: live work items.
    work_count: Tensor
    #: int32 ``[4, T*16]``: ``q_local | writer_rank << 24``, ``-1`` tail.
    qsplit_indices: Tensor
    #: int32 ``[T, 4]``: valid entries per (query, kv head).
    split_counts: Tensor
    #: int32 ``[B]``: workspace row of each fragment's document.
    document_workspace_starts: Tensor
    #: int32 ``[B]``: ``k_len - q_len`` of each fragment.
    query_offsets: Tensor

    @property
    def work_capacity(self) -> int:
        return self.scheduler_metadata.shape[0]


@dataclass(frozen=True, eq=False)
class PhysicalSchedule:
    """The physical CSR over (kv head, physical key block): the KL backward's and the sm_90a /
    deterministic attention backward's schedule."""

    #: int32 ``[4, P+1]``.
    physical_row_ptr: Tensor
    #: int32 ``[4, T*16]``: packed query indices, ascending, ``-1`` tail.
    physical_q_indices: Tensor
    #: int32 ``[4, T*16]``: ``visible_keys | writer_rank << 8``, ``-1`` tail.
    physical_valid_rows: Tensor


@dataclass(frozen=True, eq=False)
class VarlenLayoutTensors:
    """The layout arrays msa-rs derives on the device from cu_seqlens and fragment_indices."""

    #: int32 ``[B]``: first fragment of each fragment's document (identity without fragments).
    fragment_first: Tensor
    #: int32 ``[T]``: fragment of each query.
    query_fragment: Tensor
    #: int32 ``[P]``: packed K row of key 0 of each physical block (``-1`` padding).
    block_key_start: Tensor
    #: int32 ``[P]``: keys stored in each physical block.
    block_key_count: Tensor


@dataclass(frozen=True, eq=False)
class AttentionMetadata:
    """The metadata of one top-k selection (MSA's fields first, then msa-rs's own). Shared by
    that layer's forward, backward and KL backward; rebuild it whenever the top-k changes.
    Frozen; compared and hashed by identity (its fields are tensors)."""

    topk_indices: Tensor
    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    fragment_indices: Optional[Tensor]
    #: int32 ``[4, total_rows+1]``: k2q CSR offsets per kv head (level-major rows).
    k2q_row_ptr: Tensor
    #: int32 ``[4, total_q*16]``: fragment-local queries, ascending per row, ``-1`` tail.
    k2q_q_indices: Tensor
    schedule: SparseAttentionSchedule
    kl_schedule: Optional[PhysicalSchedule]
    total_k: int
    total_rows: int
    max_seqlen_q: int
    max_seqlen_k: int
    # ---- msa-rs
    layout: VarlenLayoutTensors
    physical_schedule: PhysicalSchedule
    #: int32 ``[4]``: ``(code, head, query, slot)`` of the first invalid entry, zeros if valid.
    error_word: Tensor

    @property
    def total_q(self) -> int:
        return self.topk_indices.shape[1]

    def op_tensors(self) -> list[Tensor]:
        """The 19 tensors the ops take, in ``_C.LAYOUT_NAMES + _C.METADATA_NAMES`` order."""
        s, p, lay = self.schedule, self.physical_schedule, self.layout
        return [
            self.cu_seqlens_q,
            self.cu_seqlens_k,
            lay.fragment_first,
            lay.query_fragment,
            lay.block_key_start,
            lay.block_key_count,
            self.topk_indices,
            self.error_word,
            self.k2q_row_ptr,
            self.k2q_q_indices,
            s.qsplit_indices,
            s.split_counts,
            s.scheduler_metadata,
            s.work_count,
            p.physical_row_ptr,
            p.physical_q_indices,
            p.physical_valid_rows,
            s.document_workspace_starts,
            s.query_offsets,
        ]

    def op_ints(self) -> tuple[int, int, bool]:
        """``(total_rows, max_seqlen_k, has_fragments)`` as the ops take them."""
        return self.total_rows, self.max_seqlen_k, self.fragment_indices is not None

    @functools.cached_property
    def _eager_call(self) -> _eager.Call:
        # What the eager fast path derives from the shapes once (msa_torch._eager).
        return _eager.Call(self)


# ---------------------------------------------------------------------------------------------
# argument checks (trace-safe: shapes, dtypes, devices)


def _int_tensor(op: str, name: str, t: Tensor, ndim: int) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"msa_torch.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"msa_torch.{op}: {name} must be int32, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"msa_torch.{op}: {name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"msa_torch.{op}: {name} must be contiguous")


_FP8_DTYPES = tuple(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, name)
)


def _fp8(t: Tensor) -> bool:
    return t.dtype in _FP8_DTYPES


def _bf16_tensor(op: str, name: str, t: Tensor, shape: tuple, *, fp8_ok_msa: bool = False) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"msa_torch.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if _fp8(t):
        raise NotImplementedError(
            f"msa_torch.{op}: FP8 inputs ({name} is {t.dtype}) are not implemented by msa-rs; "
            "pass bfloat16 tensors"
        )
    if t.dtype != torch.bfloat16:
        raise ValueError(f"msa_torch.{op}: {name} must be bfloat16, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(
            f"msa_torch.{op}: {name} must have shape {list(shape)}, got {list(t.shape)}"
        )
    if not t.is_contiguous():
        raise ValueError(f"msa_torch.{op}: {name} must be contiguous")


def _f32_tensor(op: str, name: str, t: Tensor, shape: tuple) -> None:
    if not isinstance(t, Tensor):
        raise TypeError(f"msa_torch.{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise ValueError(f"msa_torch.{op}: {name} must be float32, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(
            f"msa_torch.{op}: {name} must have shape {list(shape)}, got {list(t.shape)}"
        )
    if not t.is_contiguous():
        raise ValueError(f"msa_torch.{op}: {name} must be contiguous")


def _check_scale(op: str, name: str, value: Optional[float]) -> None:
    if value is None:
        return
    if not math.isclose(float(value), _DEFAULT_SCALE, rel_tol=1e-6, abs_tol=0.0):
        raise NotImplementedError(
            f"msa_torch.{op}: {name}={value} is not implemented: the msa-rs kernels fix the "
            f"scale to 128 ** -0.5 = {_DEFAULT_SCALE}; pass None"
        )


def _check_p_mode(op: str, sparse_attn_p_mode: str) -> None:
    if sparse_attn_p_mode == "":
        return
    if sparse_attn_p_mode == "fp8":
        raise NotImplementedError(
            f"msa_torch.{op}: sparse_attn_p_mode='fp8' (FP8 QAT of P) is not implemented by "
            "msa-rs; pass ''"
        )
    raise ValueError(
        f"msa_torch.{op}: sparse_attn_p_mode must be '' or 'fp8', got {sparse_attn_p_mode!r}"
    )


def _check_metadata(op: str, metadata) -> None:
    if not isinstance(metadata, AttentionMetadata):
        raise TypeError(
            f"msa_torch.{op}: metadata must be the AttentionMetadata of "
            f"msa_torch.attention.prepare, got {type(metadata).__name__}"
        )


def _check_qkv(op: str, q: Tensor, k: Tensor, v: Tensor, metadata: AttentionMetadata) -> None:
    t, tk = metadata.total_q, metadata.total_k
    _bf16_tensor(op, "q", q, (t, _ops.Q_HEADS, _ops.HEAD_DIM))
    _bf16_tensor(op, "k", k, (tk, _ops.KV_HEADS, _ops.HEAD_DIM))
    _bf16_tensor(op, "v", v, (tk, _ops.KV_HEADS, _ops.HEAD_DIM))


# ---------------------------------------------------------------------------------------------
# prepare


def _prepare(
    topk_indices: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    total_k: int,
    total_rows: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    fragment_indices: Optional[Tensor],
    prepare_kl_schedule: bool,
    validate: bool,
) -> AttentionMetadata:
    op = "attention.prepare"
    _int_tensor(op, "topk_indices", topk_indices, 3)
    if topk_indices.shape[0] != _ops.KV_HEADS or topk_indices.shape[2] != _ops.TOPK:
        raise ValueError(
            f"msa_torch.{op}: topk_indices must have shape [4, total_q, 16], got "
            f"{list(topk_indices.shape)}"
        )
    _int_tensor(op, "cu_seqlens_q", cu_seqlens_q, 1)
    _int_tensor(op, "cu_seqlens_k", cu_seqlens_k, 1)
    if cu_seqlens_q.shape != cu_seqlens_k.shape or cu_seqlens_q.shape[0] < 2:
        raise ValueError(
            f"msa_torch.{op}: cu_seqlens_q and cu_seqlens_k must both be [B+1] with B >= 1, got "
            f"{list(cu_seqlens_q.shape)} and {list(cu_seqlens_k.shape)}"
        )
    if fragment_indices is not None:
        _int_tensor(op, "fragment_indices", fragment_indices, 1)
        if fragment_indices.shape[0] != cu_seqlens_q.shape[0] - 1:
            raise ValueError(
                f"msa_torch.{op}: fragment_indices must be [B] = [{cu_seqlens_q.shape[0] - 1}], "
                f"got {list(fragment_indices.shape)}"
            )
    for name, value in (
        ("total_k", total_k),
        ("total_rows", total_rows),
        ("max_seqlen_q", max_seqlen_q),
        ("max_seqlen_k", max_seqlen_k),
    ):
        if int(value) < 0:
            raise ValueError(f"msa_torch.{op}: {name} must be >= 0, got {value}")
    _device.check_cuda(
        op,
        topk_indices=topk_indices,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        fragment_indices=fragment_indices,
    )
    outs = _ops.prepare_op(
        topk_indices,
        cu_seqlens_q,
        cu_seqlens_k,
        fragment_indices,
        int(total_k),
        int(total_rows),
        int(max_seqlen_k),
        bool(validate),
    )
    (ff, qf, bks, bkc, error_word, row_ptr, q_indices, qsplit, split_counts, sched, work_count,
     prp, pqi, pv, dws, qo) = outs
    physical = PhysicalSchedule(prp, pqi, pv)
    return AttentionMetadata(
        topk_indices=topk_indices,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        fragment_indices=fragment_indices,
        k2q_row_ptr=row_ptr,
        k2q_q_indices=q_indices,
        schedule=SparseAttentionSchedule(
            scheduler_metadata=sched,
            work_count=work_count,
            qsplit_indices=qsplit,
            split_counts=split_counts,
            document_workspace_starts=dws,
            query_offsets=qo,
        ),
        kl_schedule=physical if prepare_kl_schedule else None,
        total_k=int(total_k),
        total_rows=int(total_rows),
        max_seqlen_q=int(max_seqlen_q),
        max_seqlen_k=int(max_seqlen_k),
        layout=VarlenLayoutTensors(ff, qf, bks, bkc),
        physical_schedule=physical,
        error_word=error_word,
    )


def prepare(
    topk_indices: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    *,
    total_k: int,
    total_rows: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    fragment_indices: Optional[Tensor] = None,
    prepare_kl_schedule: bool = True,
) -> AttentionMetadata:
    """The metadata of one top-k selection (MSA's ``msa_v1.attention.prepare``).

    ``topk_indices`` int32 ``[4, total_q, 16]`` (document-local block ids, ``-1`` padding in any
    slot), ``cu_seqlens_q`` / ``cu_seqlens_k`` int32 ``[B+1]``, optional ``fragment_indices``
    int32 ``[B]`` (CP fragments), ``total_k = k.shape[0]``, ``total_rows`` = the exact
    ``sum_b ceil(klen_b / 128)``, ``max_seqlen_k = max_b klen_b``; all on one CUDA device.

    Validates the selection: reads the device's error word once (a synchronization) and raises
    :class:`msa_torch.TopKError` (a ``ValueError`` with ``code``, ``reason``, ``head``,
    ``query``, ``slot``) for the first invalid entry (negative other than -1, out of the
    fragment's blocks, after the query's own block, or a duplicate). While the current stream is
    being captured the check is skipped; :func:`prepare_unchecked` never checks.
    """
    return _prepare(
        topk_indices, cu_seqlens_q, cu_seqlens_k, total_k, total_rows, max_seqlen_q,
        max_seqlen_k, fragment_indices, prepare_kl_schedule, validate=True,
    )


def prepare_unchecked(
    topk_indices: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    *,
    total_k: int,
    total_rows: int,
    max_seqlen_q: int,
    max_seqlen_k: int,
    fragment_indices: Optional[Tensor] = None,
    prepare_kl_schedule: bool = True,
) -> AttentionMetadata:
    """:func:`prepare` without the validation: no host synchronization at all, so it can be
    captured in a CUDA graph (with a new top-k copied into the same buffer before each replay).
    The metadata's ``error_word`` still holds the device's verdict: :func:`validate` reads it
    later, outside the capture."""
    return _prepare(
        topk_indices, cu_seqlens_q, cu_seqlens_k, total_k, total_rows, max_seqlen_q,
        max_seqlen_k, fragment_indices, prepare_kl_schedule, validate=False,
    )


def validate(metadata: AttentionMetadata) -> None:
    """Read ``metadata.error_word`` (synchronizes the current stream) and raise
    :class:`msa_torch.TopKError` if the selection it was built from is invalid."""
    from . import _ext

    _check_metadata("attention.validate", metadata)
    device = _device.check_cuda("attention.validate", error_word=metadata.error_word)
    _device.require(device)
    rows, msk, frag = metadata.op_ints()
    shape = _ops.call_shape(
        *_ops._key(
            metadata.total_q,
            metadata.total_k,
            metadata.cu_seqlens_q.shape[0] - 1,
            rows,
            msk,
            frag,
            device,
        )
    )
    with torch.cuda.device(device):
        _ext.ext().validate_prepare(
            shape, _ops._view(metadata.error_word), _ops._stream(device)
        )


# ---------------------------------------------------------------------------------------------
# forward / backward


def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    metadata: AttentionMetadata,
    *,
    softmax_scale: Optional[float] = None,
    lse_temperature_scale: float = 1.0,
    return_softmax_lse: bool = False,
    return_temperature_lse: bool = False,
    partial_dtype: torch.dtype = torch.bfloat16,
    sparse_attn_p_mode: str = "",
    deterministic: bool = False,
):
    """Sparse attention forward (MSA's ``msa_v1.attention.forward``): ``O`` bf16
    ``[total_q, 64, 128]``, and the LSE f32 ``[total_q, 64]`` (natural log, ``-inf`` for an
    empty selection, where ``O`` is 0) when ``return_softmax_lse``. Differentiable in q, k, v
    through the ``msa_torch::attention_bwd`` op; the LSE is not differentiable.
    ``deterministic`` selects the bitwise-repeatable backward (the forward is deterministic
    either way)."""
    op = "attention.forward"
    if softmax_scale is not None:
        _check_scale(op, "softmax_scale", softmax_scale)
    if return_temperature_lse:
        raise NotImplementedError(
            f"msa_torch.{op}: return_temperature_lse=True is not implemented by msa-rs"
        )
    if float(lse_temperature_scale) != 1.0:
        raise NotImplementedError(
            f"msa_torch.{op}: lse_temperature_scale={lse_temperature_scale} is not implemented "
            "by msa-rs (only 1.0)"
        )
    if partial_dtype != torch.bfloat16:
        raise NotImplementedError(
            f"msa_torch.{op}: partial_dtype={partial_dtype} is not implemented: msa-rs's "
            "forward is one pass with no partials (torch.bfloat16 accepted)"
        )
    if sparse_attn_p_mode != "":
        _check_p_mode(op, sparse_attn_p_mode)
    _check_metadata(op, metadata)
    fast = _eager.forward(q, k, v, metadata, bool(deterministic), bool(_ops.force_sm80))
    if fast is not None:
        out, lse = fast
        return (out, lse) if return_softmax_lse else out
    _check_qkv(op, q, k, v, metadata)
    _device.check_cuda(op, q=q, k=k, v=v, topk_indices=metadata.topk_indices)
    out, lse = _ops.attention_fwd(
        q, k, v, metadata.op_tensors(), *metadata.op_ints(), bool(deterministic),
        bool(_ops.force_sm80),
    )
    if return_softmax_lse:
        return out, lse
    return out


def backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
    out: Tensor,
    lse: Tensor,
    metadata: AttentionMetadata,
    *,
    softmax_scale: Optional[float] = None,
    sparse_attn_p_mode: str = "",
    q_fp8: Optional[Tensor] = None,
    k_fp8: Optional[Tensor] = None,
    deterministic: bool = False,
):
    """Sparse attention backward (MSA's ``msa_v1.attention.backward``): ``(dq, dk, dv)`` bf16
    in the shapes of q, k, v from ``dout``, the forward's ``out`` (bf16) and ``lse`` (f32
    ``[total_q, 64]``). Keys no query selected get exact zeros. ``deterministic=True`` runs the
    bitwise-repeatable kernels (ordered accumulation)."""
    op = "attention.backward"
    if softmax_scale is not None:
        _check_scale(op, "softmax_scale", softmax_scale)
    if sparse_attn_p_mode != "":
        _check_p_mode(op, sparse_attn_p_mode)
    if q_fp8 is not None or k_fp8 is not None:
        raise NotImplementedError(
            f"msa_torch.{op}: q_fp8 / k_fp8 (FP8 inputs) are not implemented by msa-rs"
        )
    _check_metadata(op, metadata)
    fast = _eager.backward(
        q, k, v, dout, out, lse, metadata, bool(deterministic), bool(_ops.force_sm80)
    )
    if fast is not None:
        return fast
    _check_qkv(op, q, k, v, metadata)
    t = metadata.total_q
    _bf16_tensor(op, "dout", dout, (t, _ops.Q_HEADS, _ops.HEAD_DIM))
    _bf16_tensor(op, "out", out, (t, _ops.Q_HEADS, _ops.HEAD_DIM))
    _f32_tensor(op, "lse", lse, (t, _ops.Q_HEADS))
    _device.check_cuda(
        op, q=q, k=k, v=v, dout=dout, out=out, lse=lse, topk_indices=metadata.topk_indices
    )
    return _ops.attention_bwd(
        q, k, v, dout, out, lse, metadata.op_tensors(), *metadata.op_ints(),
        bool(deterministic), bool(_ops.force_sm80),
    )
