"""GPU tests of msa_torch (marker ``gpu``; skipped without a served GPU unless
``MSA_TORCH_REQUIRE_GPU=1``): numerics against the fp32 reference of msa_reference.py with MSA's
tolerances (out atol = rtol = 3e-2, LSE 1e-3, gradients cosine >= 0.99 and relative L2 <= 1e-2),
torch.library.opcheck on every op, autograd, determinism, torch.compile(fullgraph=True), CUDA
graph capture and replay with a new top-k, the top-k validation error and the device gate."""

import math
import shutil

import pytest
import torch

import msa_torch
from msa_torch import _ops, attention, indexer, kl

import msa_reference as ref

pytestmark = pytest.mark.gpu

OUT_TOL = 3e-2
LSE_TOL = 1e-3
COSINE = 0.99
REL_L2 = 1e-2

LAYOUTS = {"varlen": ref.VARLEN, "fragments": ref.FRAGMENTS}


@pytest.fixture(autouse=True)
def _no_tf32():
    # The reference is fp32: no TF32 in its matmuls.
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


class Case:
    """One layout on the GPU: cu_seqlens, a selection, bf16 inputs."""

    def __init__(self, lay, topk, seed=0, device="cuda"):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.lay = lay
        self.d = ref.device_layout(lay, device)
        t, tk = lay["total_q"], lay["total_k"]

        def bf16(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(device)

        self.q = bf16(t, 64, 128)
        self.k = bf16(tk, 4, 128)
        self.v = bf16(tk, 4, 128)
        self.dout = bf16(t, 64, 128)
        self.qi = bf16(t, 4, 128)
        self.ki = bf16(tk, 1, 128)
        self.topk = topk.to(device)

    def prepare(self, topk=None, checked=True):
        fn = attention.prepare if checked else attention.prepare_unchecked
        return fn(
            self.topk if topk is None else topk,
            self.d["cu_seqlens_q"],
            self.d["cu_seqlens_k"],
            fragment_indices=self.d["fragment_indices"],
            **ref.prepare_kwargs(self.lay),
        )

    def reference(self, topk=None):
        """fp32 out, lse and dq, dk, dv (through autograd of the reference)."""
        topk = self.topk if topk is None else topk
        q, k, v = (x.float().requires_grad_() for x in (self.q, self.k, self.v))
        out, lse = ref.attention(self.lay, topk, q, k, v)
        (out * self.dout.float()).sum().backward()
        return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _check_forward(out, lse, ref_out, ref_lse):
    torch.testing.assert_close(out.float(), ref_out, atol=OUT_TOL, rtol=OUT_TOL)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse)), "LSE infinities differ"
    assert (lse[~finite] == -math.inf).all()
    torch.testing.assert_close(lse[finite], ref_lse[finite], atol=LSE_TOL, rtol=LSE_TOL)


def _check_grads(got, want, names=("dq", "dk", "dv")):
    for name, g, w in zip(names, got, want):
        c, r = ref.cosine(g, w), ref.rel_l2(g, w)
        assert c >= COSINE and r <= REL_L2, f"{name}: cosine {c:.6f}, relative L2 {r:.2e}"


def _unselected_keys(lay, topk):
    """bool [Tk, 4]: packed key rows that no query's token set contains (exact-zero dk/dv)."""
    used = torch.zeros(lay["total_k"], 4, dtype=torch.bool, device=topk.device)
    for b in range(len(lay["qlens"])):
        kb = lay["cu_k"][lay["first"][b]]
        m = ref._token_mask(lay, topk, b)  # [4, ql, kl]
        used[kb : kb + lay["klens"][b]] |= m.any(1).T
    return ~used


# ---------------------------------------------------------------------------------------------
# availability


def test_device_is_served():
    assert msa_torch.available(), msa_torch.unavailable_reason()
    major, minor = torch.cuda.get_device_capability()
    served = msa_torch._C.served_by(major, minor)
    assert served is not None
    if (major, minor) == (9, 0):
        assert served == "sm_90a"
        with torch.cuda.device(0):
            assert msa_torch._C.device_kernels() == "sm90a"


# ---------------------------------------------------------------------------------------------
# numerics


@pytest.mark.parametrize("name", sorted(LAYOUTS))
@pytest.mark.parametrize("kernels", ["auto", "sm80"])
def test_forward_backward_match_the_reference(name, kernels, monkeypatch):
    monkeypatch.setattr(_ops, "force_sm80", kernels == "sm80")
    lay = LAYOUTS[name]
    case = Case(lay, ref.random_topk(lay, seed=11, empty_fraction=0.03), seed=1)
    meta = case.prepare()
    out, lse = attention.forward(case.q, case.k, case.v, meta, return_softmax_lse=True)
    ref_out, ref_lse, *ref_grads = case.reference()
    _check_forward(out, lse, ref_out, ref_lse)
    # Empty selections: out 0, lse -inf.
    empty = (case.topk < 0).all(-1).T.repeat_interleave(16, dim=1)  # [T, 64]
    assert empty.any(), "the case has empty selections"
    assert (lse[empty] == -math.inf).all() and (out[empty] == 0).all()
    unselected = _unselected_keys(lay, case.topk)
    for deterministic in (False, True):
        grads = attention.backward(
            case.q, case.k, case.v, case.dout, out, lse, meta, deterministic=deterministic
        )
        _check_grads([g.float() for g in grads], ref_grads)
        dq, dk, dv = grads
        assert (dq[empty] == 0).all()
        assert (dk[unselected] == 0).all() and (dv[unselected] == 0).all(), "exact zeros"


def test_recent16_pattern_matches_the_reference():
    lay = ref.FRAGMENTS
    case = Case(lay, ref.recent_topk(lay), seed=2)
    meta = case.prepare()
    out, lse = attention.forward(case.q, case.k, case.v, meta, return_softmax_lse=True)
    ref_out, ref_lse, *ref_grads = case.reference()
    _check_forward(out, lse, ref_out, ref_lse)
    grads = attention.backward(case.q, case.k, case.v, case.dout, out, lse, meta)
    _check_grads([g.float() for g in grads], ref_grads)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_indexer_matches_the_reference(name):
    lay = LAYOUTS[name]
    case = Case(lay, ref.recent_topk(lay), seed=3)
    topk, lse = indexer.forward(
        case.qi,
        case.ki,
        cu_seqlens_q=case.d["cu_seqlens_q"],
        cu_seqlens_kv=case.d["cu_seqlens_k"],
        max_seqlen_q=lay["max_seqlen_q"],
        max_seqlen_kv=lay["max_seqlen_k"],
        fragment_indices=case.d["fragment_indices"],
    )
    assert topk.dtype == torch.int32 and topk.shape == (4, lay["total_q"], 16)
    assert lse.dtype == torch.float32 and lse.shape == (4, lay["total_q"])
    failures = ref.check_indexer(lay, case.qi, case.ki, topk, lse)
    assert not failures, "\n".join(failures[:20])
    # Its selection is valid: prepare accepts it.
    case.prepare(topk)
    again, lse2 = indexer.forward(
        case.qi,
        case.ki,
        cu_seqlens_q=case.d["cu_seqlens_q"],
        cu_seqlens_kv=case.d["cu_seqlens_k"],
        max_seqlen_q=lay["max_seqlen_q"],
        max_seqlen_kv=lay["max_seqlen_k"],
        fragment_indices=case.d["fragment_indices"],
        deterministic=True,
    )
    assert torch.equal(again, topk) and torch.equal(lse2, lse)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_kl_backward_matches_the_reference(name):
    lay = LAYOUTS[name]
    case = Case(lay, ref.random_topk(lay, seed=5), seed=4)
    meta = case.prepare()
    _, lse = attention.forward(case.q, case.k, case.v, meta, return_softmax_lse=True)
    ilse = indexer.selection_lse(case.qi, case.ki, meta)
    ref_ilse = ref.selection_lse(lay, case.topk, case.qi, case.ki)
    finite = torch.isfinite(ref_ilse)
    assert torch.equal(finite, torch.isfinite(ilse))
    torch.testing.assert_close(ilse[finite], ref_ilse[finite], atol=2e-3, rtol=0)
    dqi, dki = kl.backward(case.q, case.k, lse, case.qi, case.ki, ilse, meta, loss_coeff=0.7)
    assert dqi.dtype == torch.bfloat16 and dqi.shape == case.qi.shape
    assert dki.dtype == torch.bfloat16 and dki.shape == case.ki.shape
    want = ref.kl_backward(lay, case.topk, case.q, case.k, lse, case.qi, case.ki, ilse, 0.7)
    _check_grads([dqi.float(), dki.float()], want, names=("dqi", "dki"))
    again = kl.backward(case.q, case.k, lse, case.qi, case.ki, ilse, meta, loss_coeff=0.7)
    assert torch.equal(again[0], dqi) and torch.equal(again[1], dki)


# ---------------------------------------------------------------------------------------------
# autograd, determinism, streams


def test_autograd_matches_explicit_backward():
    lay = ref.FRAGMENTS
    case = Case(lay, ref.random_topk(lay, seed=6), seed=5)
    meta = case.prepare()
    q, k, v = (x.clone().requires_grad_() for x in (case.q, case.k, case.v))
    out, lse = attention.forward(q, k, v, meta, return_softmax_lse=True, deterministic=True)
    assert out.requires_grad and not lse.requires_grad
    (out * case.dout).sum().backward()
    dq, dk, dv = attention.backward(
        case.q, case.k, case.v, case.dout, out.detach(), lse, meta, deterministic=True
    )
    assert torch.equal(q.grad, dq) and torch.equal(k.grad, dk) and torch.equal(v.grad, dv)
    # The default (atomic / sm_90a) backward through autograd: same gradients up to rounding.
    q2, k2, v2 = (x.clone().requires_grad_() for x in (case.q, case.k, case.v))
    out2 = attention.forward(q2, k2, v2, meta)
    assert torch.equal(out2, out.detach())
    out2.float().mul(case.dout.float()).sum().backward()
    _check_grads([q2.grad.float(), k2.grad.float(), v2.grad.float()],
                 [dq.float(), dk.float(), dv.float()])


def test_deterministic_backward_is_bitwise_repeatable():
    lay = ref.VARLEN
    case = Case(lay, ref.random_topk(lay, seed=7), seed=6)
    meta = case.prepare()
    out, lse = attention.forward(case.q, case.k, case.v, meta, return_softmax_lse=True)
    first = attention.backward(case.q, case.k, case.v, case.dout, out, lse, meta,
                               deterministic=True)
    for _ in range(3):
        again = attention.backward(case.q, case.k, case.v, case.dout, out, lse, meta,
                                   deterministic=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)
    out2, lse2 = attention.forward(case.q, case.k, case.v, meta, return_softmax_lse=True)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)


def test_launches_follow_the_current_stream():
    lay = ref.VARLEN
    case = Case(lay, ref.random_topk(lay, seed=8), seed=7)
    meta = case.prepare()
    want = attention.forward(case.q, case.k, case.v, meta)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        meta2 = case.prepare(checked=False)
        got = attention.forward(case.q, case.k, case.v, meta2)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------------
# opcheck


def _op_args(case, meta, out, lse, ilse):
    rows, msk, frag = meta.op_ints()
    ts = meta.op_tensors()
    q, k, v = (x.clone().requires_grad_() for x in (case.q, case.k, case.v))
    return {
        "prepare": (
            _ops.prepare_op,
            (case.topk, case.d["cu_seqlens_q"], case.d["cu_seqlens_k"],
             case.d["fragment_indices"], case.lay["total_k"], rows, msk, True),
        ),
        "attention_fwd": (_ops.attention_fwd, (q, k, v, ts, rows, msk, frag, True, False)),
        "attention_bwd": (
            _ops.attention_bwd,
            (case.q, case.k, case.v, case.dout, out, lse, ts, rows, msk, frag, True, False),
        ),
        "indexer_fwd": (
            _ops.indexer_fwd,
            (case.qi, case.ki, case.d["cu_seqlens_q"], case.d["cu_seqlens_k"],
             case.d["fragment_indices"], msk),
        ),
        "selection_lse": (_ops.selection_lse, (case.qi, case.ki, ts, rows, msk, frag)),
        "kl_bwd": (
            _ops.kl_bwd,
            (case.q, case.k, lse, case.qi, case.ki, ilse, ts, rows, msk, frag, 1.0),
        ),
    }


@pytest.mark.parametrize(
    "op", ["prepare", "attention_fwd", "attention_bwd", "indexer_fwd", "selection_lse", "kl_bwd"]
)
def test_opcheck(op):
    lay = ref.FRAGMENTS
    case = Case(lay, ref.random_topk(lay, seed=9), seed=8)
    meta = case.prepare()
    out, lse = attention.forward(case.q, case.k, case.v, meta, return_softmax_lse=True)
    ilse = indexer.selection_lse(case.qi, case.ki, meta)
    fn, args = _op_args(case, meta, out, lse, ilse)[op]
    torch.library.opcheck(fn, args)


# ---------------------------------------------------------------------------------------------
# torch.compile


class Layer(torch.nn.Module):
    """A small attention layer: q/k/v projections, MSA attention, output projection."""

    def __init__(self, width=64):
        super().__init__()
        kw = dict(dtype=torch.bfloat16, device="cuda")
        self.wq = torch.nn.Linear(width, 64 * 128, bias=False, **kw)
        self.wk = torch.nn.Linear(width, 4 * 128, bias=False, **kw)
        self.wv = torch.nn.Linear(width, 4 * 128, bias=False, **kw)
        self.wo = torch.nn.Linear(64 * 128, width, bias=False, **kw)

    def forward(self, x, kv, metadata):
        q = self.wq(x).view(-1, 64, 128)
        k = self.wk(kv).view(-1, 4, 128)
        v = self.wv(kv).view(-1, 4, 128)
        out = attention.forward(q, k, v, metadata, deterministic=True)
        return self.wo(out.view(-1, 64 * 128))


def _compile_case():
    lay = ref.FRAGMENTS
    case = Case(lay, ref.random_topk(lay, seed=10), seed=9)
    meta = case.prepare()
    torch.manual_seed(0)
    layer = Layer()
    x = torch.randn(lay["total_q"], 64, dtype=torch.bfloat16, device="cuda")
    kv = torch.randn(lay["total_k"], 64, dtype=torch.bfloat16, device="cuda")
    return layer, x, kv, meta


def _run(layer, x, kv, meta):
    layer.zero_grad(set_to_none=True)
    y = layer(x, kv, meta)
    y.float().square().mean().backward()
    return y.detach(), [p.grad.detach().clone() for p in layer.parameters()]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_fullgraph(backend):
    if backend == "inductor" and shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("inductor needs a C compiler (none on PATH)")
    torch._dynamo.reset()
    layer, x, kv, meta = _compile_case()
    y_eager, g_eager = _run(layer, x, kv, meta)
    compiled = torch.compile(layer, fullgraph=True, backend=backend)
    y, grads = _run(compiled, x, kv, meta)
    # The attention itself is bitwise deterministic; the projections may pick other GEMMs.
    torch.testing.assert_close(y.float(), y_eager.float(), atol=2e-2, rtol=2e-2)
    for g, w in zip(grads, g_eager):
        assert ref.cosine(g, w) >= 0.999


# ---------------------------------------------------------------------------------------------
# CUDA graphs


def test_cuda_graph_replays_prepare_forward_backward_with_a_new_topk():
    lay = ref.FRAGMENTS
    case = Case(lay, ref.random_topk(lay, seed=12), seed=10)
    topk2 = ref.random_topk(lay, seed=13, empty_fraction=0.02).cuda()
    buf = case.topk.clone()

    def step():
        meta = attention.prepare_unchecked(
            buf, case.d["cu_seqlens_q"], case.d["cu_seqlens_k"],
            fragment_indices=case.d["fragment_indices"], **ref.prepare_kwargs(lay),
        )
        out, lse = attention.forward(case.q, case.k, case.v, meta, return_softmax_lse=True)
        det = attention.backward(case.q, case.k, case.v, case.dout, out, lse, meta,
                                 deterministic=True)
        fast = attention.backward(case.q, case.k, case.v, case.dout, out, lse, meta)
        return meta, out, lse, det, fast

    # Warm up on a side stream (first launches read device attributes).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta_g, out_g, lse_g, det_g, fast_g = step()
    buf.copy_(topk2)
    graph.replay()
    torch.cuda.synchronize()
    attention.validate(meta_g)  # outside the capture: the replayed selection is valid

    meta_e = case.prepare(topk2)
    out_e, lse_e = attention.forward(case.q, case.k, case.v, meta_e, return_softmax_lse=True)
    det_e = attention.backward(case.q, case.k, case.v, case.dout, out_e, lse_e, meta_e,
                               deterministic=True)
    fast_e = attention.backward(case.q, case.k, case.v, case.dout, out_e, lse_e, meta_e)
    for name in ("k2q_row_ptr", "k2q_q_indices", "error_word"):
        assert torch.equal(getattr(meta_g, name), getattr(meta_e, name)), name
    assert torch.equal(meta_g.schedule.scheduler_metadata, meta_e.schedule.scheduler_metadata)
    assert torch.equal(out_g, out_e) and torch.equal(lse_g, lse_e)
    for a, b in zip(det_g, det_e):
        assert torch.equal(a, b)
    _check_grads([a.float() for a in fast_g], [b.float() for b in fast_e])
    ref_out, ref_lse, *ref_grads = case.reference(topk2)
    _check_forward(out_g, lse_g, ref_out, ref_lse)
    _check_grads([g.float() for g in det_g], ref_grads)


def test_checked_prepare_skips_validation_while_capturing():
    lay = ref.VARLEN
    case = Case(lay, ref.recent_topk(lay), seed=11)
    case.prepare()  # eager, validated
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta = case.prepare()  # would synchronize outside a capture
    graph.replay()
    torch.cuda.synchronize()
    assert (meta.error_word == 0).all()


# ---------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    "value, code, reason",
    [(-2, 1, "negative"), (99, 2, "out_of_range"), ("dup", 4, "duplicate")],
)
def test_prepare_names_the_invalid_entry(value, code, reason):
    lay = ref.VARLEN
    topk = ref.recent_topk(lay)
    head, query, slot = 2, 400, 3  # query 400: position 50 of the third document, slot 3 is -1
    if value == "dup":
        topk[head, query, slot] = topk[head, query, 0]
    else:
        topk[head, query, slot] = value
    case = Case(lay, topk, seed=12)
    with pytest.raises(msa_torch.TopKError) as e:
        case.prepare()
    err = e.value
    assert isinstance(err, ValueError)
    assert (err.code, err.head, err.query, err.slot) == (code, head, query, slot)
    assert err.reason == reason
    assert f"topk_indices[{head}, {query}, {slot}]" in str(err)
    # Unchecked: no error, the word holds the fault.
    meta = case.prepare(checked=False)
    assert meta.error_word.tolist() == [code, head, query, slot]
    with pytest.raises(msa_torch.TopKError):
        attention.validate(meta)


def test_non_causal_entry_is_rejected():
    lay = ref.VARLEN
    topk = ref.recent_topk(lay)
    # Query 0 of the first document sits at position 0: block 1 exists (300 keys) but is after it.
    topk[0, 0, 5] = 1
    case = Case(lay, topk, seed=13)
    with pytest.raises(msa_torch.TopKError) as e:
        case.prepare()
    assert (e.value.code, e.value.head, e.value.query, e.value.slot) == (3, 0, 0, 5)


def test_cpu_tensors_are_rejected():
    lay = ref.VARLEN
    case = Case(lay, ref.recent_topk(lay), seed=14)
    meta = case.prepare()
    with pytest.raises(msa_torch.UnsupportedDeviceError, match="q is on cpu"):
        attention.forward(case.q.cpu(), case.k, case.v, meta)
    with pytest.raises(msa_torch.UnsupportedDeviceError, match="topk_indices is on cpu"):
        attention.prepare(
            case.topk.cpu(), case.d["cu_seqlens_q"], case.d["cu_seqlens_k"],
            **ref.prepare_kwargs(lay),
        )


# ---------------------------------------------------------------------------------------------
# host overhead of the Python path


def test_host_overhead_on_a_12k_query_rank():
    """Per-call host time of the Python path (wrapper + custom-op dispatch + extension) next to
    the kernel time, on one 12,288-query document with MSA's recent-16 selection. Printed (see
    the run's summary); the assertion is loose (the issue's target is 5% on a real CP16 rank)."""
    import time

    t = 12288
    dev = "cuda"
    cu = torch.tensor([0, t], dtype=torch.int32, device=dev)
    local = torch.arange(t, device=dev) // 128
    ids = torch.arange(16, device=dev)[None, :] + (local - 15).clamp(min=0)[:, None]
    topk = torch.where(ids <= local[:, None], ids, -1).to(torch.int32)
    topk = topk[None].expand(4, t, 16).contiguous()
    meta = attention.prepare(topk, cu, cu, total_k=t, total_rows=t // 128, max_seqlen_q=t,
                             max_seqlen_k=t)
    g = torch.Generator(device=dev).manual_seed(0)
    q = torch.randn(t, 64, 128, device=dev, generator=g).to(torch.bfloat16)
    k = torch.randn(t, 4, 128, device=dev, generator=g).to(torch.bfloat16)
    v = torch.randn(t, 4, 128, device=dev, generator=g).to(torch.bfloat16)
    dout = torch.randn(t, 64, 128, device=dev, generator=g).to(torch.bfloat16)
    out, lse = attention.forward(q, k, v, meta, return_softmax_lse=True)
    attention.backward(q, k, v, dout, out, lse, meta)
    torch.cuda.synchronize()

    def measure(fn, n=20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        host = 0.0
        torch.cuda._sleep(50_000_000)  # keep the GPU busy so enqueue time is host time alone
        start.record()
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            host += time.perf_counter() - t0
        end.record()
        torch.cuda.synchronize()
        return host / n * 1e3, start.elapsed_time(end) / n

    fwd_host, fwd_dev = measure(lambda: attention.forward(q, k, v, meta, return_softmax_lse=True))
    bwd_host, bwd_dev = measure(lambda: attention.backward(q, k, v, dout, out, lse, meta))
    print(
        f"\n12K-query rank, recent16: forward host {fwd_host:.3f} ms / device {fwd_dev:.3f} ms "
        f"({100 * fwd_host / fwd_dev:.1f}%), backward host {bwd_host:.3f} ms / device "
        f"{bwd_dev:.3f} ms ({100 * bwd_host / bwd_dev:.1f}%)"
    )
    assert fwd_host < 0.5 * fwd_dev and bwd_host < 0.5 * bwd_dev
