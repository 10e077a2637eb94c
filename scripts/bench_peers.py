#!/usr/bin/env python3
"""Peers for `msa bench`, timed in the same run on the same GPU with PyTorch.

    bench_peers.py OUT.jsonl [--iters N] [--warmup N] [--layouts BENCH.jsonl]

MSA's shapes throughout: bf16, head_dim 128, 64 query heads sharing 4 KV heads (GQA 16),
12,288 queries (one CP16 rank). Useful TFLOP/s use the MSA FLOP model on the pairs each peer
attends to (fwd = 2*(128+128)*64*pairs, bwd = 2.5 * fwd), so every rate is comparable with
`msa bench`'s:
  sdpa-flash / sdpa-cudnn  dense causal attention (torch SDPA's FlashAttention and cuDNN
                           backends) over 6 documents of 2,048 tokens (16 blocks each: the
                           work per query of a 16-block selection) and over one 12,288-token one
  flex-recent16            FlexAttention (Triton, what Hopper users run MSA with today) with a
                           block mask of each query's own 128-block and the 15 before it, causal
                           inside the own block: MSA's recent16 selection on one 12,288-token
                           document
  varlen-dense <case>      with --layouts (the JSON lines of `msa bench`): for every case whose
                           median document is under 1,024 tokens and whose longest is under 65,536
                           (there most MSA selections are the whole causal prefix, so MSA's work is
                           close to dense varlen causal attention; documents over 16 blocks give
                           the peer extra work),
                           torch's varlen attention (FlashAttention) over exactly its documents:
                           each fragment's queries against its document's keys up to the
                           fragment's end, causal bottom-right aligned. Its rate uses the case's
                           MSA FLOPs, so it compares with msa bench's forward/backward directly.
A peer that fails (backend missing, compile error) is reported with its error and skipped.
"""
import argparse
import inspect
import json
import statistics
import sys

import torch
import torch.nn.functional as F

H, HKV, D, BLOCK, TOPK = 64, 4, 128, 128, 16
T = 12288


def fwd_flops(pairs):
    return 2.0 * (D + D) * H * pairs


def time_ms(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        times.append((a, b))
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in times]


def tensors(batch, seq):
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda h: (0.2 * torch.randn(batch, h, seq, D, device="cuda", generator=g)).to(torch.bfloat16)
    q, k, v, do = mk(H), mk(HKV), mk(HKV), mk(H)
    return [x.requires_grad_() for x in (q, k, v)] + [do]


def measure(name, attn, q, k, v, do, pairs, args, note):
    out = attn(q, k, v)
    fwd = time_ms(lambda: attn(q, k, v), args.warmup, args.iters)
    bwd = time_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), args.warmup, args.iters)
    rows = []
    for stage, ms, flops in (("forward", fwd, fwd_flops(pairs)), ("backward", bwd, 2.5 * fwd_flops(pairs))):
        med = statistics.median(ms)
        rows.append({"peer": name, "stage": stage, "median_ms": med, "min_ms": min(ms),
                     "tflops": flops / med / 1e9, "pairs": pairs, "note": note, "ms": ms})
    return rows


def sdpa_peer(backend_name, backend, batch, seq, args):
    from torch.nn.attention import sdpa_kernel
    q, k, v, do = tensors(batch, seq)
    pairs = batch * seq * (seq + 1) // 2
    name = f"sdpa-{backend_name} {batch}x{seq} causal"

    def attn_gqa(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    try:
        attn_gqa(q, k, v)
        return measure(name, attn_gqa, q, k, v, do, pairs, args, "enable_gqa")
    except RuntimeError:
        # Backends without GQA take K/V expanded to 64 heads: same FLOPs, more K/V traffic.
        ke = k.detach().repeat_interleave(H // HKV, dim=1).requires_grad_()
        ve = v.detach().repeat_interleave(H // HKV, dim=1).requires_grad_()

        def attn(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        return measure(name, attn, q, ke, ve, do, pairs, args, "kv expanded to 64 heads")


def flex_peer(args):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def recent16(b, h, qi, ki):
        return (ki <= qi) & (ki // BLOCK > qi // BLOCK - TOPK)

    mask = create_block_mask(recent16, None, None, T, T, device="cuda", BLOCK_SIZE=BLOCK)
    compiled = torch.compile(flex_attention)
    q, k, v, do = tensors(1, T)
    attn = lambda q, k, v: compiled(q, k, v, block_mask=mask, enable_gqa=True)
    qpos = torch.arange(T)
    pairs = int((torch.minimum(qpos // BLOCK, torch.tensor(TOPK - 1)) * BLOCK + qpos % BLOCK + 1).sum())
    return measure("flex-recent16 1x12288", attn, q, k, v, do, pairs, args, "torch.compile(flex_attention)")


def short_document_cases(path):
    """Case records of a `msa bench` JSON file whose median document is under 1,024 tokens, one
    per case (the first pattern's record; the documents do not depend on the pattern)."""
    seen, cases = set(), []
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("record") != "case" or "cu_seqlens_q" not in r:
                continue
            key = (r["case_id"], r["rank"])
            if key in seen:
                continue
            seen.add(key)
            cu_q, cu_k, first = r["cu_seqlens_q"], r["cu_seqlens_k"], r["fragment_indices"]
            k_lens = [cu_k[b + 1] - cu_k[first[b]] for b in range(len(first))]
            docs = sorted(k_lens)
            median = docs[len(docs) // 2] if docs else 0
            # A document of more than 16 blocks makes the dense peer do work MSA does not (MSA
            # selects 16 of its blocks); one of 65,536 tokens or more makes it meaningless.
            if median < 1024 and docs[-1] < 65536:
                cases.append((r, k_lens, median))
    return cases


def varlen_peer(record, k_lens, median, args):
    from torch.nn.attention.varlen import varlen_attn

    cu_q, first = record["cu_seqlens_q"], record["fragment_indices"]
    q_lens = [cu_q[b + 1] - cu_q[b] for b in range(len(first))]
    g = torch.Generator(device="cuda").manual_seed(0)
    T, TK = sum(q_lens), sum(k_lens)
    mk = lambda n, h: (0.2 * torch.randn(n, h, D, device="cuda", generator=g)).to(torch.bfloat16)
    q, do = mk(T, H), mk(T, H)
    cu_sq = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_sk = torch.tensor([0] + list(torch.tensor(k_lens).cumsum(0)), dtype=torch.int32, device="cuda")
    max_q, max_k = max(q_lens), max(k_lens)
    # torch's varlen_attn spells causality as is_causal (2.9) or as a (-1, 0) window (later).
    params = inspect.signature(varlen_attn).parameters
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    note = "enable_gqa"
    k, v = mk(TK, HKV), mk(TK, HKV)
    try:
        varlen_attn(q, k, v, cu_sq, cu_sk, max_q, max_k, **causal)
    except RuntimeError:
        k, v = k.repeat_interleave(H // HKV, dim=1), v.repeat_interleave(H // HKV, dim=1)
        note = "kv expanded to 64 heads"
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    attn = lambda q, k, v: varlen_attn(q, k, v, cu_sq, cu_sk, max_q, max_k, **causal)
    pairs = record["sparse_attention_elements"]
    name = f"varlen-dense case{record['case_id']}/r{record['rank']}"
    return measure(name, attn, q, k, v, do, pairs, args,
                   f"torch varlen_attn, median document {median} tokens, {note}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layouts", help="msa bench JSON lines: add the dense varlen peer of every "
                    "short-document case in it")
    args = ap.parse_args()
    from torch.nn.attention import SDPBackend
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    peers = [
        lambda: sdpa_peer("flash", SDPBackend.FLASH_ATTENTION, 6, 2048, args),
        lambda: sdpa_peer("flash", SDPBackend.FLASH_ATTENTION, 1, T, args),
        lambda: sdpa_peer("cudnn", SDPBackend.CUDNN_ATTENTION, 6, 2048, args),
        lambda: sdpa_peer("cudnn", SDPBackend.CUDNN_ATTENTION, 1, T, args),
        lambda: flex_peer(args),
    ]
    if args.layouts:
        for r, k_lens, median in short_document_cases(args.layouts):
            peers.append(lambda r=r, k_lens=k_lens, median=median: varlen_peer(r, k_lens, median, args))
    failed = 0
    with open(args.out, "w") as f:
        for peer in peers:
            try:
                rows = peer()
            except Exception as e:  # a missing backend is a result, not a crash
                failed += 1
                print(f"peer failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}", flush=True)
                continue
            for r in rows:
                f.write(json.dumps(r) + "\n")
                print(f"  {r['peer']:<28} {r['stage']:<9} {r['median_ms']:9.3f} ms  "
                      f"{r['tflops']:7.1f} TFLOP/s  ({r['note']})", flush=True)
            torch.cuda.empty_cache()
    return 1 if failed == len(peers) else 0


if __name__ == "__main__":
    sys.exit(main())
