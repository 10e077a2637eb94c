"""The lightning indexer (MSA's ``msa_v1.indexer``): ``forward`` with MSA's arguments, on the
msa-rs kernels (deterministic in both modes), plus :func:`selection_lse` (msa-rs: the index LSE
over the token sets of an attention selection, the ``indexer_lse`` the KL backward expects when
the attention's top-k is not the indexer's own).

Not implemented (``NotImplementedError`` naming the option): ``use_fp16_score=True``,
``lse_temperature != 1``, a caller-built ``schedule`` / ``workspace`` (msa-torch allocates its
workspace from torch's caching allocator on every call).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from . import _device, _ops
from .attention import AttentionMetadata, _bf16_tensor, _check_metadata, _int_tensor

__all__ = ["forward"]

# MSA's bound on max_seqlen_kv (contract §1.4).
MAX_SEQLEN_KV = 4_194_240


def forward(
    q: Tensor,
    k: Tensor,
    *,
    cu_seqlens_q: Tensor,
    cu_seqlens_kv: Tensor,
    max_seqlen_q: int,
    max_seqlen_kv: int,
    fragment_indices: Optional[Tensor] = None,
    schedule=None,
    workspace=None,
    lse_temperature: float = 1.0,
    deterministic: bool = False,
    use_fp16_score: bool = False,
):
    """Top-k block selection: ``(topk_indices int32 [4, total_q, 16], selected_lse f32
    [4, total_q])`` from index queries ``q`` bf16 ``[total_q, 4, 128]`` and the shared index keys
    ``k`` bf16 ``[total_k, 1, 128]``. Per (head, query): the top min(15, p // 128) non-local blocks
    by (block max of qi.ki / sqrt(128) desc, block id asc), then the local block, then -1; the
    LSE is over the selected visible tokens. ``max_seqlen_kv`` is the longest (fragment-
    redirected) K range."""
    op = "indexer.forward"
    if use_fp16_score:
        raise NotImplementedError(
            f"msa_torch.{op}: use_fp16_score=True (FP16 block maxima) is not implemented by "
            "msa-rs; its indexer ranks fp32 scores"
        )
    if float(lse_temperature) != 1.0:
        raise NotImplementedError(
            f"msa_torch.{op}: lse_temperature={lse_temperature} is not implemented by msa-rs "
            "(only 1.0)"
        )
    if schedule is not None or workspace is not None:
        raise NotImplementedError(
            f"msa_torch.{op}: a caller-built schedule / workspace is not implemented by "
            "msa-torch (it allocates its workspace from torch's caching allocator); pass None"
        )
    _int_tensor(op, "cu_seqlens_q", cu_seqlens_q, 1)
    _int_tensor(op, "cu_seqlens_kv", cu_seqlens_kv, 1)
    if cu_seqlens_q.shape != cu_seqlens_kv.shape or cu_seqlens_q.shape[0] < 2:
        raise ValueError(
            f"msa_torch.{op}: cu_seqlens_q and cu_seqlens_kv must both be [B+1] with B >= 1, "
            f"got {list(cu_seqlens_q.shape)} and {list(cu_seqlens_kv.shape)}"
        )
    if fragment_indices is not None:
        _int_tensor(op, "fragment_indices", fragment_indices, 1)
        if fragment_indices.shape[0] != cu_seqlens_q.shape[0] - 1:
            raise ValueError(
                f"msa_torch.{op}: fragment_indices must be [B] = "
                f"[{cu_seqlens_q.shape[0] - 1}], got {list(fragment_indices.shape)}"
            )
    if not 0 <= int(max_seqlen_q) <= int(max_seqlen_kv) <= MAX_SEQLEN_KV:
        raise ValueError(
            f"msa_torch.{op}: need 0 <= max_seqlen_q <= max_seqlen_kv <= {MAX_SEQLEN_KV}, got "
            f"max_seqlen_q={max_seqlen_q}, max_seqlen_kv={max_seqlen_kv}"
        )
    if not isinstance(q, Tensor) or q.dim() != 3:
        raise ValueError(f"msa_torch.{op}: q must be [total_q, 4, 128]")
    if not isinstance(k, Tensor) or k.dim() != 3:
        raise ValueError(f"msa_torch.{op}: k must be [total_k, 1, 128]")
    _bf16_tensor(op, "q", q, (q.shape[0], _ops.INDEX_HEADS, _ops.HEAD_DIM))
    _bf16_tensor(op, "k", k, (k.shape[0], 1, _ops.HEAD_DIM))
    _device.check_cuda(
        op,
        q=q,
        k=k,
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_kv=cu_seqlens_kv,
        fragment_indices=fragment_indices,
    )
    return _ops.indexer_fwd(q, k, cu_seqlens_q, cu_seqlens_kv, fragment_indices, int(max_seqlen_kv))


def selection_lse(qi: Tensor, ki: Tensor, metadata: AttentionMetadata) -> Tensor:
    """msa-rs: the natural-log LSE f32 ``[4, total_q]`` of ``qi.ki / sqrt(128)`` over the token
    sets of ``metadata``'s selection (``-inf`` where empty): the ``indexer_lse`` of
    :func:`msa_torch.kl.backward` for an attention selection that is not the indexer's own."""
    op = "indexer.selection_lse"
    _check_metadata(op, metadata)
    _bf16_tensor(op, "qi", qi, (metadata.total_q, _ops.INDEX_HEADS, _ops.HEAD_DIM))
    _bf16_tensor(op, "ki", ki, (metadata.total_k, 1, _ops.HEAD_DIM))
    _device.check_cuda(op, qi=qi, ki=ki, topk_indices=metadata.topk_indices)
    return _ops.selection_lse(qi, ki, metadata.op_tensors(), *metadata.op_ints())
