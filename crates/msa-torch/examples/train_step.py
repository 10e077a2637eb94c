"""One training step of an MSA layer on a real CP16 rank, with msa_torch.

    python crates/msa-torch/examples/train_step.py [--rank c151r7] [--hidden 128] [--seed 0]

The rank's layout comes from crates/msa-torch/tests/data/real_ranks.jsonl (msa-workloads' CP16
split of the development set: c151r7 is 12,288 queries in 12 fragments of one 189,440-key
document, c434r2 57 short documents). The layer has small projection weights from a random
hidden state (``--hidden`` wide) of every key row; the queries are the rows of the rank's query
positions. The step:

1. projections: q ``[T, 64, 128]``, k and v ``[Tk, 4, 128]``, index q ``[T, 4, 128]`` and index
   k ``[Tk, 1, 128]``;
2. ``indexer.forward`` -> top-k and the indexer's LSE;
3. ``attention.prepare`` (validates the top-k: one sync);
4. ``attention.forward`` with autograd, then a loss through an output projection;
5. the loss's backward to the attention output, then the attention backward through autograd;
6. ``kl.backward`` (the indexer's KL loss against the attention's probabilities) to the index
   projections;
7. the projections' backward and an AdamW step on every weight.

A warm-up step runs first (the CUDA context, cuBLAS, the allocator); the second step is timed
with CUDA events per stage. Useful TFLOP/s use MSA's FLOP model (docs/contract.md §6.1): with
``C`` = sum over queries of ``p + 1`` and ``S`` = sum of ``min(p + 1, 1920 + p mod 128 + 1)``
(``p`` the query's document position): forward ``2*(128+128)*64*S``, backward
``2*(3*128+2*128)*64*S``, indexer ``2*128*4*C``, KL ``2*(128*64+3*128*4)*S``.

Needs a CUDA GPU the built kernels serve; elsewhere it exits with status 1 and says why.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import msa_torch
from msa_torch import attention, indexer, kl

TESTS = Path(__file__).resolve().parent.parent / "tests"
REAL_RANKS = TESTS / "data" / "real_ranks.jsonl"


def refuse_without_gpu() -> None:
    """Exit with status 2 and the reason when the kernels cannot run here."""
    if not torch.cuda.is_available():
        reason = (
            "torch sees no CUDA device (torch.cuda.is_available() is False); msa_torch's "
            "kernels need an NVIDIA GPU"
        )
    else:
        reason = msa_torch.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"train_step.py: cannot run here: {reason}")


def flop_model(pos: torch.Tensor) -> dict[str, float]:
    """MSA's FLOP model over the queries' document positions ``pos`` (int64)."""
    c = float((pos + 1).sum())
    s = float(torch.minimum(pos + 1, 1920 + pos % 128 + 1).sum())
    return {
        "indexer": 2 * 128 * 4 * c,
        "attention forward": 2 * (128 + 128) * 64 * s,
        "attention backward": 2 * (3 * 128 + 2 * 128) * 64 * s,
        "KL backward": 2 * (128 * 64 + 3 * 128 * 4) * s,
    }


class Timer:
    """CUDA events around named stages on the current stream."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.marks: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []

    def stage(self, name: str):
        timer = self

        class _Stage:
            def __enter__(self):
                if timer.enabled:
                    self.start = torch.cuda.Event(enable_timing=True)
                    self.start.record()

            def __exit__(self, *exc):
                if timer.enabled and exc[0] is None:
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                    timer.marks.append((name, self.start, end))

        return _Stage()

    def millis(self) -> list[tuple[str, float]]:
        torch.cuda.synchronize()
        return [(name, a.elapsed_time(b)) for name, a, b in self.marks]


class Layer(torch.nn.Module):
    """The projections of one MSA layer (no norms, no RoPE: the kernels are the point)."""

    def __init__(self, hidden: int):
        super().__init__()

        def proj(out_features):
            return torch.nn.Linear(hidden, out_features, bias=False, dtype=torch.bfloat16)

        self.q, self.k, self.v = proj(64 * 128), proj(4 * 128), proj(4 * 128)
        self.o = torch.nn.Linear(64 * 128, hidden, bias=False, dtype=torch.bfloat16)
        self.index_q, self.index_k = proj(4 * 128), proj(128)


def step(layer, opt, x_k, query_rows, lay, d, timer):
    t, tk = lay["total_q"], lay["total_k"]
    x_q = x_k.index_select(0, query_rows)
    with timer.stage("projections"):
        q = layer.q(x_q).view(t, 64, 128)
        k = layer.k(x_k).view(tk, 4, 128)
        v = layer.v(x_k).view(tk, 4, 128)
        qi = layer.index_q(x_q).view(t, 4, 128)
        ki = layer.index_k(x_k).view(tk, 1, 128)
    with timer.stage("indexer"):
        topk, indexer_lse = indexer.forward(
            qi.detach(), ki.detach(), cu_seqlens_q=d["cu_seqlens_q"],
            cu_seqlens_kv=d["cu_seqlens_k"], max_seqlen_q=lay["max_seqlen_q"],
            max_seqlen_kv=lay["max_seqlen_k"], fragment_indices=d["fragment_indices"],
        )
    with timer.stage("prepare"):
        meta = attention.prepare(
            topk, d["cu_seqlens_q"], d["cu_seqlens_k"], total_k=tk,
            total_rows=lay["total_rows"], max_seqlen_q=lay["max_seqlen_q"],
            max_seqlen_k=lay["max_seqlen_k"], fragment_indices=d["fragment_indices"],
        )
    # Leaves at the attention's inputs, so its backward is timed on its own.
    q_l, k_l, v_l = (x.detach().requires_grad_() for x in (q, k, v))
    with timer.stage("attention forward"):
        out, lse = attention.forward(q_l, k_l, v_l, meta, return_softmax_lse=True)
    out_l = out.detach().requires_grad_()
    with timer.stage("loss"):
        loss = layer.o(out_l.view(t, 64 * 128)).float().pow(2).mean()
        loss.backward()
    with timer.stage("attention backward"):
        out.backward(out_l.grad)
    with timer.stage("KL backward"):
        dqi, dki = kl.backward(
            q.detach(), k.detach(), lse, qi.detach(), ki.detach(), indexer_lse, meta
        )
    with timer.stage("projection backward"):
        torch.autograd.backward([q, k, v, qi, ki], [q_l.grad, k_l.grad, v_l.grad, dqi, dki])
    with timer.stage("optimizer"):
        opt.step()
        opt.zero_grad(set_to_none=True)
    return float(loss)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", default="c151r7", help="a rank of tests/data/real_ranks.jsonl")
    p.add_argument("--hidden", type=int, default=128, help="hidden size of the projections")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    refuse_without_gpu()

    sys.path.insert(0, str(TESTS))
    import msa_reference as ref  # the layout helpers of the test suite

    ranks = ref.load_real_ranks(REAL_RANKS)
    if args.rank not in ranks:
        raise SystemExit(f"train_step.py: no rank {args.rank!r}; have {', '.join(sorted(ranks))}")
    lay, _ = ranks[args.rank]
    dev = torch.device("cuda", torch.cuda.current_device())
    d = ref.device_layout(lay, dev)
    kbase, _, pos = ref.query_coords(lay, dev)
    # A query is the key row at its document position (CP: the fragment's own rows).
    query_rows = kbase + pos

    torch.manual_seed(args.seed)
    layer = Layer(args.hidden).to(dev)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    x_k = torch.randn(lay["total_k"], args.hidden, device=dev).to(torch.bfloat16)

    step(layer, opt, x_k, query_rows, lay, d, Timer(False))  # warm-up
    timer = Timer(True)
    loss = step(layer, opt, x_k, query_rows, lay, d, timer)
    flops = flop_model(pos)

    print(f"msa_torch {msa_torch.__version__} on {torch.cuda.get_device_name(dev)}, "
          f"rank {args.rank}: {lay['total_q']} queries, {lay['total_k']} keys, "
          f"{len(lay['qlens'])} fragments; hidden {args.hidden}; loss {loss:.6f}")
    total = 0.0
    for name, ms in timer.millis():
        total += ms
        rate = f"{flops[name] / (ms * 1e-3) / 1e12:8.1f} TFLOP/s" if name in flops else ""
        print(f"  {name:<20} {ms:9.3f} ms  {rate}")
    print(f"  {'step':<20} {total:9.3f} ms")


if __name__ == "__main__":
    main()
