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
  flex-exact <case> <pattern>
                           with --layouts and --flex-exact: FlexAttention with MSA's exact
                           semantics on that row's documents and selection (recent16 or spread,
                           which depend only on positions; msa-workloads' patterns.rs): keys in a
                           workspace where every document starts 128-aligned, a block mask of the
                           selected blocks per 128-query block (blocks every query of it sees
                           whole marked full, the rest partial under a mask_mod of the per-query
                           selection and causality), the same MSA FLOPs as msa bench's row. One
                           key-workspace size for every row, so torch.compile compiles once.
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


def selection(pattern, local):
    """Document-local blocks a query of local block `local` selects (patterns.rs)."""
    n = min(local + 1, TOPK)
    if pattern == "recent16":
        return list(range(local + 1 - n, local + 1))
    if pattern == "spread":
        return [local] if n == 1 else [k * local // (n - 1) for k in range(n)]
    raise ValueError(f"pattern {pattern} is not a function of positions")


def workspace_blocks(record):
    """Each document's first block in a key workspace where documents start 128-aligned (by the
    document's first fragment), and the workspace's block count."""
    cu_k, first = record["cu_seqlens_k"], record["fragment_indices"]
    last = {f: b for b, f in enumerate(first)}  # a document's last fragment
    starts, nb = {}, 0
    for f in sorted(last):
        starts[f] = nb
        nb += -(-(cu_k[last[f] + 1] - cu_k[f]) // BLOCK)
    return starts, nb


def exact_layout(record, pattern):
    """Per query of the row: its document's first workspace block, its position in the document
    and its selected workspace blocks; the workspace's block count."""
    cu_q, cu_k, first = record["cu_seqlens_q"], record["cu_seqlens_k"], record["fragment_indices"]
    starts, nb = workspace_blocks(record)
    rows = []
    for b in range(len(first)):
        k_len, q_len = cu_k[b + 1] - cu_k[first[b]], cu_q[b + 1] - cu_q[b]
        base = starts[first[b]]
        for i in range(q_len):
            pos = k_len - q_len + i
            rows.append((base, pos, [base + j for j in selection(pattern, pos // BLOCK)]))
    return rows, nb


def exact_block_mask(rows, nb_ws, device, shared=None):
    """The BlockMask of `rows` over a key workspace of nb_ws blocks (T a multiple of 128). With
    `shared` (a dict kept across rows of one T and nb_ws) every mask uses the same mask_mod and
    the same selection tensors, refilled in place: torch.compile then compiles once, where a new
    closure per row would recompile per row."""
    from torch.nn.attention.flex_attention import BlockMask

    T = len(rows)
    sel = torch.zeros(T, nb_ws, dtype=torch.bool)
    kmax = torch.empty(T, dtype=torch.int64)
    for t, (base, pos, blocks) in enumerate(rows):
        sel[t, blocks] = True
        kmax[t] = base * BLOCK + pos  # the last key this query sees, in workspace rows
    qb = T // BLOCK
    own = (kmax // BLOCK).view(qb, BLOCK)
    any_q = sel.view(qb, BLOCK, nb_ws).any(1)
    # Full: every query of the q-block selected the block and sees all of it (below its own).
    blk = torch.arange(nb_ws).view(1, 1, nb_ws)
    full = (sel.view(qb, BLOCK, nb_ws) & (blk < own.unsqueeze(2))).all(1)
    partial = any_q & ~full

    def lists(m):
        counts = m.sum(1).to(torch.int32)
        order = torch.argsort((~m).to(torch.int8), dim=1, stable=True).to(torch.int32)
        return counts.view(1, 1, qb).to(device), order.view(1, 1, qb, nb_ws).to(device)

    if shared is None or "mask_mod" not in shared:
        sel_d, kmax_d = sel.to(device), kmax.to(device)

        def mask_mod(b, h, qi, ki):
            return sel_d[qi, ki // BLOCK] & (ki <= kmax_d[qi])

        if shared is not None:
            shared.update(sel=sel_d, kmax=kmax_d, mask_mod=mask_mod)
    else:
        shared["sel"].copy_(sel)
        shared["kmax"].copy_(kmax)
        mask_mod = shared["mask_mod"]

    kv_n, kv_i = lists(partial)
    full_n, full_i = lists(full)
    return BlockMask.from_kv_blocks(kv_n, kv_i, full_n, full_i, BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(T, nb_ws * BLOCK)), sel, kmax


def exact_records(path, patterns, limit):
    """One record per (case, rank, pattern) of a `msa bench` JSON file, patterns recent16/spread."""
    out, seen = [], set()
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("record") != "case" or r.get("pattern") not in patterns:
                continue
            key = (r["case_id"], r["rank"], r["pattern"])
            if key not in seen:
                seen.add(key)
                out.append(r)
    return out[:limit] if limit else out


def flex_exact_peers(records, args):
    """A peer per record, built when it runs; the key workspace has the largest row's size for
    every row, so torch.compile compiles once."""
    from torch.nn.attention.flex_attention import flex_attention

    nb_max = max(workspace_blocks(r)[1] for r in records)
    shared = {}

    def peer(r):
        if not shared:
            g = torch.Generator(device="cuda").manual_seed(0)
            kv = [(0.2 * torch.randn(1, HKV, nb_max * BLOCK, D, device="cuda", generator=g)).to(torch.bfloat16)
                  for _ in range(2)]
            shared.update(k=kv[0].requires_grad_(), v=kv[1].requires_grad_(), fn=torch.compile(flex_attention))
        rows, _ = exact_layout(r, r["pattern"])
        assert len(rows) % BLOCK == 0, "FlexAttention's 128-query blocks need T % 128 == 0"
        mask, _, _ = exact_block_mask(rows, nb_max, "cuda", shared)
        g = torch.Generator(device="cuda").manual_seed(1)
        q = (0.2 * torch.randn(1, H, len(rows), D, device="cuda", generator=g)).to(torch.bfloat16).requires_grad_()
        do = (0.2 * torch.randn(1, H, len(rows), D, device="cuda", generator=g)).to(torch.bfloat16)
        fn = shared["fn"]
        attn = lambda q, k, v: fn(q, k, v, block_mask=mask, enable_gqa=True)
        rows_out = measure(f"flex-exact case{r['case_id']}/r{r['rank']} {r['pattern']}", attn, q, shared["k"],
                           shared["v"], do, r["sparse_attention_elements"], args, "torch.compile(flex_attention)")
        # msa bench's time of the same row and stage, for the per-row ratio and the aggregate
        ours = {st["stage"]: st for st in r["stages"]}
        for row in rows_out:
            st = ours.get(row["stage"])
            row["weight"] = r.get("weight", 1.0)
            if st:
                row["msa_ms"] = st["median_ms"]
                row["note"] += f"; msa {st['useful_tflops']:.1f} TFLOP/s = {row['median_ms'] / st['median_ms']:.2f}x"
        return rows_out

    return [lambda r=r: peer(r) for r in records]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--layouts", help="msa bench JSON lines: add the dense varlen peer of every "
                    "short-document case in it")
    ap.add_argument("--flex-exact", type=int, default=0, metavar="N",
                    help="with --layouts: FlexAttention with MSA's exact semantics on the first N "
                    "recent16 / spread rows in it (0: none, -1: all)")
    args = ap.parse_args()
    import torch._functorch.config as functorch_config
    from torch.nn.attention import SDPBackend

    # measure() replays one backward graph (retain_graph=True). With the exact peers' mask_mod
    # and its captured tensors, AOTAutograd donates saved buffers to the compiled backward and
    # then refuses a retained graph (run 50); donation only saves memory.
    functorch_config.donated_buffer = False
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
        if args.flex_exact:
            records = exact_records(args.layouts, ("recent16", "spread"), max(args.flex_exact, 0))
            if records:
                peers.extend(flex_exact_peers(records, args))
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
    # MSA's weighted aggregate (sum w*flops / sum w*ms) of the exact FlexAttention rows and of
    # msa bench's times of the same rows.
    agg = {}
    with open(args.out) as f:
        for line in f:
            r = json.loads(line)
            if r["peer"].startswith("flex-exact") and "msa_ms" in r:
                key = (r["peer"].rsplit(" ", 1)[1], r["stage"])
                a = agg.setdefault(key, [0.0, 0.0, 0.0, 0])
                flops = r["tflops"] * r["median_ms"] * 1e9
                a[0] += r["weight"] * flops
                a[1] += r["weight"] * r["median_ms"]
                a[2] += r["weight"] * r["msa_ms"]
                a[3] += 1
    for (pattern, stage), (wf, wms, wmsa, n) in sorted(agg.items()):
        flex, msa = wf / wms / 1e9, wf / wmsa / 1e9
        print(f"  flex-exact aggregate {pattern:<9} {stage:<9} {n} rows: FlexAttention {flex:6.1f}, "
              f"msa {msa:6.1f} TFLOP/s = {msa / flex:.2f}x", flush=True)
    return 1 if failed == len(peers) else 0


if __name__ == "__main__":
    sys.exit(main())
