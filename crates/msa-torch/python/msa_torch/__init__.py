"""msa_torch: MiniMax Sparse Attention (MSA v1) training kernels of msa-rs for PyTorch, a
drop-in for MSA's ``msa_v1`` training API on Hopper (and any GPU of compute capability 8.0 or
newer through the portable kernels).

    from msa_torch import attention, indexer, kl

    topk, indexer_lse = indexer.forward(qi, ki, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k,
                                        max_seqlen_q=msq, max_seqlen_kv=msk)
    meta = attention.prepare(topk, cu_q, cu_k, total_k=k.shape[0], total_rows=rows,
                             max_seqlen_q=msq, max_seqlen_k=msk)
    out, lse = attention.forward(q, k, v, meta, return_softmax_lse=True)   # autograd: q, k, v
    dq, dk, dv = attention.backward(q, k, v, dout, out, lse, meta)
    dqi, dki = kl.backward(q, k, lse, qi, ki, indexer_lse, meta)

Every op is a ``torch.library.custom_op`` (namespace ``msa_torch``) with a fake impl, so
``torch.compile(fullgraph=True)`` traces it, and launches on ``torch.cuda.current_stream()``
with outputs and workspaces from torch's caching allocator. Plain eager calls of
``attention.forward`` / ``attention.backward`` skip the dispatcher (same checks, same launches;
:mod:`msa_torch._eager`). ``msa_torch.compat
.install_msa_v1_alias()`` makes ``import msa_v1`` resolve here (opt-in, never over a real
``msa_v1``). The package imports without a GPU or without its compiled extension;
:func:`unavailable_reason` says why the kernels cannot run.
"""

from __future__ import annotations

from . import _ext
from ._device import UnsupportedDeviceError, unavailable_reason
from ._ext import ExtensionUnavailableError, TopKError
from . import attention, indexer, indexer_tree, kl  # noqa: E402
from . import cp  # noqa: E402  (context parallelism; not part of msa_v1's __all__)
from . import nemo  # noqa: E402  (NeMo AutoModel's kernels surface; not part of msa_v1's)

__all__ = ["attention", "indexer", "indexer_tree", "kl"]

__version__ = "0.1.0"


def built_archs() -> list[str]:
    """The GPU targets compiled into the extension (e.g. ``['sm_90a', 'sm_80', 'compute_80']``);
    raises :class:`ExtensionUnavailableError` without the extension."""
    return list(_ext.ext().built_archs())


def available(device=None) -> bool:
    """Whether the kernels can run on ``device`` (default: the current CUDA device)."""
    return unavailable_reason(device) is None
