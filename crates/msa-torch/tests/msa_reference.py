"""Test helpers: small varlen / CP-fragment layouts, top-k selections and a dense fp32 PyTorch
reference of the MSA v1 contract (attention forward and backward, indexer, selection LSE, KL
backward), written from the contract (shared/spec/msa-v1-contract.md §2-3), independent of
msa-rs.

A layout is a dict: cu_q, cu_k (lists), frag (list or None) and the integers prepare takes.
Fragment b: k_base = cu_k[frag[b]], klen = cu_k[b+1] - k_base, qlen = cu_q[b+1] - cu_q[b];
local query i sits at key position p = klen - qlen + i; blocks are document-local.
"""

from __future__ import annotations

import math

import torch

SCALE = 128**-0.5
Q_HEADS, KV_HEADS, D, TOPK, BLOCK = 64, 4, 128, 16, 128


def layout(cu_q, cu_k, frag=None):
    b = len(cu_q) - 1
    first = frag if frag is not None else list(range(b))
    klens = [cu_k[i + 1] - cu_k[first[i]] for i in range(b)]
    qlens = [cu_q[i + 1] - cu_q[i] for i in range(b)]
    return {
        "cu_q": list(cu_q),
        "cu_k": list(cu_k),
        "frag": None if frag is None else list(frag),
        "first": list(first),
        "klens": klens,
        "qlens": qlens,
        "total_q": cu_q[-1],
        "total_k": cu_k[-1],
        "total_rows": sum(-(-kl // BLOCK) for kl in klens),
        "max_seqlen_q": max(qlens),
        "max_seqlen_k": max(klens),
    }


# Three documents, none a multiple of 128; in the second only the last 50 keys are queries.
VARLEN = layout([0, 300, 350, 863], [0, 300, 377, 890])
# CP fragments: document A (700 keys stored once) has two fragments on this rank, positions
# [100, 300) and [500, 700); document B (150 keys) is whole; MSA's example (32 queries at
# 96..127 over 128 keys, then 32 at 224..255 over 256 keys, sharing the first block) follows.
FRAGMENTS = layout(
    [0, 200, 400, 550, 582, 614],
    [0, 300, 700, 850, 978, 1106],
    [0, 0, 2, 3, 3],
)


def device_layout(lay, device):
    i32 = dict(dtype=torch.int32, device=device)
    return {
        "cu_seqlens_q": torch.tensor(lay["cu_q"], **i32),
        "cu_seqlens_k": torch.tensor(lay["cu_k"], **i32),
        "fragment_indices": None if lay["frag"] is None else torch.tensor(lay["frag"], **i32),
    }


def prepare_kwargs(lay):
    return dict(
        total_k=lay["total_k"],
        total_rows=lay["total_rows"],
        max_seqlen_q=lay["max_seqlen_q"],
        max_seqlen_k=lay["max_seqlen_k"],
    )


def positions(lay, b):
    return [lay["klens"][b] - lay["qlens"][b] + i for i in range(lay["qlens"][b])]


_TOPK_CACHE = {}


def random_topk(lay, seed, empty_fraction=0.0, pad_fraction=0.3):
    """int32 [4, T, 16] (CPU): per (head, query) a random set of distinct visible blocks (the
    local block usually among them), in random slots, -1 elsewhere; ``empty_fraction`` of the
    rows all -1 (an empty selection). Memoized (a fresh copy each call)."""
    key = (id(lay), seed, empty_fraction, pad_fraction)
    if key not in _TOPK_CACHE:
        _TOPK_CACHE[key] = _random_topk(lay, seed, empty_fraction, pad_fraction)
    return _TOPK_CACHE[key].clone()


def _random_topk(lay, seed, empty_fraction, pad_fraction):
    g = torch.Generator().manual_seed(seed)
    t = lay["total_q"]
    topk = torch.full((KV_HEADS, t, TOPK), -1, dtype=torch.int32)
    for b in range(len(lay["qlens"])):
        for i, p in enumerate(positions(lay, b)):
            q = lay["cu_q"][b] + i
            local = p // BLOCK
            for h in range(KV_HEADS):
                if torch.rand((), generator=g).item() < empty_fraction:
                    continue
                visible = local + 1
                most = min(visible, TOPK)
                n = most if torch.rand((), generator=g).item() > pad_fraction else int(
                    torch.randint(1, most + 1, (), generator=g)
                )
                others = torch.randperm(local, generator=g)[: max(n - 1, 0)].tolist()
                keep_local = torch.rand((), generator=g).item() < 0.9 or n == 1
                chosen = others + [local] if keep_local else (
                    torch.randperm(local, generator=g)[:n].tolist() if local >= n else others + [local]
                )
                slots = torch.randperm(TOPK, generator=g)[: len(chosen)]
                topk[h, q, slots] = torch.tensor(chosen, dtype=torch.int32)
    return topk


def recent_topk(lay):
    """MSA's benchmark pattern: the most recent min(visible, 16) blocks, ascending, local last."""
    t = lay["total_q"]
    topk = torch.full((KV_HEADS, t, TOPK), -1, dtype=torch.int32)
    for b in range(len(lay["qlens"])):
        for i, p in enumerate(positions(lay, b)):
            local = p // BLOCK
            ids = list(range(max(0, local - TOPK + 1), local + 1))
            topk[:, lay["cu_q"][b] + i, : len(ids)] = torch.tensor(ids, dtype=torch.int32)
    return topk


def _token_mask(lay, topk, b):
    """bool [4, qlen, klen]: key j of fragment b is in the token set of (head, query)."""
    kl, ql, q0 = lay["klens"][b], lay["qlens"][b], lay["cu_q"][b]
    nblocks = -(-kl // BLOCK)
    sel = topk[:, q0 : q0 + ql, :].long()  # [4, ql, 16]
    valid = (sel >= 0) & (sel < nblocks)
    blocks = torch.zeros(KV_HEADS, ql, nblocks + 1, dtype=torch.bool, device=topk.device)
    blocks.scatter_(2, torch.where(valid, sel, nblocks), True)
    blocks = blocks[..., :nblocks]
    j = torch.arange(kl, device=topk.device)
    p = torch.tensor(positions(lay, b), device=topk.device)
    return blocks[..., j // BLOCK] & (j[None, :] <= p[:, None])[None]


def attention(lay, topk, q, k, v):
    """fp32 out [T, 64, 128] and lse [T, 64] (-inf and 0 for an empty set), differentiable."""
    outs, lses = [], []
    for b in range(len(lay["qlens"])):
        kl, ql, q0 = lay["klens"][b], lay["qlens"][b], lay["cu_q"][b]
        kb = lay["cu_k"][lay["first"][b]]
        qb = q[q0 : q0 + ql].view(ql, KV_HEADS, 16, D)
        kk, vv = k[kb : kb + kl], v[kb : kb + kl]  # [kl, 4, D]
        s = torch.einsum("qghd,kgd->qghk", qb, kk) * SCALE  # [ql, 4, 16, kl]
        mask = _token_mask(lay, topk, b).permute(1, 0, 2)[:, :, None, :]  # [ql, 4, 1, kl]
        s = s.masked_fill(~mask, -math.inf)
        # Empty sets: logsumexp over zeros instead of -inf (no NaN in its backward), then -inf.
        nonempty = mask.any(-1)  # [ql, 4, 1]
        lse = torch.logsumexp(torch.where(nonempty[..., None], s, torch.zeros_like(s)), dim=-1)
        safe = torch.where(nonempty, lse, torch.zeros_like(lse))
        lse = torch.where(nonempty, lse, torch.full_like(lse, -math.inf))  # [ql, 4, 16]
        pr = torch.where(mask, torch.exp(s - safe[..., None]), torch.zeros_like(s))
        o = torch.einsum("qghk,kgd->qghd", pr, vv)
        outs.append(o.reshape(ql, Q_HEADS, D))
        lses.append(lse.reshape(ql, Q_HEADS))
    return torch.cat(outs), torch.cat(lses)


def index_scores(lay, qi, ki, b):
    """fp32 [4, qlen, klen] token scores qi.ki / sqrt(128) of fragment b (causal: -inf after p)."""
    kl, ql, q0 = lay["klens"][b], lay["qlens"][b], lay["cu_q"][b]
    kb = lay["cu_k"][lay["first"][b]]
    s = torch.einsum("qgd,kd->gqk", qi[q0 : q0 + ql].float(), ki[kb : kb + kl, 0].float()) * SCALE
    j = torch.arange(kl, device=qi.device)
    p = torch.tensor(positions(lay, b), device=qi.device)
    return s.masked_fill(~(j[None, :] <= p[:, None])[None], -math.inf)


def selection_lse(lay, topk, qi, ki):
    """fp32 [4, T]: logsumexp of qi.ki / sqrt(128) over each token set (-inf when empty)."""
    out = []
    for b in range(len(lay["qlens"])):
        s = index_scores(lay, qi, ki, b)
        s = s.masked_fill(~_token_mask(lay, topk, b), -math.inf)
        out.append(torch.logsumexp(s, dim=-1))
    return torch.cat(out, dim=1)


def check_indexer(lay, qi, ki, topk, lse, slack=5e-3, lse_atol=2e-3):
    """MSA's indexer check: the local block at slot count-1, -1 after it, distinct non-local
    blocks below it whose block scores are at least the count-1'th best minus ``slack``, and the
    LSE of the actual selection within ``lse_atol``. Returns a list of failure strings."""
    failures = []
    topk_cpu = topk.cpu()
    for b in range(len(lay["qlens"])):
        s = index_scores(lay, qi, ki, b)  # [4, ql, kl]
        kl, ql, q0 = lay["klens"][b], lay["qlens"][b], lay["cu_q"][b]
        nblocks = -(-kl // BLOCK)
        pad = nblocks * BLOCK - kl
        sp = torch.nn.functional.pad(s, (0, pad), value=-math.inf)
        bmax = sp.view(KV_HEADS, ql, nblocks, BLOCK).amax(-1).cpu()  # [4, ql, nb]
        for i, p in enumerate(positions(lay, b)):
            local = p // BLOCK
            count = min(local + 1, TOPK)
            for h in range(KV_HEADS):
                row = topk_cpu[h, q0 + i].tolist()
                where = f"head {h} query {q0 + i}"
                if row[count - 1] != local or any(x != -1 for x in row[count:]):
                    failures.append(f"{where}: {row} (local {local}, count {count})")
                    continue
                nonlocal_ids = row[: count - 1]
                if len(set(nonlocal_ids)) != len(nonlocal_ids) or any(
                    not 0 <= x < local for x in nonlocal_ids
                ):
                    failures.append(f"{where}: bad non-local ids {nonlocal_ids}")
                    continue
                if nonlocal_ids:
                    scores = bmax[h, i, :local]
                    kth = torch.sort(scores, descending=True).values[count - 2].item()
                    worst = min(scores[x].item() for x in nonlocal_ids)
                    if worst < kth - slack:
                        failures.append(f"{where}: selected score {worst} < {kth} - {slack}")
    ref_lse = selection_lse(lay, topk, qi, ki)
    finite = torch.isfinite(ref_lse)
    if not torch.equal(finite, torch.isfinite(lse)):
        failures.append("indexer lse: infinities differ")
    else:
        err = (lse[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
        if err > lse_atol:
            failures.append(f"indexer lse: max abs error {err} > {lse_atol}")
    return failures


def kl_backward(lay, topk, q, k, teacher_lse, qi, ki, indexer_lse, loss_coeff=1.0):
    """fp32 (dqi [T, 4, 128], dki [Tk, 1, 128]) of contract §3.2, dz rounded to bf16."""
    t = lay["total_q"]
    grad_scale = SCALE * loss_coeff / (4 * max(t, 1))
    dqi = torch.zeros(t, KV_HEADS, D, dtype=torch.float32, device=q.device)
    dki = torch.zeros(lay["total_k"], 1, D, dtype=torch.float32, device=q.device)
    for b in range(len(lay["qlens"])):
        kl, ql, q0 = lay["klens"][b], lay["qlens"][b], lay["cu_q"][b]
        kb = lay["cu_k"][lay["first"][b]]
        mask = _token_mask(lay, topk, b)  # [4, ql, kl]
        qb = q[q0 : q0 + ql].float().view(ql, KV_HEADS, 16, D)
        kk = k[kb : kb + kl].float()
        s = torch.einsum("qghd,kgd->gqhk", qb, kk) * SCALE  # [4, ql, 16, kl]
        tl = teacher_lse[q0 : q0 + ql].view(ql, KV_HEADS, 16).permute(1, 0, 2)[..., None]
        teacher = torch.where(mask[:, :, None, :], torch.exp(s - tl), torch.zeros_like(s)).mean(2)
        z = torch.einsum("qgd,kd->gqk", qi[q0 : q0 + ql].float(), ki[kb : kb + kl, 0].float())
        il = indexer_lse[:, q0 : q0 + ql][..., None]
        student = torch.where(mask, torch.exp(z * SCALE - il), torch.zeros_like(z))
        dz = (student - teacher).to(torch.bfloat16).float()  # [4, ql, kl]
        dqi[q0 : q0 + ql] += grad_scale * torch.einsum("gqk,kd->qgd", dz, ki[kb : kb + kl, 0].float())
        dki[kb : kb + kl, 0] += grad_scale * torch.einsum("gqk,qgd->kd", dz, qi[q0 : q0 + ql].float())
    return dqi, dki


def cosine(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    denom = a.norm() * b.norm()
    if denom == 0:
        return 1.0 if a.norm() == b.norm() else 0.0
    return (a @ b / denom).item()


def rel_l2(a, b):
    a, b = a.double().flatten(), b.double().flatten()
    nb = b.norm()
    if nb == 0:
        return a.norm().item()
    return ((a - b).norm() / nb).item()


# ---------------------------------------------------------------------------------------------
# real ranks: vectorized selections and a gathering reference (documents of up to 196K keys,
# where the dense reference above would need terabytes)


def query_coords(lay, device):
    """int64 ``[T]`` tensors of each query: its document's first packed K row, its document's
    key count, and its position in the document."""
    qlens = torch.tensor(lay["qlens"], dtype=torch.int64)
    frag = torch.repeat_interleave(torch.arange(len(qlens)), qlens)
    kbase = torch.tensor([lay["cu_k"][f] for f in lay["first"]], dtype=torch.int64)[frag]
    klen = torch.tensor(lay["klens"], dtype=torch.int64)[frag]
    i = torch.arange(lay["total_q"]) - torch.tensor(lay["cu_q"][:-1], dtype=torch.int64)[frag]
    pos = klen - qlens[frag] + i
    return kbase.to(device), klen.to(device), pos.to(device)


def recent16_topk(lay, device):
    """:func:`recent_topk` vectorized (MSA's ``make_torch_topk``: the n = min(L+1, 16) most
    recent blocks, ascending, then -1), int32 ``[4, T, 16]`` on ``device``."""
    _, _, pos = query_coords(lay, device)
    local = pos // BLOCK
    n = (local + 1).clamp(max=TOPK)
    s = torch.arange(TOPK, device=device)
    row = torch.where(s < n[:, None], local[:, None] - n[:, None] + 1 + s, -1)
    return row[None].expand(KV_HEADS, -1, -1).to(torch.int32).contiguous()


def random16_topk(lay, seed, device):
    """The ``random`` pattern of msa-workloads (patterns.rs): per (head, query) n - 1 distinct
    uniform blocks of [0, L) in draw order, then the local block L, then -1; int32
    ``[4, T, 16]``, drawn on ``device`` from ``seed`` (not the Rust generator's stream)."""
    _, _, pos = query_coords(lay, device)
    local = pos // BLOCK
    n = (local + 1).clamp(max=TOPK)
    width = max(int(local.max().item()) if local.numel() else 0, TOPK - 1)
    g = torch.Generator(device=device).manual_seed(seed)
    keys = torch.rand(KV_HEADS, local.numel(), width, generator=g, device=device)
    blocks = torch.arange(width, device=device)
    keys = keys.masked_fill(blocks >= local[:, None], 2.0)  # only [0, L) can be drawn
    picks = keys.topk(TOPK - 1, dim=-1, largest=False).indices  # smallest keys: a random order
    s = torch.arange(TOPK, device=device)
    drawn = picks.gather(-1, s.clamp(max=TOPK - 2).expand(KV_HEADS, local.numel(), -1))
    last = torch.where(s == n[:, None] - 1, local[:, None], -1)
    row = torch.where(s < n[:, None] - 1, drawn, last)
    return row.to(torch.int32).contiguous()


def load_real_ranks(path):
    """``{name: (layout, record)}`` of tests/data/real_ranks.jsonl (written by
    tests/real_ranks.rs from msa-workloads' CP16 split of the development manifest); the name is
    ``c{case_id}r{rank}``."""
    import json

    ranks = {}
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            lay = layout(d["cu_seqlens_q"], d["cu_seqlens_k"], d["fragment_indices"])
            ranks[f"c{d['case_id']}r{d['rank']}"] = (lay, d)
    return ranks


def checksum(topk):
    """tests/real_ranks.rs's checksum of a flat selection: sum_i (v_i + 2) * ((i * 2654435761)
    mod 2^31), in int64."""
    v = topk.flatten().long()
    i = torch.arange(v.numel(), dtype=torch.int64, device=v.device)
    return int(((v + 2) * ((i * 2654435761) % (1 << 31))).sum().item())


def sparse_attention(lay, topk, q, k, v, dout, chunk=256):
    """fp32 ``(out [T, 64, 128], lse [T, 64], dq, dk, dv, used [Tk, 4])`` of contract §2 by
    gathering each query's selected keys (at most 16 · 128 per kv head), ``chunk`` queries at a
    time: the same function as :func:`attention` and its autograd backward (checked against them
    on the small layouts), in memory O(chunk · 2048 · 128). ``used`` marks the packed keys some
    query selected (the others get exact-zero dk, dv)."""
    device = q.device
    t, tk = q.shape[0], k.shape[0]
    kbase, klen, pos = query_coords(lay, device)
    k32, v32 = k.float(), v.float()
    out = torch.zeros(t, Q_HEADS, D, device=device)
    lse = torch.full((t, Q_HEADS), -math.inf, device=device)
    dq = torch.zeros(t, Q_HEADS, D, device=device)
    dk = torch.zeros(tk, KV_HEADS, D, device=device)
    dv = torch.zeros(tk, KV_HEADS, D, device=device)
    used = torch.zeros(tk, KV_HEADS, dtype=torch.bool, device=device)
    j = torch.arange(BLOCK, device=device)
    for c0 in range(0, t, chunk):
        c1 = min(c0 + chunk, t)
        qc = q[c0:c1].float().view(c1 - c0, KV_HEADS, 16, D)
        doc = dout[c0:c1].float().view(c1 - c0, KV_HEADS, 16, D)
        for g in range(KV_HEADS):
            sel = topk[g, c0:c1].long()  # [C, 16]
            key = (sel[..., None] * BLOCK + j).flatten(1)  # [C, 2048] document-local keys
            ok = (sel[..., None] >= 0).expand(-1, -1, BLOCK).flatten(1)
            ok &= (key < klen[c0:c1, None]) & (key <= pos[c0:c1, None])
            rows = torch.where(ok, kbase[c0:c1, None] + key, 0)  # packed K rows
            kk, vv = k32[rows, g], v32[rows, g]  # [C, 2048, D]
            s = torch.einsum("chd,ckd->chk", qc[:, g], kk) * SCALE  # [C, 16, 2048]
            s = s.masked_fill(~ok[:, None, :], -math.inf)
            nonempty = ok.any(-1)  # [C]
            m = torch.logsumexp(torch.where(nonempty[:, None, None], s, 0.0), dim=-1)  # [C, 16]
            p = torch.where(ok[:, None, :], torch.exp(s - m[..., None]), 0.0)
            o = torch.einsum("chk,ckd->chd", p, vv)
            dp = torch.einsum("chd,ckd->chk", doc[:, g], vv)
            delta = (doc[:, g] * o).sum(-1)  # [C, 16]
            ds = p * (dp - delta[..., None])
            heads = slice(16 * g, 16 * g + 16)
            out[c0:c1, heads] = o
            lse[c0:c1, heads] = torch.where(nonempty[:, None], m, -math.inf)
            dq[c0:c1, heads] = torch.einsum("chk,ckd->chd", ds, kk) * SCALE
            flat = rows[ok]
            dk[:, g].index_add_(0, flat, (torch.einsum("chk,chd->ckd", ds, qc[:, g]) * SCALE)[ok])
            dv[:, g].index_add_(0, flat, torch.einsum("chk,chd->ckd", p, doc[:, g])[ok])
            used[flat, g] = True
    return out, lse, dq, dk, dv, used
