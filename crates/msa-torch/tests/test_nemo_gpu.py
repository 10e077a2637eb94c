"""GPU tests of msa_torch.nemo (marker ``gpu``, as test_gpu.py): ``sparse_attention`` on a
NeMo-shaped microbatch against the fp32 reference (out and, through autograd, dq, dk, dv), the
backward stages on the aligned workspace against ``attention.backward``, the task build on a
real prepare's schedule, and the probes against torch's."""

import pytest
import torch

from msa_torch import attention, nemo

import msa_reference as ref
from test_gpu import Case, _check_forward, _check_grads

pytestmark = pytest.mark.gpu

# NeMo's microbatch is self-attention over packed documents: queries are the keys.
DOCS = ref.layout([0, 300, 377, 890, 1019], [0, 300, 377, 890, 1019])


class Microbatch:
    """NeMo's MSAMicrobatch fields sparse_attention reads (``workspace_size`` optional)."""

    def __init__(self, cu_seqlens, max_seqlen, workspace_size=None):
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = max_seqlen
        if workspace_size is not None:
            self.workspace_size = workspace_size


def _microbatch(lay, with_workspace):
    cu = torch.tensor(lay["cu_q"], dtype=torch.int32, device="cuda")
    return Microbatch(cu, lay["max_seqlen_q"], lay["total_rows"] * 128 if with_workspace else None)


@pytest.mark.parametrize("with_workspace", [True, False])
@pytest.mark.parametrize("inputs", ["unit", "msa"])
def test_sparse_attention_against_reference(with_workspace, inputs):
    case = Case(DOCS, ref.random_topk(DOCS, seed=21), seed=22, inputs=inputs)
    q, k, v = (x.clone().requires_grad_() for x in (case.q, case.k, case.v))
    out = nemo.sparse_attention(q, k, v, case.topk, _microbatch(DOCS, with_workspace))
    assert out.dtype == torch.bfloat16 and out.shape == case.q.shape and out.requires_grad
    ref_out, ref_lse, rdq, rdk, rdv = case.reference()
    meta = case.prepare()
    _, lse = attention.forward(case.q, case.k, case.v, meta, return_softmax_lse=True)
    _check_forward(out.detach(), lse, ref_out, ref_lse, case.tolerances)
    (out.float() * case.dout.float()).sum().backward()
    _check_grads([q.grad.float(), k.grad.float(), v.grad.float()], [rdq, rdk, rdv],
                 case.tolerances)


def test_sparse_attention_deterministic_mode_is_bitwise_repeatable():
    case = Case(DOCS, ref.random_topk(DOCS, seed=23), seed=24)
    mb = _microbatch(DOCS, True)
    grads = []
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            q, k, v = (x.clone().requires_grad_() for x in (case.q, case.k, case.v))
            out = nemo.sparse_attention(q, k, v, case.topk, mb)
            (out.float() * case.dout.float()).sum().backward()
            grads.append((q.grad, k.grad, v.grad))
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_backward_stages_on_the_aligned_workspace():
    case = Case(DOCS, ref.random_topk(DOCS, seed=25), seed=26, inputs="msa")
    meta = case.prepare()
    out, lse = attention.forward(case.q, case.k, case.v, meta, return_softmax_lse=True)
    schedule = nemo.backward_schedule(meta)
    w = DOCS["total_rows"] * 128
    pos = nemo._workspace_positions(schedule, DOCS["total_q"])
    k_al = torch.zeros(w, 4, 128, dtype=torch.bfloat16, device="cuda").index_copy_(0, pos, case.k)
    v_al = torch.zeros(w, 4, 128, dtype=torch.bfloat16, device="cuda").index_copy_(0, pos, case.v)
    torch.use_deterministic_algorithms(True)
    try:
        dq, dk_al, dv_al = nemo.run_backward(case.q, k_al, v_al, case.dout, lse, out, schedule)
    finally:
        torch.use_deterministic_algorithms(False)
    want = attention.backward(case.q, case.k, case.v, case.dout, out, lse, meta, deterministic=True)
    assert torch.equal(dq, want[0])
    assert torch.equal(dk_al.index_select(0, pos), want[1])
    assert torch.equal(dv_al.index_select(0, pos), want[2])
    pad = torch.ones(w, dtype=torch.bool, device="cuda").index_fill_(0, pos, False)
    assert (dk_al[pad] == 0).all() and (dv_al[pad] == 0).all()
    # Preprocess: delta in fp32.
    delta = torch.empty(DOCS["total_q"], 64, device="cuda")
    nemo.run_preprocess(out, case.dout, delta)
    torch.testing.assert_close(delta, (out.float() * case.dout.float()).sum(-1))
    # Finalize: the head-pair interleaved pool de-interleaves to dQ; the kv pool casts.
    pool = dq.float().view(-1, 32, 2, 128).permute(0, 1, 3, 2).contiguous()
    dq_out = torch.empty_like(dq)
    kv_pool = torch.randn(4096, device="cuda")
    kv_out = torch.empty(4096, dtype=torch.bfloat16, device="cuda")
    nemo.run_grad_finalize(pool, dq_out, kv_pool, kv_out)
    assert torch.equal(dq_out, dq) and torch.equal(kv_out, kv_pool.to(torch.bfloat16))


def test_build_backward_tasks_on_a_prepared_schedule():
    case = Case(DOCS, ref.random_topk(DOCS, seed=27), seed=28)
    meta = case.prepare()
    schedule = nemo.backward_schedule(meta)
    t, w = DOCS["total_q"], DOCS["total_rows"] * 128
    scratch_words, table_words = nemo.task_build_storage(schedule, t, w)
    scratch = torch.empty(scratch_words, dtype=torch.int32, device="cuda")
    tables = torch.empty(table_words, dtype=torch.int32, device="cuda")
    sms = nemo.sm_count(case.q.device)
    out = nemo.build_backward_tasks(schedule, t, w, num_sms=sms, scratch=scratch, tables=tables)
    n = int(out.desc[6])
    assert int(out.desc[7]) & 1 == 0  # no capacity overflow
    assert out.grid_launch == nemo.grid_launch_bound(out.task_meta.shape[0], sms)
    # Every (head, query, selected block) edge is one task slot: per head, query t appears once
    # per valid entry of topk[head, t].
    meta_rows, qrows = out.task_meta[:n], out.task_qrows[:n]
    for h in range(4):
        rows = qrows[meta_rows[:, 1] == h]
        counts = torch.bincount(rows[rows >= 0].long(), minlength=t)
        assert torch.equal(counts, (case.topk[h] >= 0).sum(-1).long())


def test_probes_match_torch():
    dev = torch.device("cuda", torch.cuda.current_device())
    assert nemo.sm_capability(dev) == torch.cuda.get_device_capability(dev)
    assert nemo.sm_count(dev) == torch.cuda.get_device_properties(dev).multi_processor_count
    nemo.require_sm100(dev)
