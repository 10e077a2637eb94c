"""Host tests of msa_torch.nemo (no GPU needed): names and signatures against NeMo's
``minimax_m3_vl.kernels`` (shared/spec/nemo-kernels.md §4-§6), the memoized probes and the gate on
fake device properties (the torch probe is patched, not the module), the unavailable error, the
schedule helpers (msa-plan's mirrors, through the extension) against NeMo's rules written out
here, the schedule checks against the Rust ones, the task build on a small schedule, and the
errors on CPU tensors."""

import importlib.util
import inspect
import itertools
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import msa_torch
from msa_torch import _C, _device, _ext, nemo

P = inspect.Parameter
POS, KW = P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY
E = P.empty

# NeMo's signatures: (name, kind, default).
NEMO_SIGNATURES = {
    "sm_capability": [("device", POS, E)],
    "sm_count": [("device", POS, E)],
    "require_sm100": [("device", POS, E)],
    "rows_per_cta": [("num_rows", POS, E)],
    "chunk_map": [("num_rows", POS, E), ("rows_per_cta", POS, E), ("num_sms", POS, E)],
    "grid_launch_bound": [("capacity", POS, E), ("num_sms", POS, E)],
    "task_build_storage": [
        ("schedule", POS, E), ("num_tokens", POS, E), ("workspace_rows", POS, E),
    ],
    "build_backward_tasks": [
        ("schedule", POS, E), ("num_tokens", POS, E), ("workspace_rows", POS, E),
        ("num_sms", KW, E), ("scratch", KW, E), ("tables", KW, E),
    ],
    "run_preprocess": [("out", POS, E), ("grad_out", POS, E), ("delta", POS, E)],
    "run_backward": [
        ("q", POS, E), ("k_aligned", POS, E), ("v_aligned", POS, E), ("grad_out", POS, E),
        ("lse", POS, E), ("out", POS, E), ("schedule", POS, E),
    ],
    "run_grad_finalize": [
        ("dq_pool", POS, E), ("dq_out", POS, E), ("kv_pool", POS, E), ("kv_out", POS, E),
    ],
    "sparse_attention": [
        ("q", POS, E), ("k", POS, E), ("v", POS, E), ("q2k", POS, E), ("msa", POS, E),
    ],
}


@pytest.mark.parametrize("name", sorted(NEMO_SIGNATURES))
def test_signature_matches_nemo(name):
    params = inspect.signature(getattr(nemo, name)).parameters.values()
    assert [(p.name, p.kind, p.default) for p in params] == NEMO_SIGNATURES[name]
    assert name in nemo.__all__


def test_constants_and_schedule_fields_match_nemo():
    n = nemo
    assert (n.BLOCK_SIZE, n.HEAD_DIM, n.NUM_Q_HEADS, n.NUM_KV_HEADS) == (128, 128, 64, 4)
    assert (n.NUM_INDEX_HEADS, n.INDEX_DIM, n.TOPK_BLOCKS, n.QUERY_CHUNK) == (4, 128, 16, 8)
    assert nemo.SOFTMAX_SCALE == 0.08838834764831845
    fields = [f for f in nemo.MSABackwardSchedule.__dataclass_fields__]
    assert fields[:6] == [
        "row_ptr", "q_indices", "scheduler_metadata", "work_count", "cu_seqlens",
        "document_workspace_starts",
    ]
    assert nemo.MSABackwardTaskTables._fields == (
        "task_meta", "task_qrows", "task_qpos", "desc", "grid_launch"
    )
    assert msa_torch.nemo is nemo and "nemo" not in msa_torch.__all__


# ---- probes and the gate (torch.cuda's probe faked)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A fake CUDA device 0 whose capability the test sets; counts probe calls."""
    state = {"capability": (9, 0), "calls": 0, "sms": 132}

    def capability(index):
        state["calls"] += 1
        return state["capability"]

    class Props:
        @property
        def multi_processor_count(self):
            state["calls"] += 1
            return state["sms"]

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    nemo._capability.cache_clear()
    nemo._multiprocessors.cache_clear()
    yield state
    nemo._capability.cache_clear()
    nemo._multiprocessors.cache_clear()


def test_probes_are_memoized_per_device(fake_gpu):
    assert nemo.sm_capability(torch.device("cuda", 0)) == (9, 0)
    assert nemo.sm_capability(torch.device("cuda", 0)) == (9, 0)
    assert nemo.sm_capability("cuda") == (9, 0)  # no index: the current device, same entry
    assert fake_gpu["calls"] == 1
    assert nemo.sm_count(torch.device("cuda", 0)) == 132
    assert nemo.sm_count(torch.device("cuda", 0)) == 132
    assert fake_gpu["calls"] == 2
    fake_gpu["capability"] = (8, 0)
    assert nemo.sm_capability(torch.device("cuda", 1)) == (8, 0)
    assert nemo.sm_capability(torch.device("cuda", 0)) == (9, 0)


@pytest.mark.parametrize("cap", [(m, n) for m in range(5, 13) for n in range(0, 10)])
def test_gate_accepts_exactly_what_the_build_serves(fake_gpu, cap):
    fake_gpu["capability"] = cap
    served = _C.served_by(*cap)
    if served is not None:
        nemo.require_served(torch.device("cuda", 0))
        return
    with pytest.raises(NotImplementedError) as e:
        nemo.require_sm100(torch.device("cuda", 0))
    assert isinstance(e.value, _device.UnsupportedDeviceError)
    msg = str(e.value)
    assert msg.startswith("MiniMax M3 MSA (msa-rs) supports compute capability ")
    assert f"got compute capability {cap[0]}.{cap[1]} on cuda:0." in msg
    assert msg.endswith("Use sparse_attn='generic' on this GPU.")


def test_gate_serves_hopper_and_ampere_of_this_build(fake_gpu):
    archs = msa_torch.built_archs()
    if "sm_90a" in archs:
        assert _C.served_by(9, 0) == "sm_90a"
    if "sm_80" in archs:
        assert _C.served_by(8, 6) == "sm_80"
    fake_gpu["capability"] = (7, 5)
    with pytest.raises(NotImplementedError, match=r"9\.0 \(sm_90a kernels\)"):
        nemo.require_served(torch.device("cuda", 0))


def test_gate_rejects_a_cpu_device():
    with pytest.raises(NotImplementedError, match="runs on CUDA devices only; got cpu"):
        nemo.require_served(torch.device("cpu"))
    with pytest.raises(_device.UnsupportedDeviceError):
        nemo.sm_count("cpu")


def test_unavailable_error_without_the_extension(monkeypatch):
    monkeypatch.setattr(_ext, "_C", None)
    monkeypatch.setattr(_ext, "IMPORT_ERROR", ImportError("no module named msa_torch._C"))
    for call in (
        lambda: nemo.require_extension(),
        lambda: nemo.rows_per_cta(10),
        lambda: nemo.chunk_map(10, 4, 132),
        lambda: nemo.grid_launch_bound(10, 132),
    ):
        with pytest.raises(nemo.UnavailableError) as e:
            call()
        assert str(e.value).startswith(nemo.MSA_KERNEL_IMPORT_ERROR)
        assert "no module named msa_torch._C" in str(e.value)
        assert isinstance(e.value, msa_torch.ExtensionUnavailableError)


# ---- schedule helpers against NeMo's rules (spec §4.3-§4.5)


def nemo_rows_per_cta(n):
    return 4 if n <= 2400 else 64


def nemo_chunk_map(num_rows, rows_per_cta, num_sms):
    num_chunks = -(-num_rows // rows_per_cta)
    num_full = min((num_chunks // num_sms) * num_sms, num_rows // rows_per_cta)
    rows_left = num_rows - num_full * rows_per_cta
    if rows_left <= 0:
        return (num_full, 1, num_full)
    tail = -(-rows_left // num_sms)
    if tail < 3:
        return (0, rows_per_cta, num_chunks)
    return (num_full, tail, num_full + -(-rows_left // tail))


def nemo_grid_launch_bound(capacity, num_sms):
    return max(min(capacity, 2400) // 4, capacity // 64) + num_sms


def walk_rows(num_rows, rpc, sms):
    """Rows of every CTA of the walk (spec §4.4's interval), for the exact-cover check."""
    full, tail, grid = nemo.chunk_map(num_rows, rpc, sms)
    covered = []
    for b in range(grid):
        lo, hi = b * rpc, min(b * rpc + rpc, num_rows)
        if b >= full:
            lo = full * rpc + (b - full) * tail
            hi = min(lo + tail, num_rows)
        covered.extend(range(lo, hi))
    return covered


ROW_COUNTS = sorted(
    set(range(0, 300))
    | {599, 600, 2399, 2400, 2401, 10000, 56000, 100000, 250000}
    | set(random.Random(13).sample(range(300, 400000), 400))
)


def test_schedule_helpers_equal_nemo_rules():
    for n in ROW_COUNTS:
        assert nemo.rows_per_cta(n) == nemo_rows_per_cta(n)
        for sms in (1, 2, 7, 78, 108, 114, 132, 148):
            for rpc in (1, 4, 8, 64, nemo.rows_per_cta(n)):
                assert nemo.chunk_map(n, rpc, sms) == nemo_chunk_map(n, rpc, sms), (n, rpc, sms)
            assert nemo.grid_launch_bound(n, sms) == nemo_grid_launch_bound(n, sms)
            # NeMo's bound: every task count up to capacity fits.
            assert nemo.chunk_map(n, nemo.rows_per_cta(n), sms)[2] <= nemo.grid_launch_bound(n, sms)


def test_chunk_map_worked_examples_and_exact_cover():
    table = {0: (0, 1, 0), 1: (0, 4, 1), 600: (0, 4, 150), 2400: (0, 4, 600),
             2401: (0, 17, 142), 10000: (148, 4, 280), 56000: (740, 59, 887),
             100000: (1480, 36, 1627)}
    for n, want in table.items():
        assert nemo.chunk_map(n, nemo.rows_per_cta(n), 148) == want
    assert nemo.grid_launch_bound(100000, 148) == 1710
    for n, sms in itertools.product((0, 1, 5, 599, 2401, 10000, 56000), (7, 132, 148)):
        assert walk_rows(n, nemo.rows_per_cta(n), sms) == list(range(n))
    assert nemo.rows_per_cta(nemo.ROWS_PER_CTA_SWITCH) == nemo.ROWS_PER_CTA_SMALL
    assert nemo.rows_per_cta(nemo.ROWS_PER_CTA_SWITCH + 1) == nemo.ROWS_PER_CTA_LARGE
    with pytest.raises(ValueError, match="num_sms > 0"):
        nemo.chunk_map(10, 4, 0)


# ---- the schedule, task storage and task build


def i32(*shape, fill=0):
    return torch.full(shape, fill, dtype=torch.int32)


def local_schedule(lengths):
    """A schedule where every query selects only its own block, per index head: one work item
    per (head, document block); documents packed back to back, 128-aligned in the workspace."""
    cu, dws, rows = [0], [], []
    for d, n in enumerate(lengths):
        dws.append(sum(-(-m // 128) for m in lengths[:d]) * 128)
        rows += [(d, b, min(128, n - 128 * b)) for b in range(-(-n // 128))]
        cu.append(cu[-1] + n)
    r = len(rows)
    counts = [c for _, _, c in rows]
    row_ptr = torch.tensor([0] + list(itertools.accumulate(counts)), dtype=torch.int32)
    q_idx = torch.tensor([128 * b + i for _, b, c in rows for i in range(c)], dtype=torch.int32)
    work = [(h, j, 0, c, d, b) for h in range(4) for j, (d, b, c) in enumerate(rows)]
    return nemo.MSABackwardSchedule(
        row_ptr.expand(4, r + 1).contiguous(),
        q_idx.expand(4, -1).contiguous(),
        torch.tensor(work, dtype=torch.int32),
        torch.tensor([len(work)], dtype=torch.int32),
        torch.tensor(cu, dtype=torch.int32),
        torch.tensor(dws, dtype=torch.int32),
    )


SHAPES = {
    "row_ptr": [(4, 2), (4, 9), (3, 9), (4, 1), (4,), (4, 2, 1)],
    "q_indices": [(4, 1), (4, 7), (5, 7), (4, 0), (4,)],
    "scheduler_metadata": [(1, 6), (9, 6), (9, 5), (0, 6), (6,)],
    "work_count": [(1,), (2,), (1, 1), ()],
    "cu_seqlens": [(2,), (4,), (1,), (2, 1)],
    "document_workspace_starts": [(1,), (3,), (0,), (2,)],
}


def test_schedule_checks_equal_the_rust_ones():
    names = list(SHAPES)
    base = {"row_ptr": (4, 9), "q_indices": (4, 7), "scheduler_metadata": (9, 6),
            "work_count": (1,), "cu_seqlens": (4,), "document_workspace_starts": (3,)}
    cases = [dict(base)]
    for name in names:
        for shape in SHAPES[name]:
            cases.append({**base, name: shape})
    for shapes in cases:
        parts = [([0] * int(torch.Size(shapes[n]).numel()), list(shapes[n])) for n in names]
        try:
            _C.check_backward_schedule(parts)
            rust = None
        except ValueError as e:
            rust = str(e)
        try:
            nemo.MSABackwardSchedule(*(i32(*shapes[n]) for n in names))
            py = None
        except ValueError as e:
            py = str(e)
        assert py == rust, shapes


def test_schedule_rejects_non_int32():
    s = local_schedule([300])
    with pytest.raises(TypeError, match="row_ptr must be int32, got torch.int64"):
        nemo.MSABackwardSchedule(s.row_ptr.long(), *[getattr(s, f) for f in (
            "q_indices", "scheduler_metadata", "work_count", "cu_seqlens",
            "document_workspace_starts")])


def test_task_build_storage_and_bins_limit():
    s = local_schedule([300, 50, 129])
    t, w = 479, 384 + 128 + 256
    cap = 4 * s.q_indices.shape[1] // 8 + s.scheduler_metadata.shape[0]
    bins = 4 * -(-t // 512) * (w // 128)
    assert nemo.task_build_storage(s, t, w) == (8 + 24 + cap + 4 * bins + 3 * cap, cap * 20)
    with pytest.raises(ValueError, match="multiple of 128"):
        nemo.task_build_storage(s, t, w + 1)
    with pytest.raises(ValueError, match="at most 4194304 locality bins per microbatch"):
        nemo.task_build_storage(s, 600_000, 600_064)


def test_build_backward_tasks_covers_every_edge_once():
    lengths = [300, 50, 129]
    s = local_schedule(lengths)
    t, w = sum(lengths), 768
    scratch_words, table_words = nemo.task_build_storage(s, t, w)
    scratch, tables = i32(scratch_words + 5, fill=7), i32(table_words, fill=7)
    out = nemo.build_backward_tasks(s, t, w, num_sms=132, scratch=scratch, tables=tables)
    n = int(out.desc[6])
    blocks = [min(128, m - 128 * b) for m in lengths for b in range(-(-m // 128))]
    assert n == 4 * sum(-(-c // 8) for c in blocks)
    assert int(out.desc[7]) == 0  # no overflow, segments contiguous
    assert out.grid_launch == nemo.grid_launch_bound(out.task_meta.shape[0], 132)
    rpc = nemo.rows_per_cta(n)
    assert tuple(out.desc[:5].tolist()) == (n, rpc, *nemo.chunk_map(n, rpc, 132))
    meta, qrows, qpos = out.task_meta[:n], out.task_qrows[:n], out.task_qpos[:n]
    assert (meta[:, 0] == 0).all() and int(meta[:, 3].sum()) == 4 * t
    for h in range(4):
        mine = meta[:, 1] == h
        rows = qrows[mine][qrows[mine] >= 0].sort().values
        assert rows.tolist() == list(range(t))  # every (head, query) edge exactly once
    assert (out.task_meta[n:] == -1).all()
    assert int(scratch[-1]) == 7  # nothing past the scratch words is written
    # qpos is the workspace row of the same query: qrow - cu[doc] + workspace start of doc.
    shift = torch.repeat_interleave(
        s.document_workspace_starts - s.cu_seqlens[:-1], torch.tensor(lengths)
    )
    valid = qrows >= 0
    assert ((qpos >= 0) == valid).all()
    assert torch.equal(qpos[valid] - qrows[valid], shift[qrows[valid].long()])


# ---- errors on CPU tensors


class Microbatch:
    """The two fields of NeMo's MSAMicrobatch sparse_attention reads."""

    def __init__(self, cu_seqlens, max_seqlen):
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = max_seqlen


def test_sparse_attention_errors():
    t = 200
    bf = dict(dtype=torch.bfloat16)
    q = torch.zeros(t, 64, 128, **bf)
    k, v = torch.zeros(t, 4, 128, **bf), torch.zeros(t, 4, 128, **bf)
    q2k = i32(4, t, 16, fill=-1)
    mb = Microbatch(torch.tensor([0, t], dtype=torch.int32), t)
    with pytest.raises(_device.UnsupportedDeviceError, match="q is on cpu"):
        nemo.sparse_attention(q, k, v, q2k, mb)
    with pytest.raises(ValueError, match="first supports BF16 q/k/v only; got q=torch.float32"):
        nemo.sparse_attention(q.float(), k, v, q2k, mb)
    shape = r"must have shape \(4, T, 16\) for q with T tokens; got \(4, 200, 8\)"
    with pytest.raises(ValueError, match=shape):
        nemo.sparse_attention(q, k, v, q2k[..., :8], mb)


def test_backward_stages_reject_cpu_tensors():
    out = torch.zeros(8, 64, 128, dtype=torch.bfloat16)
    delta = torch.zeros(8, 64)
    with pytest.raises(_device.UnsupportedDeviceError, match="out is on cpu"):
        nemo.run_preprocess(out, out, delta)
    with pytest.raises(_device.UnsupportedDeviceError, match="dq_pool is on cpu"):
        pools = torch.zeros(8, 32, 128, 2), out, torch.zeros(2048), torch.zeros(2048)
        nemo.run_grad_finalize(*pools)
    s = local_schedule([8])
    with pytest.raises(ValueError, match="needs schedule.metadata"):
        nemo.run_backward(out, out, out, out, delta, out, s)


# ---- the training-step example


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_step.py"


def _load_example():
    spec = importlib.util.spec_from_file_location("train_step_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_refuses_without_a_gpu(monkeypatch):
    example = _load_example()
    assert example.REAL_RANKS.is_file()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        example.main(["--rank", "c434r2"])
    assert str(e.value).startswith("train_step.py: cannot run here: torch sees no CUDA device")


def test_example_flop_model_matches_the_contract():
    example = _load_example()
    pos = torch.tensor([0, 127, 128, 2047, 2048, 5000])
    s = sum(min(p + 1, 1920 + p % 128 + 1) for p in pos.tolist())
    c = sum(p + 1 for p in pos.tolist())
    f = example.flop_model(pos)
    assert f["attention forward"] == 2 * 256 * 64 * s and f["indexer"] == 2 * 128 * 4 * c
    assert f["attention backward"] == 2 * 640 * 64 * s and f["KL backward"] == 2 * (8192 + 1536) * s


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a host without a GPU")
def test_example_script_exits_with_the_reason():
    r = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "train_step.py: cannot run here:" in r.stderr, r.stderr
