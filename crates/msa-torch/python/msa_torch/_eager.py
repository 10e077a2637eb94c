"""The eager fast path of ``attention.forward`` and ``attention.backward``.

A call through a ``torch.library.custom_op`` spends host time before the kernel is reached:
the dispatcher boxes the 22 tensor arguments, then Python kernels for autograd, the backend and
the aliasing check run in turn, and with ``requires_grad`` inputs the op's generated
``autograd.Function`` also flattens the metadata list with pytree (on the 2-core build host ~55
us per call without grad, ~280 us with; tests/host_overhead.py prints the GPU host's numbers),
against a forward of ~1.4 ms on a 12K-query rank. So a plain eager call launches directly:

- only when nothing can observe the difference (:func:`plain`): not under ``torch.compile`` /
  export or ``torch.jit.trace`` tracing, no torch-function or dispatch mode (fake tensors,
  functionalization, ``make_fx``, ``torch.device`` as a context), no functorch transform, every
  tensor a plain ``torch.Tensor``. Anything else takes the custom ops, exactly as before;
- with the same checks: the shape, dtype, device and layout checks that protect the launch run
  on every call, against sizes derived once per :class:`AttentionMetadata` (:class:`Call`);
  when one fails the call goes through the custom op, whose checks name the problem. The
  extension checks every length again before any launch;
- with autograd through :class:`_Attention`, an ``autograd.Function`` whose backward is the same
  launch as ``attention.backward`` (differentiating its gradients raises, as through the op). An
  explicit ``attention.backward`` on inputs that require grad goes through the custom op (its
  outputs must stay non-differentiable).

Setting :data:`enabled` to ``False`` routes every call through the custom ops (the tests compare
the two paths bitwise).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _device, _ext, _ops

#: Take the fast path when :func:`plain` allows it (``False``: always the custom ops).
enabled = True

_BF16, _F32, _U8 = torch.bfloat16, torch.float32, torch.uint8
_NOT_TWICE = b"msa_torch: the attention backward is not differentiable (double backward)"
stream = _ops.raw_stream


def plain(*tensors) -> bool:
    """Whether an eager call may bypass the custom ops: the fast path is on, nothing is being
    traced (dynamo, ``torch.jit.trace``) or compiled, no torch-function / dispatch mode or
    functorch transform is active, and every argument is a plain ``torch.Tensor``."""
    if (
        not enabled
        or torch.compiler.is_compiling()
        or torch._C._is_tracing()
        or torch._C._is_torch_function_mode_enabled()
        or torch._C._len_torch_dispatch_stack()
        or torch._C._functorch.peek_interpreter_stack() is not None
    ):
        return False
    for t in tensors:
        if type(t) is not Tensor:
            return False
    return True


def views(ts) -> list[tuple[int, int]]:
    # Read on every call: a tensor's address is never cached.
    return [(t.data_ptr(), t.numel()) for t in ts]


class Call:
    """What every eager call on one :class:`~msa_torch.attention.AttentionMetadata` needs,
    derived once from its shapes: the 19 op tensors, the expected q/k/v shapes, the device, the
    extension's ``CallShape`` and the kernel sets and workspace sizes by option."""

    __slots__ = (
        "device", "index", "tensors", "layout", "meta", "ints", "q_shape", "kv_shape",
        "lse_shape", "shape", "_kernels", "_forward_bytes", "_backward",
    )

    def __init__(self, metadata) -> None:
        ts = tuple(metadata.op_tensors())
        self.device = metadata.topk_indices.device
        self.index = self.device.index
        self.tensors = ts
        self.layout = ts[: len(_ops.LAYOUT_NAMES)]
        self.meta = ts[len(_ops.LAYOUT_NAMES) :]
        self.ints = metadata.op_ints()
        t, tk = metadata.total_q, metadata.total_k
        self.q_shape = torch.Size((t, _ops.Q_HEADS, _ops.HEAD_DIM))
        self.kv_shape = torch.Size((tk, _ops.KV_HEADS, _ops.HEAD_DIM))
        self.lse_shape = torch.Size((t, _ops.Q_HEADS))
        rows, msk, frag = self.ints
        batch = metadata.cu_seqlens_q.shape[0] - 1
        #: ``None``: no fast path for this metadata (not on a CUDA device, or integers the
        #: extension rejects); the custom op path then raises the error, after its own checks.
        self.shape = None
        if self.device.type == "cuda":
            try:
                key = _ops._key(t, tk, batch, rows, msk, frag, self.device)
                self.shape = _ops.call_shape(*key)
            except Exception:  # noqa: BLE001 - re-raised by the custom op path
                pass
        self._kernels: dict = {}
        self._forward_bytes: dict = {}
        self._backward: dict = {}

    def kernels(self, force_sm80: bool) -> str:
        k = self._kernels.get(force_sm80)
        if k is None:
            k = self._kernels[force_sm80] = _device.kernel_set(self.device, force_sm80)
        return k

    def forward_bytes(self, kernels: str) -> int:
        b = self._forward_bytes.get(kernels)
        if b is None:
            b = self._forward_bytes[kernels] = self.shape.forward_workspace_bytes(kernels)
        return b

    def backward(self, deterministic: bool, kernels: str) -> tuple[str, int]:
        """``(path, workspace bytes)`` of the backward MSA would run."""
        key = (deterministic, kernels)
        pb = self._backward.get(key)
        if pb is None:
            path = _ext.ext().backward_path(deterministic, kernels)
            pb = self._backward[key] = (path, self.shape.backward_workspace_bytes(path))
        return pb

    def qkv_ok(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """The checks of ``attention.forward`` on q, k, v (bf16, the metadata's shapes, its
        device, contiguous)."""
        d, kv = self.device, self.kv_shape
        return self.shape is not None and (
            q.dtype == _BF16 and k.dtype == _BF16 and v.dtype == _BF16
            and q.shape == self.q_shape and k.shape == kv and v.shape == kv
            and q.device == d and k.device == d and v.device == d
            and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        )

    def grad_inputs_ok(self, dout: Tensor, out: Tensor, lse: Tensor) -> bool:
        """The checks of ``attention.backward`` on dout, out (bf16 ``[T, 64, 128]``) and lse
        (f32 ``[T, 64]``)."""
        d, qs = self.device, self.q_shape
        return (
            dout.dtype == _BF16 and out.dtype == _BF16 and lse.dtype == _F32
            and dout.shape == qs and out.shape == qs and lse.shape == self.lse_shape
            and dout.device == d and out.device == d and lse.device == d
            and dout.is_contiguous() and out.is_contiguous() and lse.is_contiguous()
        )


def _workspace(nbytes: int, device) -> tuple[Tensor | None, tuple[int, int]]:
    if nbytes == 0:
        return None, (0, 0)
    ws = torch.empty(nbytes, dtype=_U8, device=device)
    return ws, (ws.data_ptr(), nbytes)


def launch_forward(c: Call, q: Tensor, k: Tensor, v: Tensor, force_sm80: bool):
    """``(out, lse)``: allocations from torch's caching allocator, one extension call on the
    current stream. The arguments passed :meth:`Call.qkv_ok`."""
    if torch.cuda.current_device() != c.index:
        with torch.cuda.device(c.index):
            return launch_forward(c, q, k, v, force_sm80)
    kernels = c.kernels(force_sm80)
    dev = c.device
    out = torch.empty(c.q_shape, dtype=_BF16, device=dev)
    lse = torch.empty(c.lse_shape, dtype=_F32, device=dev)
    # `keep` holds the workspace until the launch is enqueued (then freed in stream order).
    keep, ws_view = _workspace(c.forward_bytes(kernels), dev)
    _ext.ext().forward(
        c.shape,
        views(c.layout),
        views(c.meta),
        [(q.data_ptr(), q.numel()), (k.data_ptr(), k.numel()), (v.data_ptr(), v.numel())],
        [(out.data_ptr(), out.numel()), (lse.data_ptr(), lse.numel())],
        kernels,
        ws_view,
        stream(c.index),
    )
    del keep
    return out, lse


def launch_backward(c: Call, q, k, v, dout, out, lse, deterministic: bool, force_sm80: bool):
    """``(dq, dk, dv)``; the arguments passed :meth:`Call.qkv_ok` and
    :meth:`Call.grad_inputs_ok`."""
    if torch.cuda.current_device() != c.index:
        with torch.cuda.device(c.index):
            return launch_backward(c, q, k, v, dout, out, lse, deterministic, force_sm80)
    path, nbytes = c.backward(deterministic, c.kernels(force_sm80))
    dev = c.device
    dq = torch.empty(c.q_shape, dtype=_BF16, device=dev)
    dk = torch.empty(c.kv_shape, dtype=_BF16, device=dev)
    dv = torch.empty(c.kv_shape, dtype=_BF16, device=dev)
    keep, ws_view = _workspace(nbytes, dev)
    _ext.ext().backward(
        c.shape,
        views(c.layout),
        views(c.meta),
        views((q, k, v)),
        views((dout, out, lse)),
        views((dq, dk, dv)),
        path,
        ws_view,
        stream(c.index),
    )
    del keep
    return dq, dk, dv


class _Attention(torch.autograd.Function):
    """The eager forward with autograd: the backward is :func:`launch_backward` (the custom op
    when ``dout`` fails its checks). The LSE is not differentiable (MSA)."""

    @staticmethod
    def forward(ctx, q, k, v, c: Call, deterministic: bool, force_sm80: bool):
        out, lse = launch_forward(c, q, k, v, force_sm80)
        ctx.mark_non_differentiable(lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.call, ctx.flags = c, (deterministic, force_sm80)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        c, (deterministic, force_sm80) = ctx.call, ctx.flags
        with torch.no_grad():
            dout = dout.contiguous()
            if plain(dout) and c.grad_inputs_ok(dout, out, lse):
                grads = launch_backward(c, q, k, v, dout, out, lse, deterministic, force_sm80)
            else:
                grads = _ops.attention_bwd(
                    q, k, v, dout, out, lse, list(c.tensors), *c.ints, deterministic, force_sm80
                )
        if torch.is_grad_enabled():
            # create_graph=True: differentiating these gradients must raise (as through the
            # custom op, whose backward op has no autograd), never silently give zero.
            err = torch._C._functions.DelayedError(_NOT_TWICE, len(grads))
            grads = err(*(g.detach().requires_grad_() for g in grads))
        return (*grads, None, None, None)


def forward(q, k, v, metadata, deterministic: bool, force_sm80: bool):
    """``(out, lse)`` on the fast path, or ``None`` when the call must take the custom op."""
    if not plain(q, k, v):
        return None
    c = metadata._eager_call
    if not c.qkv_ok(q, k, v):
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return _Attention.apply(q, k, v, c, deterministic, force_sm80)
    return launch_forward(c, q, k, v, force_sm80)


def backward(q, k, v, dout, out, lse, metadata, deterministic: bool, force_sm80: bool):
    """``(dq, dk, dv)`` on the fast path, or ``None`` when the call must take the custom op."""
    if not plain(q, k, v, dout, out, lse):
        return None
    if torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad
        or dout.requires_grad or out.requires_grad or lse.requires_grad
    ):
        return None
    c = metadata._eager_call
    if not (c.qkv_ok(q, k, v) and c.grad_inputs_ok(dout, out, lse)):
        return None
    return launch_backward(c, q, k, v, dout, out, lse, deterministic, force_sm80)
