"""GPU tests of msa_torch.cp (marker ``gpu``) on one GPU, with the real kernels, on real
196,608-token packs of data/cases/cp16_192k_dev.jsonl:

- world size 1 over NCCL (one process): the CP wrapper (all-gather, packing, local calls,
  reduce-scatter) is bitwise the plain msa_torch calls on the rank's layout, and within the
  strict tolerances of the plain varlen call; CPU tensors on an NCCL group are refused;
- CP2 with the collectives emulated in-process (two ranks as two threads on one GPU,
  tests/cp_emulation.py): every rank's indexer, prepare, attention forward and backward and KL
  on its packed layout, its gradients reduce-scattered, equal the one call over the whole pack
  (the same top-k; MSA's strict tolerances: out 3e-3, LSE 1e-4, gradients cosine >= 0.9999 and
  relative L2 <= 5e-3)."""

from __future__ import annotations

import json
import pathlib
import time

import pytest
import torch
import torch.distributed as dist

from msa_torch import attention, cp, indexer, kl

import cp_emulation
import msa_reference as ref

pytestmark = pytest.mark.gpu

ROOT = pathlib.Path(__file__).resolve().parents[3]
DEV_MANIFEST = ROOT / "data" / "cases" / "cp16_192k_dev.jsonl"

OUT_TOL, LSE_TOL, COSINE, REL_L2 = 3e-3, 1e-4, 0.9999, 5e-3


def _cases():
    cases = [json.loads(x) for x in DEV_MANIFEST.read_text().splitlines() if x.strip()]
    longest = max(cases, key=lambda c: c["metrics"]["max_seqlen"])
    shortest = min(cases, key=lambda c: c["metrics"]["median_seqlen"])
    return {f"case{c['case_id']}": c["cu_seqlens"] for c in (longest, shortest)}


CASES = _cases()


def _inputs(t: int, seed: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)

    def bf16(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)

    return dict(
        q=bf16(t, 64, 128), k=bf16(t, 4, 128), v=bf16(t, 4, 128), dout=bf16(t, 64, 128),
        qi=bf16(t, 4, 128), ki=bf16(t, 1, 128),
    )


def _check_close(name: str, got: torch.Tensor, want: torch.Tensor, kind: str) -> str:
    """Asserts the strict tolerances; returns a report line."""
    g, w = got.float(), want.float()
    bitwise = torch.equal(got, want)
    if kind == "grad":
        c, r = ref.cosine(g, w), ref.rel_l2(g, w)
        assert c >= COSINE and r <= REL_L2, f"{name}: cosine {c:.7f}, relative L2 {r:.2e}"
        return f"{name}: bitwise {bitwise}, cosine {c:.7f}, relative L2 {r:.2e}"
    finite = torch.isfinite(w)
    assert torch.equal(finite, torch.isfinite(g)), f"{name}: infinities differ"
    tol = OUT_TOL if kind == "out" else LSE_TOL
    torch.testing.assert_close(
        g[finite], w[finite], atol=tol, rtol=tol, msg=lambda m: f"{name}: {m}"
    )
    err = (g[finite] - w[finite]).abs().max().item() if finite.any() else 0.0
    return f"{name}: bitwise {bitwise}, max abs error {err:.2e}"


KINDS = dict(out="out", lse="lse", index_lse="lse", dq="grad", dk="grad", dv="grad",
             dqi="grad", dki="grad")


def _plain(cu, x: dict, fragments: bool, topk=None) -> dict:
    """The plain msa_torch calls over the whole pack (``fragments``: identity fragment_indices,
    the layout of a CP1 rank), ``topk`` from its own indexer unless given."""
    dev = "cuda"
    cu_t = torch.tensor(cu, dtype=torch.int32, device=dev)
    frag = torch.arange(len(cu) - 1, dtype=torch.int32, device=dev) if fragments else None
    lens = [b - a for a, b in zip(cu, cu[1:])]
    ints = dict(total_k=cu[-1], total_rows=sum(-(-n // 128) for n in lens),
                max_seqlen_q=max(lens), max_seqlen_k=max(lens))
    r = {}
    own_topk, r["index_lse"] = indexer.forward(
        x["qi"], x["ki"], cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t, max_seqlen_q=max(lens),
        max_seqlen_kv=max(lens), fragment_indices=frag, deterministic=True,
    )
    r["topk"] = own_topk if topk is None else topk
    meta = attention.prepare(r["topk"], cu_t, cu_t, fragment_indices=frag, **ints)
    if topk is not None:
        r["index_lse"] = indexer.selection_lse(x["qi"], x["ki"], meta)
    r["own_topk"] = own_topk
    r["out"], r["lse"] = attention.forward(
        x["q"], x["k"], x["v"], meta, return_softmax_lse=True, deterministic=True
    )
    r["dq"], r["dk"], r["dv"] = attention.backward(
        x["q"], x["k"], x["v"], x["dout"], r["out"], r["lse"], meta, deterministic=True
    )
    r["dqi"], r["dki"] = kl.backward(
        x["q"], x["k"], r["lse"], x["qi"], x["ki"], r["index_lse"], meta
    )
    return r


@pytest.fixture
def nccl_world_1():
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(CASES))
def test_world_size_1_nccl_equals_the_plain_call(name, nccl_world_1):
    cu = CASES[name]
    x = _inputs(cu[-1], seed=1)
    plan = cp.CpPlan(cp.split_pack(cu, 1))  # the default (NCCL) group
    assert dist.get_backend() == "nccl"
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    got = {}
    got["topk"], got["index_lse"] = cp.indexer_forward(x["qi"], x["ki"], plan, deterministic=True)
    meta = cp.prepare(got["topk"], plan)
    q, k, v = (x[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out, lse = cp.attention_forward(q, k, v, meta, plan, return_softmax_lse=True,
                                    deterministic=True)
    out.backward(x["dout"])
    got.update(out=out.detach(), lse=lse, dq=q.grad, dk=k.grad, dv=v.grad)
    got["dqi"], got["dki"] = cp.kl_backward(x["q"], x["k"], lse, x["qi"], x["ki"],
                                            got["index_lse"], meta, plan)
    torch.cuda.synchronize()
    print(f"{name}: CP1 over NCCL {1e3 * (time.perf_counter() - t0):.1f} ms (first call)")
    same_layout = _plain(cu, x, fragments=True)
    for n in ["topk"] + list(KINDS):
        assert torch.equal(got[n], same_layout[n]), f"{name}: {n} differs from the plain call"
    varlen = _plain(cu, x, fragments=False)
    assert torch.equal(got["topk"], varlen["topk"]), f"{name}: top-k differs from varlen"
    for n, kind in KINDS.items():
        print(f"{name} vs varlen: " + _check_close(n, got[n], varlen[n], kind))
    with pytest.raises(ValueError, match="moves CUDA tensors only"):
        cp.attention_forward(x["q"].cpu(), x["k"], x["v"], meta, plan)


def _cp2_rank(m: cp.ChunkMap, x: dict):
    def run(comm):
        plan = cp.CpPlan(m, comm)
        idx = plan.local_token_index.cuda()
        loc = {n: t[idx].contiguous() for n, t in x.items()}
        r = {}
        r["topk"], r["index_lse"] = cp.indexer_forward(loc["qi"], loc["ki"], plan,
                                                       deterministic=True)
        meta = cp.prepare(r["topk"], plan)
        with torch.no_grad():
            r["out"], r["lse"] = cp.attention_forward(
                loc["q"], loc["k"], loc["v"], meta, plan, return_softmax_lse=True,
                deterministic=True,
            )
        r["dq"], r["dk"], r["dv"] = cp.attention_backward(
            loc["q"], loc["k"], loc["v"], loc["dout"], r["out"], r["lse"], meta, plan,
            deterministic=True,
        )
        r["dqi"], r["dki"] = cp.kl_backward(loc["q"], loc["k"], r["lse"], loc["qi"], loc["ki"],
                                            r["index_lse"], meta, plan)
        return idx, r

    return run


@pytest.mark.parametrize("name", sorted(CASES))
def test_cp2_emulated_on_one_gpu_equals_one_call(name):
    cu = CASES[name]
    t = cu[-1]
    x = _inputs(t, seed=2)
    m = cp.split_pack(cu, 2)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ranks = cp_emulation.run_ranks(2, _cp2_rank(m, x), "cuda")
    torch.cuda.synchronize()
    print(f"{name}: CP2 emulated {1e3 * (time.perf_counter() - t0):.1f} ms; rank layouts "
          + ", ".join(f"(T={m.rank_layout(r).total_q}, Tk={m.rank_layout(r).total_k}, "
                      f"B={m.rank_layout(r).batch})" for r in range(2)))
    got = {}
    for n in ["topk", "index_lse"]:
        got[n] = torch.empty((4, t, *ranks[0][1][n].shape[2:]), dtype=ranks[0][1][n].dtype,
                             device="cuda")
        for idx, r in ranks:
            got[n][:, idx] = r[n]
    for n in ("out", "lse", "dq", "dk", "dv", "dqi", "dki"):
        got[n] = torch.empty((t, *ranks[0][1][n].shape[1:]), dtype=ranks[0][1][n].dtype,
                             device="cuda")
        for idx, r in ranks:
            got[n][idx] = r[n]
    # The one call on the CP selection (so a near-tie in the indexer cannot fork the rest).
    one = _plain(cu, x, fragments=False, topk=got["topk"])
    for n, kind in KINDS.items():
        print(f"{name} CP2 vs one call: " + _check_close(n, got[n], one[n], kind))
    mismatch = (got["topk"] != one["own_topk"]).any(-1).sum().item()
    print(f"{name} CP2 vs one call: top-k rows that differ: {mismatch}")
    assert mismatch == 0, f"{name}: {mismatch} (head, query) top-k rows differ from one call"
