"""The sparse KL backward of the index branch (MSA's ``msa_v1.kl``): ``backward`` with MSA's
arguments, on the msa-rs kernels (deterministic in both modes).

Not implemented (``NotImplementedError``): a ``softmax_scale`` or ``indexer_softmax_scale``
other than ``128 ** -0.5`` (the kernels fix both).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from . import _device, _ops
from .attention import AttentionMetadata, _bf16_tensor, _check_metadata, _check_scale, _f32_tensor

__all__ = ["backward"]


def backward(
    q: Tensor,
    k: Tensor,
    teacher_lse: Tensor,
    qi: Tensor,
    ki: Tensor,
    indexer_lse: Tensor,
    metadata: AttentionMetadata,
    *,
    softmax_scale: Optional[float] = None,
    indexer_softmax_scale: Optional[float] = None,
    loss_coeff: float = 1.0,
    deterministic: bool = False,
):
    """``(dqi bf16 [total_q, 4, 128], dki bf16 [total_k, 1, 128])`` of
    ``loss_coeff / (4 total_q) * sum_{q,g} KL(teacher || student)`` over the sparse token sets
    of ``metadata``: the teacher is the group mean of the attention's probabilities (from ``q``,
    ``k`` and the forward's ``teacher_lse`` f32 ``[total_q, 64]``), the student the softmax of
    ``qi.ki / sqrt(128)`` normalized by ``indexer_lse`` f32 ``[4, total_q]`` (the indexer's LSE
    when the attention's top-k is the indexer's, else :func:`msa_torch.indexer.selection_lse`).
    No loss is returned; q and k get no gradient."""
    op = "kl.backward"
    _check_scale(op, "softmax_scale", softmax_scale)
    _check_scale(op, "indexer_softmax_scale", indexer_softmax_scale)
    _check_metadata(op, metadata)
    t, tk = metadata.total_q, metadata.total_k
    _bf16_tensor(op, "q", q, (t, _ops.Q_HEADS, _ops.HEAD_DIM))
    _bf16_tensor(op, "k", k, (tk, _ops.KV_HEADS, _ops.HEAD_DIM))
    _f32_tensor(op, "teacher_lse", teacher_lse, (t, _ops.Q_HEADS))
    _bf16_tensor(op, "qi", qi, (t, _ops.INDEX_HEADS, _ops.HEAD_DIM))
    _bf16_tensor(op, "ki", ki, (tk, 1, _ops.HEAD_DIM))
    _f32_tensor(op, "indexer_lse", indexer_lse, (_ops.INDEX_HEADS, t))
    _device.check_cuda(
        op,
        q=q,
        k=k,
        teacher_lse=teacher_lse,
        qi=qi,
        ki=ki,
        indexer_lse=indexer_lse,
        topk_indices=metadata.topk_indices,
    )
    return _ops.kl_bwd(
        q, k, teacher_lse, qi, ki, indexer_lse, metadata.op_tensors(), *metadata.op_ints(),
        float(loss_coeff),
    )
