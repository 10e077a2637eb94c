"""CPU test of bench_peers.py's exact FlexAttention peer: its block mask (full blocks, partial
blocks and the mask_mod) gives FlexAttention MSA's exact semantics, checked against the contract
query by query and against SDPA with the dense mask, on documents that are not multiples of 128
and a document split into two CP fragments.

    python -m pytest scripts/test_bench_peers.py   (torch >= 2.5)
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_peers as bp  # noqa: E402

# A: 300 tokens, one fragment; B: 644 keys in fragments of 100 and 244 queries ending at 400 and
# 644; C: 124 tokens. T = 768.
CU_Q = [0, 300, 400, 644, 768]
CU_K = [0, 300, 700, 944, 1068]
FRAG = [0, 1, 1, 3]


@pytest.mark.parametrize("pattern", ["recent16", "spread"])
def test_exact_block_mask_is_msas_selection(pattern):
    from torch.nn.attention.flex_attention import flex_attention

    rec = {"cu_seqlens_q": CU_Q, "cu_seqlens_k": CU_K, "fragment_indices": FRAG}
    rows, nb = bp.exact_layout(rec, pattern)
    assert len(rows) == 768 and nb == 3 + 6 + 1
    mask, sel, kmax = bp.exact_block_mask(rows, nb + 1, "cpu")  # a spare workspace block
    nk = (nb + 1) * bp.BLOCK
    kw = torch.arange(nk)
    dense = sel[:, kw // bp.BLOCK] & (kw.view(1, -1) <= kmax.view(-1, 1))
    for t in range(len(rows)):
        b = max(i for i in range(len(CU_Q) - 1) if CU_Q[i] <= t)
        k_len, q_len = CU_K[b + 1] - CU_K[FRAG[b]], CU_Q[b + 1] - CU_Q[b]
        pos = k_len - q_len + (t - CU_Q[b])
        base = rows[t][0] * bp.BLOCK
        chosen = bp.selection(pattern, pos // bp.BLOCK)
        assert chosen[-1] == pos // bp.BLOCK and len(set(chosen)) == min(pos // bp.BLOCK + 1, bp.TOPK)
        want = {base + j for j in range(pos + 1) if j // bp.BLOCK in chosen}
        assert set(torch.nonzero(dense[t]).flatten().tolist()) == want, t
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 4, len(rows), 16), torch.randn(1, 1, nk, 16), torch.randn(1, 1, nk, 16)
    out = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_mask=dense.view(1, 1, len(rows), nk))
    assert (out - ref).abs().max().item() < 1e-4


def test_shared_masks_refill_in_place():
    """Rows measured one after another share one mask_mod and its tensors (one compilation)."""
    from torch.nn.attention.flex_attention import flex_attention

    # One 2,560-token document (20 blocks): past block 15, recent16 and spread differ.
    rec = {"cu_seqlens_q": [0, 2560], "cu_seqlens_k": [0, 2560], "fragment_indices": [0]}
    shared, outs = {}, []
    torch.manual_seed(1)
    q, k, v = torch.randn(1, 2, 2560, 16), torch.randn(1, 1, 21 * bp.BLOCK, 16), torch.randn(1, 1, 21 * bp.BLOCK, 16)
    for pattern in ("recent16", "spread"):
        rows, _ = bp.exact_layout(rec, pattern)
        mask, _, _ = bp.exact_block_mask(rows, 21, "cpu", shared)
        fresh, _, _ = bp.exact_block_mask(rows, 21, "cpu")
        a = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
        b = flex_attention(q, k, v, block_mask=fresh, enable_gqa=True)
        assert torch.equal(a, b), pattern
        outs.append(a)
    assert not torch.equal(outs[0], outs[1])  # the two selections differ, so the refill took effect
