"""CPU tests of msa_torch.cp (context parallelism), no GPU:

- the split reproduces crates/msa-workloads' (its hand-checked cases, MSA's CP16 sanity check,
  the 48 real dev packs against a digest of the Rust split, random packs) and bad chunk maps
  are refused;
- with the gloo backend over 4 spawned processes (CP4 on the world group, CP2 on the groups
  {0, 2} and {1, 3}), the CP wrapper around the fp32 reference of msa_reference.py (injected as
  ``local_ops``) gives the whole-pack reference's outputs and gradients (indexer top-k and LSE,
  attention out and LSE, dq, dk, dv by autograd and explicitly, the KL's dqi, dki) on small
  real-shaped packs: documents not multiples of 128, documents spanning chunks, several
  documents per chunk;
- argument errors (wrong world size, rows, metadata, disagreeing ranks)."""

from __future__ import annotations

import datetime
import hashlib
import json
import pathlib
import random
import re

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from msa_torch import cp

import cp_reference as cpref
import msa_reference as ref

ROOT = pathlib.Path(__file__).resolve().parents[3]
DEV_MANIFEST = ROOT / "data" / "cases" / "cp16_192k_dev.jsonl"

# ---------------------------------------------------------------------------------------------
# the split (the cases of crates/msa-workloads/src/cp.rs)


def test_two_rank_split_is_hand_checked():
    cu = [0, 3000, 4096]
    assert cp.chunk_workloads(cu, 1024) == [524_800, 1_573_376, 2_405_952, 598_528]
    m = cp.split_pack(cu, 2, 1024)
    r0, r1 = m.rank_layout(0), m.rank_layout(1)
    assert r0.chunks == (0, 2)
    assert r0.cu_seqlens_q == (0, 1024, 1976, 2048)
    assert r0.cu_seqlens_k == (0, 1024, 3000, 3072)
    assert r0.fragment_indices == (0, 0, 2)
    assert r0.kv_source_ranges == ((0, 3000), (3000, 3072))
    assert r0.fragments[2] == cp.Fragment(doc=1, local_begin=0, local_end=72, global_begin=3000)
    assert r1.chunks == (1, 3)
    assert r1.cu_seqlens_q == (0, 1024, 2048)
    assert r1.cu_seqlens_k == (0, 2048, 3144)
    assert r1.fragment_indices == (0, 1)
    assert r1.kv_source_ranges == ((0, 2048), (3000, 4096))
    # Rank 1's packed K/V: document 0's keys [0, 2048) come from rank 0's chunk 0 (gathered
    # rows 0..1023) and its own chunk 1 (rows 2048..3071); document 1's [3000, 4096) from rank
    # 0's chunk 2 (rows 1024 + 952..1023) and its own chunk 3 (rows 3072..4095).
    idx = m.gathered_kv_index(1).tolist()
    assert idx == (
        list(range(0, 1024)) + list(range(2048, 3072)) + list(range(1024 + 952, 2048))
        + list(range(3072, 4096))
    )
    assert m.local_token_index(0).tolist() == list(range(0, 1024)) + list(range(2048, 3072))


def test_single_document_cp16_matches_the_readme_sanity_check():
    m = cp.split_pack([0, 196_608], 16)
    r11 = m.rank_layout(11)
    assert r11.chunks == (11, 20, 43, 52, 75, 84, 107, 116, 139, 148, 171, 180)
    assert (r11.batch, r11.total_k, r11.total_rows) == (12, 185_344, 9_264)
    assert r11.fragment_indices == (0,) * 12
    assert r11.kv_source_ranges == ((0, 185_344),)
    r15 = m.rank_layout(15)
    assert r15.chunks[:4] == (15, 16, 47, 48)
    assert (r15.batch, r15.total_k, r15.total_rows) == (6, 181_248, 4_656)
    assert all(f.local_end - f.local_begin == 2048 for f in r15.fragments)
    assert (r15.max_seqlen_q, r15.max_seqlen_k) == (2048, 181_248)
    assert r15.fragments[0] == cp.Fragment(0, 15 * 1024, 17 * 1024, 15 * 1024)


def test_ties_go_to_the_higher_chunk_and_the_lower_rank():
    w = cp.chunk_workloads([0, 1024, 2048, 3072, 4096], 1024)
    assert cp.magi_dispatch(w, 2) == [[1, 3], [0, 2]]


def _check_split(m: cp.ChunkMap):
    """The invariants of msa-workloads' tests, plus the gather index."""
    cu = m.cu_seqlens
    dealt = [0] * (m.total_tokens // m.chunk_size)
    for r in range(m.cp_size):
        lay = m.rank_layout(r)
        assert lay.total_q == m.tokens_per_rank
        for c in lay.chunks:
            dealt[c] += 1
        assert sum(e - b for b, e in lay.kv_source_ranges) == lay.total_k
        for b, f in enumerate(lay.fragments):
            first = lay.fragments[lay.fragment_indices[b]]
            assert first.doc == f.doc, "fragment_indices point into the same document"
            k_len = lay.cu_seqlens_k[b + 1] - lay.cu_seqlens_k[lay.fragment_indices[b]]
            assert (k_len, lay.cu_seqlens_q[b + 1] - lay.cu_seqlens_q[b]) == (
                f.local_end,
                f.local_end - f.local_begin,
            )
            assert f.global_begin == cu[f.doc] + f.local_begin
        for a, b in zip(lay.fragments, lay.fragments[1:]):
            assert a.doc != b.doc or a.local_end < b.local_begin, "touching runs are merged"
        # The rank's queries are its local rows, and its packed K/V rows, read through the
        # gathered buffer, are the pack tokens of kv_source_ranges.
        local = m.local_token_index(r)
        q_tokens = torch.cat(
            [torch.arange(f.global_begin, f.global_begin + f.local_end - f.local_begin)
             for f in lay.fragments]
        )
        assert torch.equal(local, q_tokens)
        everyone = torch.cat([m.local_token_index(s) for s in range(m.cp_size)])
        idx = m.gathered_kv_index(r)
        assert len(set(idx.tolist())) == len(idx), "packed rows are distinct gathered rows"
        want = torch.cat([torch.arange(b, e) for b, e in lay.kv_source_ranges])
        assert torch.equal(everyone[idx], want)
    assert all(n == 1 for n in dealt), "the ranks partition the chunks"


def test_every_rank_of_every_dev_case_is_a_valid_12k_query_layout():
    cases = [json.loads(line) for line in DEV_MANIFEST.read_text().splitlines() if line.strip()]
    assert len(cases) == 48
    for case in cases:
        cu = case["cu_seqlens"]
        assert sum(cp.chunk_workloads(cu)) == case["metrics"]["causal_elements"]
        m = cp.split_pack(cu, 16)
        for r in range(16):
            lay = m.rank_layout(r)
            assert (lay.total_q, len(lay.chunks)) == (12_288, 12), (case["case_id"], r)
        assert sorted(c for lst in m.rank_chunks for c in lst) == list(range(192))
    _check_split(cp.split_pack(cases[0]["cu_seqlens"], 16))


# sha256 of msa-workloads' split of the 48 dev packs for CP 2 and 16 (chunks of 1,024), one line
# per rank as Rust's Debug formatting writes it from `RealCase::rank_cases`:
# "{case_id} {cp} {rank} {chunks:?} {cu_seqlens_q:?} {cu_seqlens_k:?} {fragment_indices:?}
# {kv_source_ranges as (start, end):?} {total_rows} {max_seqlen_q} {max_seqlen_k} {total_k}\n"
# (computed 2026-12-01; the Python split matched all 1,104 rank layouts of CP 1, 2, 4 and 16).
RUST_DEV_SPLIT_SHA256 = "e844089f2364238504c6a319f76397f6a51f720f946ed7d6d013bd33e96678ce"


def test_dev_packs_split_as_msa_workloads_does():
    def seq(xs):
        return "[" + ", ".join(str(x) for x in xs) + "]"

    h = hashlib.sha256()
    for line in DEV_MANIFEST.read_text().splitlines():
        if not line.strip():
            continue
        case = json.loads(line)
        for cp_size in (2, 16):
            m = cp.split_pack(case["cu_seqlens"], cp_size)
            for r in range(cp_size):
                lay = m.rank_layout(r)
                kv = "[" + ", ".join(f"({b}, {e})" for b, e in lay.kv_source_ranges) + "]"
                h.update(
                    f"{case['case_id']} {cp_size} {r} {seq(lay.chunks)} {seq(lay.cu_seqlens_q)} "
                    f"{seq(lay.cu_seqlens_k)} {seq(lay.fragment_indices)} {kv} {lay.total_rows} "
                    f"{lay.max_seqlen_q} {lay.max_seqlen_k} {lay.total_k}\n".encode()
                )
    assert h.hexdigest() == RUST_DEV_SPLIT_SHA256


def test_random_packs_split_into_valid_ranks():
    rng = random.Random(7)
    for _ in range(24):
        cp_size = rng.randint(1, 4)
        cu = [0]
        for _ in range(rng.randint(1, 30)):
            cu.append(cu[-1] + rng.randint(1, 1500))
        unit = cp_size * 256
        if cu[-1] % unit:
            cu.append(cu[-1] + unit - cu[-1] % unit)
        _check_split(cp.split_pack(cu, cp_size, 256))


@pytest.mark.parametrize(
    "cu, rank_chunks, chunk_size, needle",
    [
        ([0, 1000], [[0]], 1024, "1000 tokens do not split into chunks of 1024"),
        ([0, 3072], [[0], [1, 2]], 1024, "3072 tokens do not split into chunks of 1024 dealt "
         "evenly over 2 ranks"),
        ([0, 1024, 1024, 2048], [[0], [1]], 1024, "must be strictly increasing"),
        ([5, 2048], [[0], [1]], 1024, "must start at 0"),
        ([0, 4096], [[0, 1, 2], [3]], 1024, "rank 0 holds 3 chunks; every rank must hold 2"),
        ([0, 4096], [[0, 2], [2, 3]], 1024, "chunk 2 is dealt to ranks 0 and 1"),
        ([0, 4096], [[0, 4], [1, 2]], 1024, "rank 0 holds chunk 4, outside [0, 4)"),
        ([0, 4096], [[2, 0], [1, 3]], 1024, "rank 0's chunks [2, 0] are not ascending"),
        ([0, 4096], [], 1024, "at least one rank"),
        ([0, 4096], [[0, 1, 2, 3]], 0, "chunk_size must be >= 1"),
    ],
)
def test_bad_chunk_maps_are_rejected(cu, rank_chunks, chunk_size, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        cp.ChunkMap(cu, rank_chunks, chunk_size)


def test_split_pack_errors_and_rank_range():
    with pytest.raises(ValueError, match="evenly over 2 ranks"):
        cp.split_pack([0, 3072], 2)
    with pytest.raises(ValueError, match="cp_size and chunk_size must be >= 1"):
        cp.split_pack([0, 1024], 0)
    m = cp.split_pack(torch.tensor([0, 3000, 4096], dtype=torch.int32), 2)
    assert m == cp.split_pack([0, 3000, 4096], 2) and m.cp_size == 2
    with pytest.raises(ValueError, match=r"rank 2 is out of range \(CP size 2\)"):
        m.rank_layout(2)


def test_backend_strings():
    assert cp._cuda_only("nccl") and cp._cuda_only("cuda:nccl")
    assert not cp._cuda_only("gloo") and not cp._cuda_only("cpu:gloo,cuda:nccl")


# ---------------------------------------------------------------------------------------------
# one process: a hand-made Collectives


class Solo:
    """The Collectives of a one-rank group (or, with ``digests``, a view of a larger group whose
    other ranks answer the chunk-map check with those digests)."""

    device = torch.device("cpu")

    def __init__(self, size=1, digests=None):
        self._size, self.digests = size, digests

    def rank(self):
        return 0

    def size(self):
        return self._size

    def all_gather_into_tensor(self, output, input):
        if self.digests is not None:
            output.copy_(torch.tensor([int(input)] + self.digests, dtype=output.dtype))
        else:
            output.copy_(input)

    def reduce_scatter_tensor(self, output, input):
        output.copy_(input)


def _inputs(cu, seed):
    """Whole-pack fp32 inputs holding bf16 values, a random selection with empty rows, the
    selection's index LSE."""
    lay = ref.layout(cu, cu)
    t = cu[-1]
    g = torch.Generator().manual_seed(seed)

    def bf16(*shape):
        return torch.randn(*shape, generator=g).to(torch.bfloat16).float()

    x = dict(
        q=bf16(t, 64, 128), k=bf16(t, 4, 128), v=bf16(t, 4, 128), dout=bf16(t, 64, 128),
        qi=bf16(t, 4, 128), ki=bf16(t, 1, 128),
    )
    x["topk"] = ref.random_topk(lay, seed, empty_fraction=0.05)
    x["indexer_lse"] = ref.selection_lse(lay, x["topk"], x["qi"], x["ki"])
    return x


LOSS_COEFF = 0.7


def _run_rank(plan: cp.CpPlan, x: dict, explicit: bool = True) -> dict:
    """The CP calls of one rank on its rows of the whole-pack inputs ``x`` (``explicit``: the
    explicit attention backward too)."""
    idx = plan.local_token_index
    per_query = ("topk", "indexer_lse")  # [4, T, ...]: sliced below
    loc = {name: t[idx].contiguous() for name, t in x.items() if name not in per_query}
    topk = x["topk"][:, idx].contiguous()
    indexer_lse = x["indexer_lse"][:, idx].contiguous()
    got = {}
    got["index_topk"], got["index_lse"] = cp.indexer_forward(loc["qi"], loc["ki"], plan)
    meta = cp.prepare(topk, plan)
    q, k, v = (loc[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out, lse = cp.attention_forward(q, k, v, meta, plan, return_softmax_lse=True)
    (out * loc["dout"]).sum().backward()
    got.update(out=out.detach(), lse=lse.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    if explicit:
        got["dq_explicit"], got["dk_explicit"], got["dv_explicit"] = cp.attention_backward(
            loc["q"], loc["k"], loc["v"], loc["dout"], out.detach(), lse.detach(), meta, plan
        )
    got["dqi"], got["dki"] = cp.kl_backward(
        loc["q"], loc["k"], lse.detach(), loc["qi"], loc["ki"], indexer_lse, meta, plan,
        loss_coeff=LOSS_COEFF,
    )
    return got


def _whole(cu, x: dict) -> dict:
    """The single-process reference over the whole pack (no fragments)."""
    lay = ref.layout(cu, cu)
    want = {}
    want["index_topk"], want["index_lse"] = cpref.indexer_forward(
        x["qi"], x["ki"], cu_seqlens_q=torch.tensor(cu), cu_seqlens_kv=torch.tensor(cu),
        max_seqlen_q=lay["max_seqlen_q"], max_seqlen_kv=lay["max_seqlen_k"],
    )
    q, k, v = (x[n].clone().requires_grad_() for n in ("q", "k", "v"))
    out, lse = ref.attention(lay, x["topk"], q, k, v)
    (out * x["dout"]).sum().backward()
    want.update(out=out.detach(), lse=lse.detach(), dq=q.grad, dk=k.grad, dv=v.grad)
    for n in ("dq", "dk", "dv"):
        want[f"{n}_explicit"] = want[n]
    want["dqi"], want["dki"] = ref.kl_backward(
        lay, x["topk"], x["q"], x["k"], want["lse"], x["qi"], x["ki"], x["indexer_lse"],
        LOSS_COEFF,
    )
    return want


# Relative to the tensor's largest entry. The CP result differs from the whole pack's only by
# the order of fp32 sums (measured <= 6e-7); the KL's reference rounds dz to bf16, and a last-bit
# difference in its inputs can flip one rounding, worth up to ~1e-3 of an entry.
RTOL = {"dqi": 1e-3, "dki": 1e-3}
DEFAULT_RTOL = 1e-5


def _compare(got: dict, want: dict, idx: torch.Tensor, where: str):
    assert torch.equal(got["index_topk"], want["index_topk"][:, idx]), f"{where}: indexer top-k"
    for name, g in got.items():
        if name == "index_topk":
            continue
        w = want[name][:, idx] if name == "index_lse" else want[name][idx]
        finite = torch.isfinite(w)
        assert torch.equal(finite, torch.isfinite(g)), f"{where}: {name} infinities differ"
        g, w = g[finite], w[finite]
        rtol = RTOL.get(name, DEFAULT_RTOL)
        scale = w.abs().max().item()
        torch.testing.assert_close(
            g, w, rtol=rtol, atol=rtol * scale, msg=lambda m: f"{where}: {name}: {m}"
        )


# Small real-shaped packs, (cu_seqlens, chunk size): documents not multiples of 128, several
# per chunk, spanning chunks (chunks of 128: a real chunk is 8 blocks); one document over every
# chunk, chunks of half a block (CP4: ranks 0-2 hold two fragments of it, and fragments start
# mid-block).
CHUNK = 128
PACKS = {
    "mixed": ([0, 300, 350, 387, 807, 897, 1024], CHUNK),
    "long": ([0, 512], 64),
}
# One rank (and the argument errors): half a pack.
SMALL = [0, 300, 350, 387, 512]


@pytest.fixture
def one_thread():
    """The dense reference on one intra-op thread: on a small shared CPU more threads cost more
    CPU time than they save."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_one_rank_equals_the_whole_pack(one_thread):
    cu = SMALL
    m = cp.split_pack(cu, 1, CHUNK)
    lay = m.rank_layout(0)
    # One fragment per document, in order: the whole pack with identity fragment_indices.
    assert (lay.cu_seqlens_q, lay.cu_seqlens_k) == (tuple(cu), tuple(cu))
    assert lay.fragment_indices == tuple(range(len(cu) - 1))
    plan = cp.CpPlan(m, Solo(), local_ops=cpref.REFERENCE)
    x = _inputs(cu, seed=3)
    _compare(_run_rank(plan, x), _whole(cu, x), torch.arange(cu[-1]), "cp1")


def _worker(rank, world, store, inputs_path, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        # CP2 over groups whose ranks are not the global ones (3 is rank 1 of {1, 3}).
        pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        inputs = torch.load(inputs_path)
        jobs = [
            ("mixed", None, 4), ("long", None, 4), ("mixed", pairs[0], 2), ("long", pairs[1], 2)
        ]
        for name, group, size in jobs:
            if group is not None and dist.get_rank(group) < 0:
                continue
            cu, chunk = PACKS[name]
            plan = cp.CpPlan(cp.split_pack(cu, size, chunk), group, local_ops=cpref.REFERENCE)
            got = _run_rank(plan, inputs[name], explicit=name == "mixed")
            torch.save(got, f"{out_dir}/{name}-cp{size}-r{plan.rank}.pt")
    finally:
        dist.destroy_process_group()


def test_gloo_cp4_and_cp2_equal_the_whole_pack(tmp_path, one_thread):
    inputs = {name: _inputs(cu, seed=i) for i, (name, (cu, _)) in enumerate(PACKS.items())}
    torch.save(inputs, tmp_path / "inputs.pt")
    ranks = mp.start_processes(
        _worker, args=(4, str(tmp_path / "store"), str(tmp_path / "inputs.pt"), str(tmp_path)),
        nprocs=4, start_method="spawn", join=False,
    )
    # The whole-pack references while the ranks start.
    wants = {name: _whole(cu, inputs[name]) for name, (cu, _) in PACKS.items()}
    while not ranks.join():
        pass
    for name, (cu, chunk) in PACKS.items():
        want = wants[name]
        for size in (4, 2):
            m = cp.split_pack(cu, size, chunk)
            for r in range(size):
                got = torch.load(tmp_path / f"{name}-cp{size}-r{r}.pt")
                _compare(got, want, m.local_token_index(r), f"{name} cp{size} rank {r}")


# ---------------------------------------------------------------------------------------------
# argument errors


def test_plan_errors():
    m = cp.split_pack(PACKS["mixed"][0], 2, CHUNK)
    with pytest.raises(ValueError, match="the process group has 1 ranks but the chunk map "
                       "deals the pack to 2"):
        cp.CpPlan(m, Solo())
    with pytest.raises(TypeError, match="group must be a torch.distributed ProcessGroup"):
        cp.CpPlan(m, "nccl")
    with pytest.raises(TypeError, match="chunk_map must be a ChunkMap"):
        cp.CpPlan([[0, 1]], Solo())
    with pytest.raises(TypeError, match="local_ops must be a LocalOps"):
        cp.CpPlan(cp.split_pack(SMALL, 1, CHUNK), Solo(), local_ops=object())
    # The other rank split another pack.
    other = cp.split_pack(SMALL, 2, CHUNK).digest()
    with pytest.raises(ValueError, match=r"ranks \[1\] built another chunk map than rank 0"):
        cp.CpPlan(m, Solo(2, digests=[other]))
    cp.CpPlan(m, Solo(2, digests=[m.digest()]))  # agreeing ranks pass
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
            cp.CpPlan(m)


def test_call_errors():
    cu = SMALL
    plan = cp.CpPlan(cp.split_pack(cu, 1, CHUNK), Solo(), local_ops=cpref.REFERENCE)
    x = _inputs(cu, seed=3)
    with pytest.raises(ValueError, match="k must hold the rank's 512 local rows"):
        cp.attention_forward(x["q"], x["k"][:5], x["v"], None, plan)
    with pytest.raises(ValueError, match="the metadata is for 1 queries over 2 keys"):
        other = cpref.prepare(
            torch.zeros(4, 1, 16, dtype=torch.int32), torch.tensor([0, 1]),
            torch.tensor([0, 2]), fragment_indices=None, total_k=2, total_rows=1,
            max_seqlen_q=1, max_seqlen_k=2,
        )
        cp.attention_forward(x["q"], x["k"], x["v"], other, plan)
    with pytest.raises(ValueError, match="topk_indices covers 7 queries"):
        cp.prepare(torch.zeros(4, 7, 16, dtype=torch.int32), plan)
    with pytest.raises(TypeError, match="plan must be a CpPlan"):
        cp.prepare(x["topk"], None)
    with pytest.raises(ValueError, match=r"ki_packed must be the rank's packed rows \[512"):
        cp.indexer_forward(x["qi"], x["ki"], plan, ki_packed=x["ki"][:3])
    with pytest.raises(ValueError, match=r"indexer_lse must be \[4, 512\]"):
        meta = cp.prepare(x["topk"], plan)
        cp.kl_backward(x["q"], x["k"], x["q"][:, :, 0], x["qi"], x["ki"], x["q"][0], meta, plan)
    # The public pair: gather then reduce-scatter is the identity on one rank.
    (kp,) = plan.gather(x["k"])
    assert torch.equal(kp, x["k"])
    (back,) = plan.reduce_scatter(kp.to(torch.bfloat16))
    assert back.dtype == torch.bfloat16 and torch.equal(back.float(), x["k"])
