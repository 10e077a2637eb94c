"""Host overhead of msa_torch's Python path on a 12K-query rank: the measurement the GPU test
asserts on, and (run as a script) a breakdown of where the host time of one forward goes.

What is measured. The GPU is first given a long ``torch.cuda._sleep`` so that every call of the
loop is only enqueued, never waited for: the host time of a call is the wall time
(``time.perf_counter_ns``) of ``n`` back-to-back calls divided by ``n`` — Python wrapper,
argument checks, allocations, the extension call and the CUDA launches, everything the calling
thread spends before it can go on. The loop must end while the sleep still runs (checked: the
sleep's end event has not completed), otherwise the wall time would include waiting for the GPU
and the measurement is refused. The device time is CUDA events around the same ``n`` calls,
which run back to back once the sleep ends. Five repetitions; the median of each is reported.

    python3 crates/msa-torch/tests/host_overhead.py      # on the GPU host, the wheel installed

prints the per-call host time of each piece of a forward and a backward (perf_counter_ns over
many calls, the GPU kept busy), then cProfile's top entries of 200 forwards.
"""

from __future__ import annotations

import statistics
import time

import torch

T = 12288  # queries of one CP16 rank of a 196,608-token pack
SLEEP_CYCLES = 400_000_000  # ~0.2 s at the H200's ~1.98 GHz: far longer than any loop below


def twelve_k_case(device="cuda"):
    """One 12,288-token document, MSA's recent-16 selection: (metadata, q, k, v, dout)."""
    from msa_torch import attention

    cu = torch.tensor([0, T], dtype=torch.int32, device=device)
    local = torch.arange(T, device=device) // 128
    ids = torch.arange(16, device=device)[None, :] + (local - 15).clamp(min=0)[:, None]
    topk = torch.where(ids <= local[:, None], ids, -1).to(torch.int32)
    topk = topk[None].expand(4, T, 16).contiguous()
    meta = attention.prepare(
        topk, cu, cu, total_k=T, total_rows=T // 128, max_seqlen_q=T, max_seqlen_k=T
    )
    g = torch.Generator(device=device).manual_seed(0)

    def bf16(*shape):
        return torch.randn(*shape, device=device, generator=g).to(torch.bfloat16)

    return meta, bf16(T, 64, 128), bf16(T, 4, 128), bf16(T, 4, 128), bf16(T, 64, 128)


def measure(fn, n=100, reps=5):
    """``(host ms, device ms)`` per call of ``fn``: medians over ``reps`` runs of ``n`` calls
    enqueued behind a GPU sleep (see the module docstring)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    hosts, devices = [], []
    for _ in range(reps):
        busy = torch.cuda.Event()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SLEEP_CYCLES)
        busy.record()
        start.record()
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        host_ns = time.perf_counter_ns() - t0
        if busy.query():
            raise RuntimeError(
                "the GPU went idle before the loop ended: the wall time includes waiting for "
                "it, not host time alone (raise SLEEP_CYCLES or lower n)"
            )
        end.record()
        torch.cuda.synchronize()
        hosts.append(host_ns / n / 1e6)
        devices.append(start.elapsed_time(end) / n)
    return statistics.median(hosts), statistics.median(devices)


class _EngineFloor(torch.autograd.Function):
    """The autograd engine's own cost of one backward on these tensors, which no op can avoid
    (it runs the backward on its device thread and hands the result back): saves what
    msa_torch's Function saves and returns gradients of the same shapes, allocated, not
    computed."""

    @staticmethod
    def forward(ctx, q, k, v, out):
        ctx.save_for_backward(q, k, v, out)
        return torch.empty_like(out)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), None


#: The path whose host time is the autograd engine's floor, not msa_torch's.
ENGINE_FLOOR = "autograd engine floor"


def paths(meta, q, k, v, dout):
    """The measured calls, by name: what a training step runs."""
    from msa_torch import attention

    out, lse = attention.forward(q, k, v, meta, return_softmax_lse=True)
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out_g = attention.forward(qg, kg, vg, meta)
    floor_out = _EngineFloor.apply(qg, kg, vg, out)
    return {
        "forward": lambda: attention.forward(q, k, v, meta, return_softmax_lse=True),
        "forward (autograd)": lambda: attention.forward(qg, kg, vg, meta),
        "backward": lambda: attention.backward(q, k, v, dout, out, lse, meta),
        "backward (autograd)": lambda: torch.autograd.grad(
            out_g, (qg, kg, vg), dout, retain_graph=True
        ),
        ENGINE_FLOOR: lambda: torch.autograd.grad(
            floor_out, (qg, kg, vg), dout, retain_graph=True
        ),
    }


def report(results):
    lines = []
    for name, (host, dev) in results.items():
        ratio = f"{100 * host / dev:5.2f}%" if dev > 0 else "  —"
        lines.append(
            f"  {name:<21} host {host:7.4f} ms/call  device {dev:7.4f} ms/call  ratio {ratio}"
        )
    return "\n".join(lines)


def breakdown():
    """Per-call host time of each piece of the forward and backward paths."""
    import cProfile
    import pstats

    import msa_torch
    from msa_torch import _eager, _ext, _ops, attention

    meta, q, k, v, dout = twelve_k_case()
    out, lse = attention.forward(q, k, v, meta, return_softmax_lse=True)
    c = meta._eager_call
    kernels = c.kernels(False)
    C = _ext.ext()
    ts, ints = meta.op_tensors(), meta.op_ints()
    idx = c.index
    ws_bytes = c.forward_bytes(kernels)
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")
    path, bwd_bytes = c.backward(False, kernels)
    bws = torch.empty(max(bwd_bytes, 1), dtype=torch.uint8, device="cuda")
    out2 = torch.empty_like(out)
    lse2 = torch.empty_like(lse)
    grads = [torch.empty_like(x) for x in (q, k, v)]
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))

    def raw_forward():
        C.forward(
            c.shape, _eager.views(c.layout), _eager.views(c.meta), _eager.views((q, k, v)),
            _eager.views((out2, lse2)), kernels, (ws.data_ptr(), ws_bytes), _ops.raw_stream(idx),
        )

    def raw_backward():
        C.backward(
            c.shape, _eager.views(c.layout), _eager.views(c.meta), _eager.views((q, k, v)),
            _eager.views((dout, out, lse)), _eager.views(grads), path,
            (bws.data_ptr(), bwd_bytes), _ops.raw_stream(idx),
        )

    def allocations():
        torch.empty(c.q_shape, dtype=torch.bfloat16, device=c.device)
        torch.empty(c.lse_shape, dtype=torch.float32, device=c.device)
        if ws_bytes:
            torch.empty(ws_bytes, dtype=torch.uint8, device=c.device)

    def device_and_stream():
        torch.cuda.current_device()
        _ops.raw_stream(idx)

    def views():
        _eager.views(c.layout), _eager.views(c.meta), _eager.views((q, k, v, out2, lse2))

    pieces = {
        "attention.forward (the whole call)": lambda: attention.forward(
            q, k, v, meta, return_softmax_lse=True
        ),
        "  _eager.plain (may it bypass the ops)": lambda: _eager.plain(q, k, v),
        "  Call.qkv_ok (shape/dtype/device checks)": lambda: c.qkv_ok(q, k, v),
        "  current device + raw stream": device_and_stream,
        "  allocations (out, lse, workspace)": allocations,
        "  views (data_ptr, numel of 24 tensors)": views,
        "  _C.forward (extension: checks + launches)": raw_forward,
        "_eager.launch_forward (no Python checks)": lambda: _eager.launch_forward(
            c, q, k, v, False
        ),
        "custom op msa_torch::attention_fwd": lambda: _ops.attention_fwd(
            q, k, v, ts, *ints, False, False
        ),
        "attention.forward, q/k/v requiring grad": lambda: attention.forward(qg, kg, vg, meta),
        "custom op attention_fwd, q/k/v requiring grad": lambda: _ops.attention_fwd(
            qg, kg, vg, ts, *ints, False, False
        ),
        "attention.backward (the whole call)": lambda: attention.backward(
            q, k, v, dout, out, lse, meta
        ),
        "  _C.backward (extension: checks + launches)": raw_backward,
        "custom op msa_torch::attention_bwd": lambda: _ops.attention_bwd(
            q, k, v, dout, out, lse, ts, *ints, False, False
        ),
    }
    print(f"msa_torch {msa_torch.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}; kernels {kernels}, backward path {path}")
    print("host time per call (GPU kept busy; median of 5 loops of 100 calls):")
    for name, fn in pieces.items():
        print(f"  {name:<46} {1e3 * measure(fn)[0]:8.2f} us")

    print("\nthe measurement of the GPU test:")
    print(report({name: measure(fn) for name, fn in paths(meta, q, k, v, dout).items()}))

    print("\ncProfile of 200 forwards (tottime):")
    fwd = pieces["attention.forward (the whole call)"]
    prof = cProfile.Profile()
    torch.cuda._sleep(SLEEP_CYCLES)
    prof.enable()
    for _ in range(200):
        fwd()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    breakdown()
