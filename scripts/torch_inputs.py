"""Write an MSA attention inputs file with PyTorch (independent of msa-rs's own writer).

Used by the GPU runner to check `msa attention --backend cuda` against `--backend cpu` on a
file another framework produced. Two documents, the second split into two CP fragments that
share its K range (queries are the suffix of their K range), lengths not multiples of 128,
a random causal selection of min(p//128 + 1, 16) unique blocks with the local block last.

    python3 scripts/torch_inputs.py OUT.safetensors [--seed S]
"""

import argparse

import torch
from safetensors.torch import save_file


def selection(positions, generator):
    rows = []
    for p in positions:
        local = p // 128
        n = min(local + 1, 16)
        others = torch.randperm(local, generator=generator)[: n - 1].tolist() if local else []
        rows.append(others + [local] + [-1] * (16 - n))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)

    # Document A: 1,000 tokens, one fragment. Document B: 2,500 keys, fragments of 300 and 700
    # queries ending at positions 1,800 and 2,500.
    cu_q = [0, 1000, 1300, 2000]
    cu_k = [0, 1000, 2800, 3500]
    frag = [0, 1, 1]
    positions = list(range(1000)) + list(range(1500, 1800)) + list(range(1800, 2500))
    t, tk = cu_q[-1], cu_k[-1]

    def randn(*shape, scale=0.2):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)

    topk = torch.tensor([selection(positions, g) for _ in range(4)], dtype=torch.int32)
    tensors = {
        "q": randn(t, 64, 128),
        "k": randn(tk, 4, 128),
        "v": randn(tk, 4, 128),
        "dout": randn(t, 64, 128, scale=0.1),
        "qi": randn(t, 4, 128),
        "ki": randn(tk, 1, 128),
        "topk_indices": topk.contiguous(),
        "cu_seqlens_q": torch.tensor(cu_q, dtype=torch.int32),
        "cu_seqlens_k": torch.tensor(cu_k, dtype=torch.int32),
        "fragment_indices": torch.tensor(frag, dtype=torch.int32),
    }
    save_file(tensors, args.out)
    print(f"wrote {args.out}: T={t}, Tk={tk}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
