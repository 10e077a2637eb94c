"""msa_torch.cp over real NCCL on 2+ GPUs of one host (issue 14's acceptance run), one process per
GPU:

    PYTHONPATH=/tmp/site torchrun --nproc-per-node 2 crates/msa-torch/tests/cp_two_gpus.py

For real 196,608-token packs (data/cases/cp16_192k_dev.jsonl: the pack with the longest document
and the one with the shortest median; ``--all`` for all 48) split over the world by the CP
dispatch rule: every rank runs the CP calls (indexer, prepare, attention forward, backward by
autograd, KL) on its rows; rank 0 assembles the outputs and gradients and checks them against
one GPU running the whole pack on the same top-k, with MSA's strict tolerances (bitwise flags
printed), and checks the top-k against the one call's own indexer. Then it times, per rank, the
all-gather of k, v, ki (+ packing), the local kernels, the reduce-scatter of dk, dv, dki, and
the one-GPU call. Prints one PASS/FAIL line per pack and exits non-zero on a failure."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from msa_torch import attention, cp, indexer, kl  # noqa: E402

import test_cp_gpu as checks  # noqa: E402  (the one-GPU call and the strict checks)

REPS = 10


def _gather_rows(plan: cp.CpPlan, t: torch.Tensor, token_dim: int = 0) -> torch.Tensor | None:
    """The pack's rows of a per-rank tensor, assembled on rank 0 (``None`` elsewhere)."""
    local = t.detach().movedim(token_dim, 0).contiguous()
    every = local.new_empty((plan.comm.size() * local.shape[0], *local.shape[1:]))
    dist.all_gather_into_tensor(every, local)
    if plan.rank != 0:
        return None
    full = torch.empty_like(every)
    n = local.shape[0]
    for r in range(plan.comm.size()):
        full[plan.chunk_map.local_token_index(r).to(full.device)] = every[r * n : (r + 1) * n]
    return full.movedim(0, token_dim).contiguous()


def _ms(fn) -> float:
    """Median milliseconds of ``fn`` over REPS calls (CUDA events, ranks lined up first)."""
    times = []
    for _ in range(REPS):
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def run_case(name: str, cu: list[int]) -> bool:
    rank = dist.get_rank()
    x = checks._inputs(cu[-1], seed=3)  # the same seed on every GPU: the same pack
    plan = cp.CpPlan(cp.split_pack(cu, dist.get_world_size()))
    idx = plan.local_token_index.cuda()
    loc = {n: t[idx].contiguous() for n, t in x.items()}
    got = {}
    got["topk"], got["index_lse"] = cp.indexer_forward(loc["qi"], loc["ki"], plan,
                                                       deterministic=True)
    meta = cp.prepare(got["topk"], plan)
    q, k, v = (loc[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out, lse = cp.attention_forward(q, k, v, meta, plan, return_softmax_lse=True,
                                    deterministic=True)
    out.backward(loc["dout"])
    got.update(out=out.detach(), lse=lse.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    got["dqi"], got["dki"] = cp.kl_backward(loc["q"], loc["k"], lse, loc["qi"], loc["ki"],
                                            got["index_lse"], meta, plan)
    full = {n: _gather_rows(plan, t, 1 if n in ("topk", "index_lse") else 0)
            for n, t in got.items()}

    ok = True
    if rank == 0:
        one = checks._plain(cu, x, fragments=False, topk=full["topk"])
        for n, kind in checks.KINDS.items():
            try:
                print(f"{name} CP{plan.comm.size()} vs one GPU: "
                      + checks._check_close(n, full[n], one[n], kind), flush=True)
            except AssertionError as e:
                ok = False
                print(f"{name}: FAIL {e}", flush=True)
        mismatch = (full["topk"] != one["own_topk"]).any(-1).sum().item()
        print(f"{name}: top-k rows that differ from the one GPU's indexer: {mismatch}")
        ok = ok and mismatch == 0
        del one

    # Timings: communication beside the kernels, per rank.
    with torch.no_grad():
        kp, vp, kip = plan.gather(loc["k"], loc["v"], loc["ki"])
        lay = plan.layout_kwargs(idx.device)
        o, lse_p = attention.forward(loc["q"], kp, vp, meta, return_softmax_lse=True)
        _, dkp, dvp = attention.backward(loc["q"], kp, vp, loc["dout"], o, lse_p, meta)
        _, dkip = kl.backward(loc["q"], kp, lse_p, loc["qi"], kip, got["index_lse"], meta)

        def kernels():
            indexer.forward(loc["qi"], kip, cu_seqlens_q=lay["cu_seqlens_q"],
                            cu_seqlens_kv=lay["cu_seqlens_k"], max_seqlen_q=lay["max_seqlen_q"],
                            max_seqlen_kv=lay["max_seqlen_k"],
                            fragment_indices=lay["fragment_indices"])
            m = attention.prepare_unchecked(got["topk"], **lay)
            o2, l2 = attention.forward(loc["q"], kp, vp, m, return_softmax_lse=True)
            attention.backward(loc["q"], kp, vp, loc["dout"], o2, l2, m)
            kl.backward(loc["q"], kp, l2, loc["qi"], kip, got["index_lse"], m)

        cu_t = torch.tensor(cu, dtype=torch.int32, device="cuda")
        lens = [b - a for a, b in zip(cu, cu[1:])]
        whole = dict(total_k=cu[-1], total_rows=sum(-(-n // 128) for n in lens),
                     max_seqlen_q=max(lens), max_seqlen_k=max(lens))

        def one_gpu():
            tk, il = indexer.forward(x["qi"], x["ki"], cu_seqlens_q=cu_t, cu_seqlens_kv=cu_t,
                                     max_seqlen_q=max(lens), max_seqlen_kv=max(lens))
            m = attention.prepare_unchecked(tk, cu_t, cu_t, **whole)
            o2, l2 = attention.forward(x["q"], x["k"], x["v"], m, return_softmax_lse=True)
            attention.backward(x["q"], x["k"], x["v"], x["dout"], o2, l2, m)
            kl.backward(x["q"], x["k"], l2, x["qi"], x["ki"], il, m)

        t = torch.tensor([
            _ms(lambda: plan.gather(loc["k"], loc["v"], loc["ki"])),
            _ms(kernels),
            _ms(lambda: plan.reduce_scatter(dkp, dvp, dkip)),
            _ms(one_gpu),
        ], device="cuda")
    every = torch.empty(plan.comm.size() * 4, device="cuda")
    dist.all_gather_into_tensor(every, t)
    if rank == 0:
        for r, (ag, ker, rs, one_ms) in enumerate(every.view(-1, 4).tolist()):
            lay_r = plan.chunk_map.rank_layout(r)
            print(f"{name} rank {r} (T={lay_r.total_q}, Tk={lay_r.total_k}): all-gather k,v,ki "
                  f"{ag:.2f} ms, kernels (indexer+prepare+fwd+bwd+KL) {ker:.2f} ms, "
                  f"reduce-scatter dk,dv,dki {rs:.2f} ms; the whole pack on one GPU "
                  f"{one_ms:.2f} ms")
    verdict = torch.tensor([int(ok)], device="cuda")
    dist.broadcast(verdict, 0)
    if rank == 0:
        print(f"{name}: {'PASS' if verdict.item() else 'FAIL'}", flush=True)
    return bool(verdict.item())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="every dev pack, not two")
    args = ap.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    try:
        if args.all:
            lines = checks.DEV_MANIFEST.read_text().splitlines()
            cases = {f"case{c['case_id']}": c["cu_seqlens"]
                     for c in map(json.loads, filter(str.strip, lines))}
        else:
            cases = checks.CASES
        results = [run_case(n, cu) for n, cu in cases.items()]
    finally:
        dist.destroy_process_group()
    if dist.is_available() and int(os.environ.get("RANK", 0)) == 0:
        print(f"cp_two_gpus: {'PASS' if all(results) else 'FAIL'} ({sum(results)}/{len(results)})")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
