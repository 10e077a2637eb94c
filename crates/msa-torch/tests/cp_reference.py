"""The fp32 pure-torch reference of msa_reference.py as msa_torch.cp per-rank calls
(``REFERENCE``, a :class:`msa_torch.cp.LocalOps`), and a reference indexer forward: what the CP
tests run on the CPU in place of the kernels.

The reference metadata is the layout (``msa_reference.layout`` of the cu_seqlens the CP wrapper
passes) and the selection; ``prepare`` also checks that the integers the wrapper derived
(total_k, total_rows, max seqlens) are the reference's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from msa_torch import cp

import msa_reference as ref


@dataclass(frozen=True, eq=False)
class RefMetadata:
    lay: dict
    topk: torch.Tensor

    @property
    def total_q(self) -> int:
        return self.lay["total_q"]

    @property
    def total_k(self) -> int:
        return self.lay["total_k"]


def _layout(cu_seqlens_q, cu_seqlens_k, fragment_indices):
    frag = None if fragment_indices is None else fragment_indices.tolist()
    return ref.layout(cu_seqlens_q.tolist(), cu_seqlens_k.tolist(), frag)


def prepare(
    topk_indices, cu_seqlens_q, cu_seqlens_k, *, total_k, total_rows, max_seqlen_q,
    max_seqlen_k, fragment_indices=None, prepare_kl_schedule=True,
):
    lay = _layout(cu_seqlens_q, cu_seqlens_k, fragment_indices)
    given = dict(
        total_k=total_k, total_rows=total_rows, max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
    )
    derived = {name: lay[name] for name in given}
    if given != derived:
        raise ValueError(f"reference prepare: got {given}, the layout has {derived}")
    if topk_indices.shape != (ref.KV_HEADS, lay["total_q"], ref.TOPK):
        raise ValueError(f"reference prepare: topk shape {list(topk_indices.shape)}")
    return RefMetadata(lay, topk_indices)


def attention_forward(q, k, v, metadata, *, return_softmax_lse=False, **_options):
    out, lse = ref.attention(metadata.lay, metadata.topk, q, k, v)
    return (out, lse) if return_softmax_lse else out


def attention_backward(q, k, v, dout, out, lse, metadata, **_options):
    with torch.enable_grad():
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        o, _ = ref.attention(metadata.lay, metadata.topk, *leaves)
        return torch.autograd.grad(o, leaves, dout)


def topk_indices(lay, qi, ki):
    """int32 [4, T, 16]: msa-rs's indexer rule (indexer.forward's docstring) per (head, query):
    the top min(15, local) non-local blocks by (block max of qi.ki / sqrt(128) desc, block id
    asc), then the local block, then -1. Scores in fp64 of the inputs (bf16 values: exact
    products, so the ranking does not depend on the layout's summation order)."""
    topk = torch.full((ref.KV_HEADS, lay["total_q"], ref.TOPK), -1, dtype=torch.int32)
    for b in range(len(lay["qlens"])):
        kl, ql, q0 = lay["klens"][b], lay["qlens"][b], lay["cu_q"][b]
        kb = lay["cu_k"][lay["first"][b]]
        s = torch.einsum("qgd,kd->gqk", qi[q0 : q0 + ql].double(), ki[kb : kb + kl, 0].double())
        nb = -(-kl // ref.BLOCK)
        s = torch.nn.functional.pad(s, (0, nb * ref.BLOCK - kl), value=-math.inf)
        bmax = s.view(ref.KV_HEADS, ql, nb, ref.BLOCK).amax(-1)  # [4, ql, nb]
        local = torch.tensor(ref.positions(lay, b)) // ref.BLOCK  # [ql]
        earlier = torch.arange(nb)[None, :] < local[:, None]  # [ql, nb]
        bmax = bmax.masked_fill(~earlier[None], -math.inf)
        order = torch.sort(bmax, dim=-1, descending=True, stable=True).indices
        for i in range(ql):
            n = min(ref.TOPK - 1, int(local[i]))
            topk[:, q0 + i, :n] = order[:, i, :n].to(torch.int32)
            topk[:, q0 + i, n] = int(local[i])
    return topk


def indexer_forward(
    qi, ki, *, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv, fragment_indices=None,
    **_options,
):
    lay = _layout(cu_seqlens_q, cu_seqlens_kv, fragment_indices)
    if (max_seqlen_q, max_seqlen_kv) != (lay["max_seqlen_q"], lay["max_seqlen_k"]):
        raise ValueError(f"reference indexer: max seqlens {max_seqlen_q}, {max_seqlen_kv}")
    topk = topk_indices(lay, qi, ki)
    return topk, ref.selection_lse(lay, topk, qi, ki)


def kl_backward(q, k, teacher_lse, qi, ki, indexer_lse, metadata, *, loss_coeff=1.0, **_opts):
    return ref.kl_backward(
        metadata.lay, metadata.topk, q, k, teacher_lse, qi, ki, indexer_lse, loss_coeff
    )


REFERENCE = cp.LocalOps(
    prepare=prepare,
    prepare_unchecked=prepare,
    attention_forward=attention_forward,
    attention_backward=attention_backward,
    indexer_forward=indexer_forward,
    kl_backward=kl_backward,
)
