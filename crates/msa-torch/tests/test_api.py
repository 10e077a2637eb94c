"""Host tests of msa_torch (no GPU needed): the public API against MSA's ``msa_v1`` contract
(names, defaults, keyword-only markers, ``__all__``, metadata fields), the options msa-rs does
not implement, the device gate, the extension's sizes and rules, and every op's fake impl under
FakeTensorMode."""

import inspect
import math
import sys
import warnings

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import msa_torch
from msa_torch import _C, _device, _ops, attention, indexer, indexer_tree, kl

import msa_reference as ref

P = inspect.Parameter
POS, KW = P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY
E = P.empty

# MSA's signatures (shared/spec/msa-v1-contract.md §1.1-1.5): (name, kind, default).
MSA_SIGNATURES = {
    "attention.prepare": [
        ("topk_indices", POS, E),
        ("cu_seqlens_q", POS, E),
        ("cu_seqlens_k", POS, E),
        ("total_k", KW, E),
        ("total_rows", KW, E),
        ("max_seqlen_q", KW, E),
        ("max_seqlen_k", KW, E),
        ("fragment_indices", KW, None),
        ("prepare_kl_schedule", KW, True),
    ],
    "attention.forward": [
        ("q", POS, E),
        ("k", POS, E),
        ("v", POS, E),
        ("metadata", POS, E),
        ("softmax_scale", KW, None),
        ("lse_temperature_scale", KW, 1.0),
        ("return_softmax_lse", KW, False),
        ("return_temperature_lse", KW, False),
        ("partial_dtype", KW, torch.bfloat16),
        ("sparse_attn_p_mode", KW, ""),
        ("deterministic", KW, False),
    ],
    "attention.backward": [
        ("q", POS, E),
        ("k", POS, E),
        ("v", POS, E),
        ("dout", POS, E),
        ("out", POS, E),
        ("lse", POS, E),
        ("metadata", POS, E),
        ("softmax_scale", KW, None),
        ("sparse_attn_p_mode", KW, ""),
        ("q_fp8", KW, None),
        ("k_fp8", KW, None),
        ("deterministic", KW, False),
    ],
    "indexer.forward": [
        ("q", POS, E),
        ("k", POS, E),
        ("cu_seqlens_q", KW, E),
        ("cu_seqlens_kv", KW, E),
        ("max_seqlen_q", KW, E),
        ("max_seqlen_kv", KW, E),
        ("fragment_indices", KW, None),
        ("schedule", KW, None),
        ("workspace", KW, None),
        ("lse_temperature", KW, 1.0),
        ("deterministic", KW, False),
        ("use_fp16_score", KW, False),
    ],
    "kl.backward": [
        ("q", POS, E),
        ("k", POS, E),
        ("teacher_lse", POS, E),
        ("qi", POS, E),
        ("ki", POS, E),
        ("indexer_lse", POS, E),
        ("metadata", POS, E),
        ("softmax_scale", KW, None),
        ("indexer_softmax_scale", KW, None),
        ("loss_coeff", KW, 1.0),
        ("deterministic", KW, False),
    ],
}

MSA_METADATA_FIELDS = [
    "topk_indices",
    "cu_seqlens_q",
    "cu_seqlens_k",
    "fragment_indices",
    "k2q_row_ptr",
    "k2q_q_indices",
    "schedule",
    "kl_schedule",
    "total_k",
    "total_rows",
    "max_seqlen_q",
    "max_seqlen_k",
]


def _function(path):
    module, name = path.split(".")
    return getattr(getattr(msa_torch, module), name)


@pytest.mark.parametrize("path", sorted(MSA_SIGNATURES))
def test_signature_matches_msa(path):
    params = list(inspect.signature(_function(path)).parameters.values())
    got = [(p.name, p.kind, p.default) for p in params]
    assert got == MSA_SIGNATURES[path]


def test_unchecked_prepare_has_prepares_signature():
    assert inspect.signature(attention.prepare_unchecked) == inspect.signature(attention.prepare)


def test_all_lists_match_msa():
    assert msa_torch.__all__ == ["attention", "indexer", "indexer_tree", "kl"]
    assert attention.__all__ == ["AttentionMetadata", "backward", "forward", "prepare"]
    assert indexer.__all__ == ["forward"]
    assert kl.__all__ == ["backward"]
    for module in (msa_torch, attention, indexer, indexer_tree, kl):
        for name in module.__all__:
            assert hasattr(module, name), (module.__name__, name)


def test_metadata_fields_start_with_msas():
    import dataclasses

    fields = [f.name for f in dataclasses.fields(attention.AttentionMetadata)]
    assert fields[: len(MSA_METADATA_FIELDS)] == MSA_METADATA_FIELDS
    assert attention.AttentionMetadata.__dataclass_params__.frozen
    assert not attention.AttentionMetadata.__dataclass_params__.eq  # identity: fields are tensors


def test_extension_reports_what_it_serves():
    assert msa_torch.built_archs() == ["sm_90a", "sm_80", "compute_80"]
    assert _C.served_by(9, 0) == "sm_90a"
    assert _C.served_by(8, 6) == "sm_80"
    assert _C.served_by(10, 0) == "compute_80"
    assert _C.served_by(7, 5) is None
    assert _C.unsupported_reason(0, 9, 0) is None
    reason = _C.unsupported_reason(3, 7, 5)
    assert "7.5" in reason and "device 3" in reason and "sm_90a" in reason
    assert _C.kernel_set(9, 0) == "sm90a" and _C.kernel_set(8, 0) == "sm80"
    assert _C.backward_path(True, "sm90a") == "deterministic"
    assert _C.backward_path(False, "sm90a") == "sm90"
    assert _C.backward_path(False, "sm80") == "sm80_atomic"
    with pytest.raises(ValueError, match="sm90a"):
        _C.backward_path(False, "sm70")
    assert issubclass(msa_torch.TopKError, ValueError)
    assert msa_torch.TopKError is _C.TopKError


def test_sizes_follow_the_contract():
    lay = ref.VARLEN
    s = _C.sizes(
        lay["total_q"], lay["total_k"], 3, lay["total_rows"], lay["max_seqlen_k"], False, 132
    )
    t, tk = lay["total_q"], lay["total_k"]
    assert s["selection"] == 4 * t * 16
    assert s["row_ptr"] == 4 * (lay["total_rows"] + 1)
    assert s["queries"] == t * 64 * 128
    assert s["keys"] == tk * 4 * 128
    assert s["query_heads"] == t * 64
    assert s["index_lse"] == 4 * t
    assert s["padded_kv_blocks"] == (tk + 4 * 128 - 1) // 128
    assert s["scheduler_metadata"] == 6 * s["work_capacity"]
    assert s["forward_workspace_bytes_sm80"] == 0
    shape = _C.CallShape(t, tk, 3, lay["total_rows"], lay["max_seqlen_k"], False, 132)
    assert shape.sizes() == s
    assert shape.backward_workspace_bytes("deterministic") == s[
        "backward_workspace_bytes_deterministic"
    ]
    assert "CallShape(total_q=863" in repr(shape)


@pytest.mark.parametrize(
    "args, needle",
    [
        ((10, 5, 1, 1, 5, False, 132), "total_q"),  # more queries than keys, no fragments
        ((10, 10, 1, 7, 10, False, 132), "total_rows"),  # one block, 7 rows
        ((10, 10, 0, 1, 10, False, 132), "batch 0"),
        ((10, 10, 1, 1, 11, False, 132), "max_seqlen_k"),
        ((10, 10, 1, 1, 10, False, 0), "sm_count"),
    ],
)
def test_call_shape_rejects_impossible_integers(args, needle):
    with pytest.raises(ValueError, match=needle):
        _C.CallShape(*args)


def test_unavailable_reason_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    reason = msa_torch.unavailable_reason()
    assert "no CUDA device" in reason
    assert not msa_torch.available()


def test_gate_names_an_unsupported_gpu(monkeypatch):
    monkeypatch.setattr(_device, "_capability", lambda index: (7, 5))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "Tesla T4")
    with pytest.raises(msa_torch.UnsupportedDeviceError) as e:
        _device._gate.__wrapped__(0)
    message = str(e.value)
    assert "Tesla T4" in message and "7.5" in message and "sm_90a" in message


# ---------------------------------------------------------------------------------------------
# device gate on CPU tensors


def _cpu_layout(lay=ref.VARLEN):
    d = ref.device_layout(lay, "cpu")
    topk = ref.recent_topk(lay)
    return topk, d


def test_prepare_rejects_cpu_tensors():
    topk, d = _cpu_layout()
    with pytest.raises(msa_torch.UnsupportedDeviceError, match=r"topk_indices is on cpu"):
        attention.prepare(
            topk, d["cu_seqlens_q"], d["cu_seqlens_k"], **ref.prepare_kwargs(ref.VARLEN)
        )


def test_ops_reject_cpu_tensors_when_called_directly():
    topk, d = _cpu_layout()
    lay = ref.VARLEN
    with pytest.raises(msa_torch.UnsupportedDeviceError, match="cpu"):
        _ops.prepare_op(
            topk, d["cu_seqlens_q"], d["cu_seqlens_k"], None, lay["total_k"],
            lay["total_rows"], lay["max_seqlen_k"], True,
        )
    qi = torch.zeros(lay["total_q"], 4, 128, dtype=torch.bfloat16)
    ki = torch.zeros(lay["total_k"], 1, 128, dtype=torch.bfloat16)
    with pytest.raises(msa_torch.UnsupportedDeviceError, match="cpu"):
        _ops.indexer_fwd(qi, ki, d["cu_seqlens_q"], d["cu_seqlens_k"], None, lay["max_seqlen_k"])


def test_indexer_rejects_cpu_tensors():
    lay = ref.VARLEN
    d = ref.device_layout(lay, "cpu")
    qi = torch.zeros(lay["total_q"], 4, 128, dtype=torch.bfloat16)
    ki = torch.zeros(lay["total_k"], 1, 128, dtype=torch.bfloat16)
    with pytest.raises(msa_torch.UnsupportedDeviceError, match="q is on cpu"):
        indexer.forward(
            qi, ki, cu_seqlens_q=d["cu_seqlens_q"], cu_seqlens_kv=d["cu_seqlens_k"],
            max_seqlen_q=lay["max_seqlen_q"], max_seqlen_kv=lay["max_seqlen_k"],
        )


# ---------------------------------------------------------------------------------------------
# fake impls: shapes and dtypes without a GPU


def _fake_metadata(mode, lay):
    d = ref.device_layout(lay, "cpu")
    with mode:
        dev = {k: (None if v is None else mode.from_tensor(v).to("cuda")) for k, v in d.items()}
        topk = torch.empty(4, lay["total_q"], 16, dtype=torch.int32, device="cuda")
        meta = attention.prepare(
            topk, dev["cu_seqlens_q"], dev["cu_seqlens_k"],
            fragment_indices=dev["fragment_indices"], **ref.prepare_kwargs(lay),
        )
    return meta


@pytest.mark.parametrize("lay", [ref.VARLEN, ref.FRAGMENTS], ids=["varlen", "fragments"])
def test_fake_impls_give_the_contract_shapes(lay):
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    meta = _fake_metadata(mode, lay)
    t, tk, r, b = lay["total_q"], lay["total_k"], lay["total_rows"], len(lay["qlens"])
    sizes = _C.sizes(t, tk, b, r, lay["max_seqlen_k"], lay["frag"] is not None,
                     _device.FAKE_SM_COUNT if not torch.cuda.is_available()
                     else torch.cuda.get_device_properties(0).multi_processor_count)
    i32 = torch.int32
    expect = {
        "k2q_row_ptr": ((4, r + 1), i32),
        "k2q_q_indices": ((4, t * 16), i32),
        "error_word": ((4,), i32),
    }
    for name, (shape, dtype) in expect.items():
        tensor = getattr(meta, name)
        assert tuple(tensor.shape) == shape and tensor.dtype == dtype, name
        assert tensor.device.type == "cuda"
    assert tuple(meta.schedule.scheduler_metadata.shape) == (sizes["work_capacity"], 6)
    assert tuple(meta.schedule.split_counts.shape) == (t, 4)
    assert tuple(meta.physical_schedule.physical_row_ptr.shape) == (
        4, sizes["padded_kv_blocks"] + 1,
    )
    assert meta.kl_schedule is meta.physical_schedule
    assert tuple(meta.layout.query_fragment.shape) == (t,)
    assert (meta.total_k, meta.total_rows) == (tk, r)
    with mode:
        q = torch.empty(t, 64, 128, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(tk, 4, 128, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(tk, 4, 128, dtype=torch.bfloat16, device="cuda")
        out, lse = attention.forward(q, k, v, meta, return_softmax_lse=True)
        out_only = attention.forward(q, k, v, meta)
        dq, dk, dv = attention.backward(q, k, v, out, out, lse, meta, deterministic=True)
        qi = torch.empty(t, 4, 128, dtype=torch.bfloat16, device="cuda")
        ki = torch.empty(tk, 1, 128, dtype=torch.bfloat16, device="cuda")
        itopk, ilse = indexer.forward(
            qi, ki, cu_seqlens_q=meta.cu_seqlens_q, cu_seqlens_kv=meta.cu_seqlens_k,
            max_seqlen_q=lay["max_seqlen_q"], max_seqlen_kv=lay["max_seqlen_k"],
            fragment_indices=meta.fragment_indices,
        )
        slse = indexer.selection_lse(qi, ki, meta)
        dqi, dki = kl.backward(q, k, lse, qi, ki, ilse, meta, loss_coeff=0.5)
    for tensor, shape, dtype in [
        (out, (t, 64, 128), torch.bfloat16),
        (out_only, (t, 64, 128), torch.bfloat16),
        (lse, (t, 64), torch.float32),
        (dq, (t, 64, 128), torch.bfloat16),
        (dk, (tk, 4, 128), torch.bfloat16),
        (dv, (tk, 4, 128), torch.bfloat16),
        (itopk, (4, t, 16), torch.int32),
        (ilse, (4, t), torch.float32),
        (slse, (4, t), torch.float32),
        (dqi, (t, 4, 128), torch.bfloat16),
        (dki, (tk, 1, 128), torch.bfloat16),
    ]:
        assert tuple(tensor.shape) == shape and tensor.dtype == dtype
        assert tensor.device.type == "cuda"
    assert not lse.requires_grad


def test_fake_forward_is_differentiable_and_lse_is_not():
    lay = ref.VARLEN
    mode = FakeTensorMode()
    meta = _fake_metadata(mode, lay)
    with mode:
        t, tk = lay["total_q"], lay["total_k"]
        q = torch.empty(t, 64, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        k = torch.empty(tk, 4, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        v = torch.empty(tk, 4, 128, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        out, lse = attention.forward(q, k, v, meta, return_softmax_lse=True)
        assert out.requires_grad and not lse.requires_grad
        # The autograd node is the op's (running it needs a real CUDA device: GPU suite).
        assert "attention_fwd" in type(out.grad_fn).__name__ or out.grad_fn is not None


# ---------------------------------------------------------------------------------------------
# options msa-rs does not implement


def _fake_qkv(mode, meta, dtype=torch.bfloat16):
    with mode:
        t, tk = meta.total_q, meta.total_k
        q = torch.empty(t, 64, 128, device="cuda").to(dtype)
        k = torch.empty(tk, 4, 128, device="cuda").to(dtype)
        v = torch.empty(tk, 4, 128, device="cuda").to(dtype)
    return q, k, v


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"sparse_attn_p_mode": "fp8"}, "sparse_attn_p_mode='fp8'"),
        ({"partial_dtype": torch.float16}, "partial_dtype"),
        ({"return_temperature_lse": True, "return_softmax_lse": True}, "return_temperature_lse"),
        ({"lse_temperature_scale": 2.0}, "lse_temperature_scale"),
        ({"softmax_scale": 0.1}, "softmax_scale"),
    ],
)
def test_forward_options_not_implemented(kwargs, needle):
    mode = FakeTensorMode()
    meta = _fake_metadata(mode, ref.VARLEN)
    q, k, v = _fake_qkv(mode, meta)
    with mode, pytest.raises(NotImplementedError, match=needle):
        attention.forward(q, k, v, meta, **kwargs)


def test_default_scale_is_accepted_explicitly():
    mode = FakeTensorMode()
    meta = _fake_metadata(mode, ref.VARLEN)
    q, k, v = _fake_qkv(mode, meta)
    with mode:
        out = attention.forward(q, k, v, meta, softmax_scale=128**-0.5)
    assert out.shape == q.shape


def test_fp8_inputs_not_implemented():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("torch without float8")
    mode = FakeTensorMode()
    meta = _fake_metadata(mode, ref.VARLEN)
    q, k, v = _fake_qkv(mode, meta, torch.float8_e4m3fn)
    with mode, pytest.raises(NotImplementedError, match="FP8 inputs"):
        attention.forward(q, k, v, meta)


def test_backward_options_not_implemented():
    mode = FakeTensorMode()
    meta = _fake_metadata(mode, ref.VARLEN)
    q, k, v = _fake_qkv(mode, meta)
    with mode:
        lse = torch.empty(meta.total_q, 64, device="cuda")
        with pytest.raises(NotImplementedError, match="q_fp8"):
            attention.backward(q, k, v, q, q, lse, meta, q_fp8=q)
        with pytest.raises(NotImplementedError, match="sparse_attn_p_mode"):
            attention.backward(q, k, v, q, q, lse, meta, sparse_attn_p_mode="fp8")
        with pytest.raises(ValueError, match="sparse_attn_p_mode"):
            attention.backward(q, k, v, q, q, lse, meta, sparse_attn_p_mode="int4")


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"use_fp16_score": True}, "use_fp16_score"),
        ({"lse_temperature": 0.5}, "lse_temperature"),
        ({"schedule": object()}, "schedule"),
        ({"workspace": object()}, "workspace"),
    ],
)
def test_indexer_options_not_implemented(kwargs, needle):
    lay = ref.VARLEN
    d = ref.device_layout(lay, "cpu")
    qi = torch.zeros(lay["total_q"], 4, 128, dtype=torch.bfloat16)
    ki = torch.zeros(lay["total_k"], 1, 128, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=needle):
        indexer.forward(
            qi, ki, cu_seqlens_q=d["cu_seqlens_q"], cu_seqlens_kv=d["cu_seqlens_k"],
            max_seqlen_q=lay["max_seqlen_q"], max_seqlen_kv=lay["max_seqlen_k"], **kwargs,
        )


def test_kl_scales_not_implemented():
    mode = FakeTensorMode()
    meta = _fake_metadata(mode, ref.VARLEN)
    with pytest.raises(NotImplementedError, match="indexer_softmax_scale"):
        kl.backward(None, None, None, None, None, None, meta, indexer_softmax_scale=1.0)
    with pytest.raises(NotImplementedError, match="softmax_scale"):
        kl.backward(None, None, None, None, None, None, meta, softmax_scale=1.0)


def test_tree_indexer_not_implemented():
    with pytest.raises(NotImplementedError, match="tree indexer"):
        indexer_tree.forward()
    with pytest.raises(NotImplementedError, match="tree indexer"):
        indexer_tree.compile_plan()


def test_argument_errors_are_value_errors():
    mode = FakeTensorMode()
    meta = _fake_metadata(mode, ref.VARLEN)
    q, k, v = _fake_qkv(mode, meta)
    with mode:
        with pytest.raises(ValueError, match="q must have shape"):
            attention.forward(q[1:], k, v, meta)
        with pytest.raises(ValueError, match="k must be bfloat16"):
            attention.forward(q, k.float(), v, meta)
        with pytest.raises(TypeError, match="AttentionMetadata"):
            attention.forward(q, k, v, object())
        topk = torch.empty(4, 10, 8, dtype=torch.int32, device="cuda")
        with pytest.raises(ValueError, match=r"\[4, total_q, 16\]"):
            attention.prepare(
                topk, meta.cu_seqlens_q, meta.cu_seqlens_k, **ref.prepare_kwargs(ref.VARLEN)
            )


# ---------------------------------------------------------------------------------------------
# compat alias


def test_msa_v1_alias_is_opt_in_and_reversible():
    from msa_torch import compat

    assert "msa_v1" not in sys.modules
    assert compat.install_msa_v1_alias()
    try:
        import msa_v1
        from msa_v1 import attention as a

        assert msa_v1 is msa_torch and a is attention
        assert msa_v1.__all__ == ["attention", "indexer", "indexer_tree", "kl"]
    finally:
        compat.uninstall_msa_v1_alias()
    assert "msa_v1" not in sys.modules


def test_msa_v1_alias_never_shadows_a_real_one(monkeypatch):
    from msa_torch import compat

    real = type(sys)("msa_v1")
    monkeypatch.setitem(sys.modules, "msa_v1", real)
    assert not compat.install_msa_v1_alias()
    assert sys.modules["msa_v1"] is real


def test_reference_helpers_are_consistent():
    # The layouts the GPU tests use satisfy the contract's arithmetic.
    for lay in (ref.VARLEN, ref.FRAGMENTS):
        assert lay["total_rows"] == sum(math.ceil(k / 128) for k in lay["klens"])
        topk = ref.random_topk(lay, 1, empty_fraction=0.05)
        for b in range(len(lay["qlens"])):
            for i, p in enumerate(ref.positions(lay, b)):
                row = topk[:, lay["cu_q"][b] + i]
                valid = row[row >= 0]
                assert (valid <= p // 128).all()
        assert ref.recent_topk(lay).shape == (4, lay["total_q"], 16)


@pytest.mark.parametrize("lay", [ref.VARLEN, ref.FRAGMENTS], ids=["varlen", "fragments"])
def test_real_rank_selections_agree_with_the_small_ones(lay):
    """The vectorized selections of the real-rank GPU tests: recent16 equals the per-query one,
    random follows msa-workloads' rule (n - 1 distinct blocks below L, then L, then -1)."""
    assert torch.equal(ref.recent16_topk(lay, "cpu"), ref.recent_topk(lay))
    topk = ref.random16_topk(lay, seed=3, device="cpu")
    for b in range(len(lay["qlens"])):
        for i, p in enumerate(ref.positions(lay, b)):
            local, n = p // 128, min(p // 128 + 1, 16)
            for h in range(4):
                row = topk[h, lay["cu_q"][b] + i].tolist()
                assert row[n - 1] == local and row[n:] == [-1] * (16 - n), row
                assert len(set(row[: n - 1])) == n - 1 and all(0 <= x < local for x in row[: n - 1])
    assert not torch.equal(topk, ref.random16_topk(lay, seed=4, device="cpu"))


def test_real_ranks_file_matches_the_python_layouts():
    """tests/data/real_ranks.jsonl (msa-workloads' ranks, checked by tests/real_ranks.rs): the
    Python layout arithmetic gives the Rust sizes, and the vectorized recent16 is msa-plan's
    word for word (its checksum)."""
    from pathlib import Path

    ranks = ref.load_real_ranks(Path(__file__).parent / "data" / "real_ranks.jsonl")
    assert len(ranks) >= 2
    for name, (lay, d) in ranks.items():
        for key in ("total_q", "total_k", "total_rows", "max_seqlen_q", "max_seqlen_k"):
            assert lay[key] == d[key], (name, key)
        assert ref.checksum(ref.recent16_topk(lay, "cpu")) == d["recent16_checksum"], name


def test_gathering_reference_equals_the_dense_one():
    """ref.sparse_attention (the real-rank reference, fp32) against the dense reference and its
    autograd backward in fp64, on a small fragmented layout (CPU time: seconds)."""
    # Document A (700 keys): fragments of 30 queries ending at 300 and 700; document B whole.
    lay = ref.layout([0, 30, 60, 90], [0, 300, 700, 850], [0, 0, 2])
    sel = ref.random_topk(lay, seed=5, empty_fraction=0.05)
    g = torch.Generator().manual_seed(6)
    q, dout = (torch.randn(lay["total_q"], 64, 128, generator=g) for _ in range(2))
    k, v = (torch.randn(lay["total_k"], 4, 128, generator=g) for _ in range(2))
    out, lse, dq, dk, dv, used = ref.sparse_attention(lay, sel, q, k, v, dout, chunk=64)
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    want_out, want_lse = ref.attention(lay, sel, qd, kd, vd)
    (want_out * dout.double()).sum().backward()
    torch.testing.assert_close(out.double(), want_out.detach(), atol=1e-5, rtol=1e-5)
    assert torch.equal(torch.isinf(lse), torch.isinf(want_lse))
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(
        lse[finite].double(), want_lse[finite].detach(), atol=1e-5, rtol=1e-5
    )
    for got, want in ((dq, qd.grad), (dk, kd.grad), (dv, vd.grad)):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    assert (dk[~used] == 0).all() and (kd.grad[~used] == 0).all() and used.any()


# ---------------------------------------------------------------------------------------------
# dynamo: the wrappers trace into the ops (no graph break) with fake CUDA tensors


def test_strict_export_traces_prepare_forward_indexer_kl_in_one_graph():
    lay = ref.FRAGMENTS
    kw = ref.prepare_kwargs(lay)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wq = torch.nn.Linear(64, 64 * 128, bias=False, device="cuda")

        def forward(self, x, k, v, topk, cu_q, cu_k, frag, qi, ki):
            q = self.wq(x).view(-1, 64, 128).to(torch.bfloat16)
            meta = attention.prepare(topk, cu_q, cu_k, fragment_indices=frag, **kw)
            out, lse = attention.forward(q, k, v, meta, return_softmax_lse=True)
            _, ilse = indexer.forward(
                qi, ki, cu_seqlens_q=cu_q, cu_seqlens_kv=cu_k, max_seqlen_q=kw["max_seqlen_q"],
                max_seqlen_kv=kw["max_seqlen_k"], fragment_indices=frag,
            )
            dqi, dki = kl.backward(q, k, lse, qi, ki, ilse, meta)
            return out, lse, dqi, dki

    d = ref.device_layout(lay, "cpu")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    t, tk = lay["total_q"], lay["total_k"]
    with mode:
        layer = Layer()
        bf16 = dict(dtype=torch.bfloat16, device="cuda")
        args = (
            torch.empty(t, 64, device="cuda"),
            torch.empty(tk, 4, 128, **bf16),
            torch.empty(tk, 4, 128, **bf16),
            torch.empty(4, t, 16, dtype=torch.int32, device="cuda"),
            *(mode.from_tensor(d[n]).cuda() for n in
              ("cu_seqlens_q", "cu_seqlens_k", "fragment_indices")),
            torch.empty(t, 4, 128, **bf16),
            torch.empty(tk, 1, 128, **bf16),
        )
        ep = torch.export.export(layer, args, strict=True)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    for op in ("prepare", "attention_fwd", "indexer_fwd", "kl_bwd"):
        assert f"msa_torch.{op}.default" in targets, targets


# ---------------------------------------------------------------------------------------------
# the eager fast path (msa_torch._eager)


def test_fast_path_only_for_plain_eager_calls(monkeypatch):
    """The custom ops are bypassed only where nothing can observe it: plain tensors, no mode,
    no transform, not compiling; everything else (and ``enabled = False``) takes the ops."""
    from msa_torch import _eager

    x = torch.zeros(2, 3)
    assert _eager.plain(x, x)
    assert not _eager.plain(x, torch.nn.Parameter(x))
    with FakeTensorMode() as mode:
        assert not _eager.plain(mode.from_tensor(x))
        assert not _eager.plain(x)
    with torch.device("cpu"):
        assert not _eager.plain(x)
    seen = []
    torch.vmap(lambda t: seen.append(_eager.plain(t)) or t)(x)
    assert seen == [False]

    def traced(t):
        return t + 1 if _eager.plain(t) else t - 1

    torch._dynamo.reset()
    assert torch.equal(torch.compile(traced, backend="eager", fullgraph=True)(x), x - 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace, still supported
        assert torch.equal(torch.jit.trace(traced, (x,), check_trace=False)(x), x - 1)
    monkeypatch.setattr(_eager, "enabled", False)
    assert not _eager.plain(x)


def _cpu_metadata(lay):
    """An AttentionMetadata of CPU tensors in prepare's shapes (contents irrelevant)."""
    d = ref.device_layout(lay, "cpu")
    sizes = _C.sizes(lay["total_q"], lay["total_k"], len(lay["qlens"]), lay["total_rows"],
                     lay["max_seqlen_k"], lay["frag"] is not None, _device.FAKE_SM_COUNT)
    ff, qf, bks, bkc, ew, rp, qi, qs, sc, sm, wc, prp, pqi, pv, dws, qo = (
        torch.zeros(shape, dtype=torch.int32) for shape in _ops._prepare_shapes(sizes)
    )
    physical = attention.PhysicalSchedule(prp, pqi, pv)
    return attention.AttentionMetadata(
        topk_indices=torch.zeros(4, lay["total_q"], 16, dtype=torch.int32),
        cu_seqlens_q=d["cu_seqlens_q"], cu_seqlens_k=d["cu_seqlens_k"],
        fragment_indices=d["fragment_indices"], k2q_row_ptr=rp, k2q_q_indices=qi,
        schedule=attention.SparseAttentionSchedule(sm, wc, qs, sc, dws, qo),
        kl_schedule=physical, total_k=lay["total_k"], total_rows=lay["total_rows"],
        max_seqlen_q=lay["max_seqlen_q"], max_seqlen_k=lay["max_seqlen_k"],
        layout=attention.VarlenLayoutTensors(ff, qf, bks, bkc), physical_schedule=physical,
        error_word=ew,
    ), sizes


def test_fast_path_plumbing_against_a_recording_extension(monkeypatch):
    """The fast path's calls of the extension, with CPU tensors standing in for CUDA ones and an
    extension that records instead of launching: argument counts and every view's length as the
    Rust side checks them, the kernel set and backward path, the workspace size, autograd through
    _Attention (backward = the explicit backward's call), and that an explicit backward on
    inputs requiring grad leaves the fast path."""
    from msa_torch import _eager, _ext

    lay = ref.FRAGMENTS
    meta, sizes = _cpu_metadata(lay)
    c = meta._eager_call
    assert c.shape is None, "no fast path for a metadata off CUDA"
    c.shape = _C.CallShape(lay["total_q"], lay["total_k"], len(lay["qlens"]),
                           lay["total_rows"], lay["max_seqlen_k"], True, _device.FAKE_SM_COUNT)
    c._kernels[False] = "sm90a"
    calls = []

    class Recorder:
        backward_path = staticmethod(_C.backward_path)

        @staticmethod
        def forward(*args):
            calls.append(("forward", args))

        @staticmethod
        def backward(*args):
            calls.append(("backward", args))

    monkeypatch.setattr(_ext, "ext", lambda: Recorder)
    monkeypatch.setattr(_eager, "stream", lambda index: 1234)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: c.index)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(lay["total_q"], 64, 128, generator=g).to(torch.bfloat16)
    k = torch.randn(lay["total_k"], 4, 128, generator=g).to(torch.bfloat16)
    v = torch.randn(lay["total_k"], 4, 128, generator=g).to(torch.bfloat16)

    def lengths(views):
        return [n for _, n in views]

    layout_lengths = [sizes["cu_seqlens"]] * 2 + [
        sizes["batch"], sizes["query_fragment"], sizes["block_keys"], sizes["block_keys"]
    ]
    out, lse = attention.forward(q, k, v, meta, return_softmax_lse=True)
    (name, args), = calls
    shape, layout_views, meta_views, qkv, outs, kernels, ws, stream = args
    assert name == "forward" and shape is c.shape and kernels == "sm90a" and stream == 1234
    assert lengths(layout_views) == layout_lengths
    assert [p for p, _ in meta_views] == [t.data_ptr() for t in meta.op_tensors()[6:]]
    assert lengths(meta_views) == [t.numel() for t in meta.op_tensors()[6:]]
    assert lengths(qkv) == [sizes["queries"], sizes["keys"], sizes["keys"]]
    assert [p for p, _ in qkv] == [q.data_ptr(), k.data_ptr(), v.data_ptr()]
    assert lengths(outs) == [sizes["queries"], sizes["query_heads"]]
    assert outs == [(out.data_ptr(), out.numel()), (lse.data_ptr(), lse.numel())]
    assert ws[1] == sizes["forward_workspace_bytes_sm90a"] and (ws[0] != 0) == (ws[1] > 0)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and lse.shape == (614, 64)

    calls.clear()
    dout = torch.randn(lay["total_q"], 64, 128, generator=g).to(torch.bfloat16)
    dq, dk, dv = attention.backward(q, k, v, dout, out, lse, meta, deterministic=True)
    (name, args), = calls
    shape, layout_views, meta_views, qkv, inputs, grads, path, ws, stream = args
    assert name == "backward" and path == "deterministic"
    assert ws[1] == sizes["backward_workspace_bytes_deterministic"]
    assert [p for p, _ in inputs] == [dout.data_ptr(), out.data_ptr(), lse.data_ptr()]
    assert grads == [(x.data_ptr(), x.numel()) for x in (dq, dk, dv)]

    calls.clear()
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out_g = attention.forward(qg, kg, vg, meta)
    assert out_g.requires_grad and type(out_g.grad_fn).__name__ == "_AttentionBackward"
    out_g.backward(dout.transpose(0, 1).contiguous().transpose(0, 1))  # made contiguous
    assert [n for n, _ in calls] == ["forward", "backward"]
    assert calls[1][1][6] == "sm90"  # the default backward on the sm90a kernel set
    assert calls[1][1][4][0][0] != dout.data_ptr()  # the contiguous copy of dout
    assert qg.grad.shape == q.shape and kg.grad.dtype == torch.bfloat16
    out2 = attention.forward(qg, kg, vg, meta)
    (gq,) = torch.autograd.grad(out2, qg, dout, create_graph=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        gq.float().sum().backward()  # a double backward raises, as through the custom op
    assert _eager.backward(qg, kg, vg, dout, out, lse, meta, False, False) is None
