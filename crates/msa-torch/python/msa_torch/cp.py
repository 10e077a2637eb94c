"""Context parallelism: one MSA call spread over the ranks of a ``torch.distributed`` process
group, equal to the call over the whole pack (TransformerEngine's KV all-gather scheme).

A pack of ``T`` tokens (``cu_seqlens`` of its documents) is cut into ``chunk_size``-token chunks
dealt to the ranks (:func:`split_pack`: MSA's Magi min-heap dispatch, the rule of
``crates/msa-workloads/src/cp.rs``, so every rank gets the layout msa-rs's Rust side builds).
Rank ``r`` holds the tokens of its chunks, ascending (``ChunkMap.local_token_index(r)``); its
queries are those tokens, its keys the K/V prefix of every document it touches, packed as CP
fragments (``cu_seqlens_q``, ``cu_seqlens_k``, ``fragment_indices``).

Per rank (:class:`CpPlan`): the forward all-gathers the local k, v (and the indexer's ki) over
the group and builds the rank's packed K/V by index; the local msa_torch calls (indexer,
prepare, attention, KL) run on the packed layout; the backward scatters the packed dK/dV (dKI)
into a zeroed full-length fp32 buffer and reduce-scatters it (sum), so each rank gets the
gradients of its own tokens, accumulated in fp32 and rounded once.

    cmap = msa_torch.cp.split_pack(cu_seqlens, cp_size=dist.get_world_size(group))
    plan = msa_torch.cp.CpPlan(cmap, group)          # rank = the group's rank
    idx = plan.local_token_index                      # the rank's rows of the whole pack
    topk, ilse = cp.indexer_forward(qi, ki, plan)     # qi, ki, q, k, v: local rows
    meta = cp.prepare(topk, plan)
    out, lse = cp.attention_forward(q, k, v, meta, plan, return_softmax_lse=True)  # autograd
    dqi, dki = cp.kl_backward(q, k, lse, qi, ki, ilse, meta, plan)

``local_ops`` (a :class:`LocalOps`) is what runs on each rank, by default the msa-rs kernels
(:data:`KERNELS`); the CPU tests pass a pure-torch reference. ``group`` may be any object with
the :class:`Collectives` methods instead of a process group (the GPU tests drive two ranks from
two threads of one process that way).
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
from dataclasses import dataclass
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

import torch
import torch.distributed as dist
from torch import Tensor

from . import attention, indexer, kl

__all__ = [
    "ChunkMap",
    "Collectives",
    "CpPlan",
    "Fragment",
    "KERNELS",
    "LocalOps",
    "RankLayout",
    "attention_backward",
    "attention_forward",
    "chunk_workloads",
    "indexer_forward",
    "kl_backward",
    "magi_dispatch",
    "prepare",
    "prepare_unchecked",
    "split_pack",
]

#: MSA's chunk length (its 192K CP16 scenario).
CHUNK_SIZE = 1024
_BLOCK = 128


# ---------------------------------------------------------------------------------------------
# the split (crates/msa-workloads/src/cp.rs, line for line)


def _check_cu_seqlens(cu: Sequence[int]) -> list[int]:
    cu = [int(x) for x in cu]
    if len(cu) < 2:
        raise ValueError(f"cu_seqlens needs at least 2 entries (one document), got {len(cu)}")
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[0]}")
    for i in range(len(cu) - 1):
        if cu[i + 1] <= cu[i]:
            raise ValueError(
                f"cu_seqlens must be strictly increasing; entry {i + 1} (= {cu[i + 1]}) <= "
                f"entry {i} (= {cu[i]})"
            )
    if cu[-1] > 2**31 - 1:
        raise ValueError(f"cu_seqlens: {cu[-1]} tokens do not fit int32")
    return cu


def _overlaps(cu: Sequence[int], begin: int, end: int):
    """``(doc, local_begin, local_end)`` of every document overlapping global ``[begin, end)``."""
    d = bisect.bisect_right(cu, begin) - 1
    while d < len(cu) - 1 and cu[d] < end:
        start = cu[d]
        yield d, max(begin, start) - start, min(end, cu[d + 1]) - start
        d += 1


def chunk_workloads(cu_seqlens: Sequence[int], chunk_size: int = CHUNK_SIZE) -> list[int]:
    """Causal area of every chunk: the sum over its queries of (document position + 1)."""
    cu = _check_cu_seqlens(cu_seqlens)
    total = cu[-1]
    return [
        sum(
            (lb + 1 + le) * (le - lb) // 2
            for _, lb, le in _overlaps(cu, c * chunk_size, min((c + 1) * chunk_size, total))
        )
        for c in range(-(-total // chunk_size))
    ]


def magi_dispatch(workloads: Sequence[int], cp_size: int) -> list[list[int]]:
    """MSA's Magi min-heap dispatch: chunks by workload descending (a stable ascending sort,
    reversed, so ties go to the higher chunk id first) each go to the least-loaded rank (lowest
    rank on a tie) holding fewer than ceil(chunks / cp_size) chunks. Each rank's chunks,
    ascending."""
    if cp_size < 1:
        raise ValueError(f"cp_size must be >= 1, got {cp_size}")
    cap = -(-len(workloads) // cp_size)
    order = sorted(range(len(workloads)), key=lambda c: workloads[c])
    order.reverse()
    heap = [(0, r) for r in range(cp_size)]
    chunks: list[list[int]] = [[] for _ in range(cp_size)]
    for c in order:
        # Full ranks leave the heap; cap * cp_size >= chunks keeps it non-empty.
        while True:
            load, r = heapq.heappop(heap)
            if len(chunks[r]) < cap:
                break
        chunks[r].append(c)
        heapq.heappush(heap, (load + workloads[c], r))
    for lst in chunks:
        lst.sort()
    return chunks


@dataclass(frozen=True)
class Fragment:
    """A maximal run of one document's tokens inside a rank's chunks (runs in consecutive chunks
    merged): document tokens ``[local_begin, local_end)``, at global tokens from
    ``global_begin``."""

    doc: int
    local_begin: int
    local_end: int
    global_begin: int


@dataclass(frozen=True)
class RankLayout:
    """The packed layout of one rank (the ``RankCase`` of crates/msa-workloads): its queries are
    its chunks' tokens in order, its keys each touched document's prefix
    ``kv_source_ranges[d] = [doc_begin, doc_begin + last fragment's local_end)``."""

    rank: int
    chunks: tuple[int, ...]
    fragments: tuple[Fragment, ...]
    kv_source_ranges: tuple[tuple[int, int], ...]
    cu_seqlens_q: tuple[int, ...]
    cu_seqlens_k: tuple[int, ...]
    fragment_indices: tuple[int, ...]
    total_q: int
    total_k: int
    total_rows: int
    max_seqlen_q: int
    max_seqlen_k: int

    @property
    def batch(self) -> int:
        return len(self.fragments)


def _rank_layout(rank: int, chunks: Sequence[int], cu: Sequence[int], chunk_size: int):
    frags: list[list[int]] = []  # [doc, local_begin, local_end, global_begin]
    for c in chunks:
        for doc, lb, le in _overlaps(cu, c * chunk_size, (c + 1) * chunk_size):
            if frags and frags[-1][0] == doc and frags[-1][2] == lb:
                frags[-1][2] = le
            else:
                frags.append([doc, lb, le, cu[doc] + lb])
    fragments = tuple(Fragment(*f) for f in frags)
    cu_q = [0]
    for f in fragments:
        cu_q.append(cu_q[-1] + f.local_end - f.local_begin)
    # A document's fragments are consecutive (ascending chunks): packing documents in order of
    # first appearance keeps the fragment order, and its last fragment ends furthest.
    cu_k, fragment_indices, kv_ranges = [0], [], []
    i = 0
    while i < len(fragments):
        j = i
        while j < len(fragments) and fragments[j].doc == fragments[i].doc:
            j += 1
        base = cu_k[-1]
        for f in fragments[i:j]:
            cu_k.append(base + f.local_end)
            fragment_indices.append(i)
        doc_begin = fragments[i].global_begin - fragments[i].local_begin
        kv_ranges.append((doc_begin, doc_begin + fragments[j - 1].local_end))
        i = j
    return RankLayout(
        rank=rank,
        chunks=tuple(chunks),
        fragments=fragments,
        kv_source_ranges=tuple(kv_ranges),
        cu_seqlens_q=tuple(cu_q),
        cu_seqlens_k=tuple(cu_k),
        fragment_indices=tuple(fragment_indices),
        total_q=cu_q[-1],
        total_k=cu_k[-1],
        total_rows=sum(-(-f.local_end // _BLOCK) for f in fragments),
        max_seqlen_q=max(f.local_end - f.local_begin for f in fragments),
        max_seqlen_k=max(f.local_end for f in fragments),
    )


class ChunkMap:
    """Which rank holds which ``chunk_size``-token chunk of a pack. The pack must be a whole
    number of chunks, every chunk dealt exactly once, every rank the same number of chunks
    (the all-gather and reduce-scatter move equal shares), each rank's list ascending (its
    local tokens are its chunks in that order). :func:`split_pack` builds MSA's map."""

    def __init__(
        self,
        cu_seqlens: Sequence[int],
        rank_chunks: Sequence[Sequence[int]],
        chunk_size: int = CHUNK_SIZE,
    ):
        cu = _check_cu_seqlens(cu_seqlens)
        total, cp = cu[-1], len(rank_chunks)
        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        chunk_size = int(chunk_size)
        if cp < 1:
            raise ValueError("the chunk map needs at least one rank")
        if total % chunk_size or (total // chunk_size) % cp:
            raise ValueError(
                f"{total} tokens do not split into chunks of {chunk_size} dealt evenly over {cp} "
                "ranks (pad the pack to a multiple of chunk_size * cp_size)"
            )
        n = total // chunk_size
        owner = [-1] * n
        for r, lst in enumerate(rank_chunks):
            lst = [int(c) for c in lst]
            if len(lst) != n // cp:
                raise ValueError(
                    f"rank {r} holds {len(lst)} chunks; every rank must hold {n // cp} "
                    f"({n} chunks over {cp} ranks)"
                )
            if lst != sorted(lst):
                raise ValueError(
                    f"rank {r}'s chunks {lst} are not ascending (a rank's local tokens are its "
                    "chunks in ascending order)"
                )
            for c in lst:
                if not 0 <= c < n:
                    raise ValueError(f"rank {r} holds chunk {c}, outside [0, {n})")
                if owner[c] >= 0:
                    raise ValueError(f"chunk {c} is dealt to ranks {owner[c]} and {r}")
                owner[c] = r
        self.cu_seqlens: tuple[int, ...] = tuple(cu)
        self.chunk_size = chunk_size
        self.rank_chunks: tuple[tuple[int, ...], ...] = tuple(
            tuple(int(c) for c in lst) for lst in rank_chunks
        )
        self._layouts: dict[int, RankLayout] = {}

    @property
    def cp_size(self) -> int:
        return len(self.rank_chunks)

    @property
    def total_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def tokens_per_rank(self) -> int:
        return self.total_tokens // self.cp_size

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChunkMap) and (
            self.cu_seqlens,
            self.chunk_size,
            self.rank_chunks,
        ) == (other.cu_seqlens, other.chunk_size, other.rank_chunks)

    def __hash__(self) -> int:
        return hash((self.cu_seqlens, self.chunk_size, self.rank_chunks))

    def __repr__(self) -> str:
        return (
            f"ChunkMap({self.total_tokens} tokens, {len(self.cu_seqlens) - 1} documents, "
            f"chunk_size={self.chunk_size}, cp_size={self.cp_size})"
        )

    def digest(self) -> int:
        """A signed 63-bit digest of the map (ranks compare it in :class:`CpPlan`)."""
        h = hashlib.blake2b(
            repr((self.cu_seqlens, self.chunk_size, self.rank_chunks)).encode(), digest_size=8
        ).digest()
        return int.from_bytes(h, "little") >> 1

    def _rank_in_range(self, rank: int) -> int:
        if not 0 <= int(rank) < self.cp_size:
            raise ValueError(f"rank {rank} is out of range (CP size {self.cp_size})")
        return int(rank)

    def rank_layout(self, rank: int) -> RankLayout:
        """The packed layout of ``rank`` (cached)."""
        rank = self._rank_in_range(rank)
        if rank not in self._layouts:
            self._layouts[rank] = _rank_layout(
                rank, self.rank_chunks[rank], self.cu_seqlens, self.chunk_size
            )
        return self._layouts[rank]

    def local_token_index(self, rank: int) -> Tensor:
        """int64 ``[tokens_per_rank]``: the pack tokens of ``rank``'s local rows, in order
        (``x_local = x_pack[index]``)."""
        rank = self._rank_in_range(rank)
        cs = self.chunk_size
        starts = torch.tensor(self.rank_chunks[rank], dtype=torch.int64) * cs
        return (starts[:, None] + torch.arange(cs, dtype=torch.int64)).reshape(-1)

    def gathered_kv_index(self, rank: int) -> Tensor:
        """int64 ``[rank_layout(rank).total_k]``: for each packed K/V row of ``rank``, its row
        in the all-gathered buffer (rank-major: rank ``s``'s local rows at
        ``[s * tokens_per_rank, (s + 1) * tokens_per_rank)``). The rows are distinct."""
        lay = self.rank_layout(rank)
        cs = self.chunk_size
        base = torch.empty(self.total_tokens // cs, dtype=torch.int64)  # per chunk
        for s, lst in enumerate(self.rank_chunks):
            for pos, c in enumerate(lst):
                base[c] = s * self.tokens_per_rank + pos * cs
        g = torch.cat([torch.arange(b, e, dtype=torch.int64) for b, e in lay.kv_source_ranges])
        return base[g // cs] + g % cs


def split_pack(
    cu_seqlens: Sequence[int] | Tensor, cp_size: int, chunk_size: int = CHUNK_SIZE
) -> ChunkMap:
    """MSA's split of a pack over ``cp_size`` ranks (``datas/training/cases.py``, msa-workloads'
    ``split_pack``): chunks of ``chunk_size`` tokens, dealt by :func:`magi_dispatch` of their
    :func:`chunk_workloads`. The pack must split into a whole number of chunks per rank."""
    if isinstance(cu_seqlens, Tensor):
        cu_seqlens = cu_seqlens.tolist()
    cu = _check_cu_seqlens(cu_seqlens)
    if int(cp_size) < 1 or int(chunk_size) < 1:
        raise ValueError(f"cp_size and chunk_size must be >= 1, got {cp_size} and {chunk_size}")
    total = cu[-1]
    if total % chunk_size or (total // chunk_size) % cp_size:
        raise ValueError(
            f"{total} tokens do not split into chunks of {chunk_size} dealt evenly over "
            f"{cp_size} ranks (pad the pack to a multiple of chunk_size * cp_size)"
        )
    return ChunkMap(cu, magi_dispatch(chunk_workloads(cu, chunk_size), cp_size), chunk_size)


# ---------------------------------------------------------------------------------------------
# collectives


@runtime_checkable
class Collectives(Protocol):
    """What :class:`CpPlan` needs of a communicator (a ``torch.distributed`` process group is
    wrapped into one). ``device``: where the plan puts its one control tensor (the chunk map
    digest) for the check at construction."""

    device: torch.device

    def rank(self) -> int: ...

    def size(self) -> int: ...

    def all_gather_into_tensor(self, output: Tensor, input: Tensor) -> None:
        """``output[s * n : (s + 1) * n] = input of rank s`` for ``n = input.shape[0]``."""

    def reduce_scatter_tensor(self, output: Tensor, input: Tensor) -> None:
        """``output = sum over ranks s of input_s[rank * n : (rank + 1) * n]``."""


def _cuda_only(backend: str) -> bool:
    """Whether a process group's backend string (``"nccl"``, ``"gloo"``,
    ``"cpu:gloo,cuda:nccl"``) moves CUDA tensors only."""
    if ":" not in backend:
        return backend == "nccl"
    devices = {p.split(":", 1)[0] for p in backend.split(",")}
    return devices == {"cuda"}


class _ProcessGroup:
    """:class:`Collectives` over a ``torch.distributed`` process group."""

    def __init__(self, group):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "msa_torch.cp: torch.distributed is not initialized; call "
                "torch.distributed.init_process_group first (or pass a Collectives)"
            )
        self.group = group if group is not None else dist.group.WORLD
        self._rank = dist.get_rank(self.group)
        if self._rank < 0:
            raise ValueError("msa_torch.cp: this process is not a member of the process group")
        self._size = dist.get_world_size(self.group)
        backend = str(dist.get_backend(self.group))
        self._cuda_only = _cuda_only(backend)
        self.backend = backend
        if self._cuda_only:
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device("cpu")

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def check(self, op: str, name: str, t: Tensor) -> None:
        if self._cuda_only and t.device.type != "cuda":
            raise ValueError(
                f"msa_torch.cp.{op}: {name} is on {t.device} but the process group's backend "
                f"({self.backend}) moves CUDA tensors only"
            )

    def all_gather_into_tensor(self, output: Tensor, input: Tensor) -> None:
        dist.all_gather_into_tensor(output, input, group=self.group)

    def reduce_scatter_tensor(self, output: Tensor, input: Tensor) -> None:
        dist.reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=self.group)


# ---------------------------------------------------------------------------------------------
# per-rank calls


@dataclass(frozen=True)
class LocalOps:
    """The per-rank calls, with msa_torch's signatures (:data:`KERNELS`: the msa-rs kernels).
    ``attention_forward`` must be differentiable in k and v (autograd carries dK, dV back
    through the all-gather)."""

    prepare: Callable[..., Any]
    prepare_unchecked: Callable[..., Any]
    attention_forward: Callable[..., Any]
    attention_backward: Callable[..., Any]
    indexer_forward: Callable[..., Any]
    kl_backward: Callable[..., Any]


KERNELS = LocalOps(
    prepare=attention.prepare,
    prepare_unchecked=attention.prepare_unchecked,
    attention_forward=attention.forward,
    attention_backward=attention.backward,
    indexer_forward=indexer.forward,
    kl_backward=kl.backward,
)


class _GatherPacked(torch.autograd.Function):
    """Local rows -> the rank's packed K/V rows (all-gather, index); backward: packed grads ->
    local grads (scatter into a zeroed fp32 full buffer, reduce-scatter, one rounding)."""

    @staticmethod
    def forward(ctx, plan: "CpPlan", *xs: Tensor):
        ctx.plan = plan
        ctx.dtypes = [x.dtype for x in xs]
        return tuple(plan._gather_one(x) for x in xs)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        # Materialized grads (zeros for an unused output): every rank runs every collective.
        return (None, *ctx.plan._reduce_scatter(grads, ctx.dtypes))


class CpPlan:
    """One rank's share of a context-parallel MSA call: the chunk map, the process group (or
    :class:`Collectives`), the rank's :class:`RankLayout` and the per-rank calls.

    ``group`` defaults to the default process group; its size must be ``chunk_map.cp_size`` and
    this process's rank in it is the plan's rank. ``verify`` (default) all-gathers a digest of
    the chunk map once and raises if the ranks disagree (a small collective and a host
    synchronization; pass ``False`` where every rank is known to build the same map).
    ``local_ops`` replaces the per-rank calls (default :data:`KERNELS`)."""

    def __init__(
        self,
        chunk_map: ChunkMap,
        group=None,
        *,
        verify: bool = True,
        local_ops: Optional[LocalOps] = None,
    ):
        if not isinstance(chunk_map, ChunkMap):
            raise TypeError(
                f"msa_torch.cp.CpPlan: chunk_map must be a ChunkMap (msa_torch.cp.split_pack), "
                f"got {type(chunk_map).__name__}"
            )
        if group is None or isinstance(group, dist.ProcessGroup):
            comm = _ProcessGroup(group)
        elif isinstance(group, Collectives):
            comm = group
        else:
            raise TypeError(
                f"msa_torch.cp.CpPlan: group must be a torch.distributed ProcessGroup, None (the "
                f"default group) or a Collectives, got {type(group).__name__}"
            )
        if comm.size() != chunk_map.cp_size:
            raise ValueError(
                f"msa_torch.cp.CpPlan: the process group has {comm.size()} ranks but the chunk "
                f"map deals the pack to {chunk_map.cp_size}"
            )
        self.chunk_map = chunk_map
        self.comm = comm
        self.rank = comm.rank()
        self.layout = chunk_map.rank_layout(self.rank)
        self.local_ops = KERNELS if local_ops is None else local_ops
        if not isinstance(self.local_ops, LocalOps):
            raise TypeError(
                f"msa_torch.cp.CpPlan: local_ops must be a LocalOps, got "
                f"{type(self.local_ops).__name__}"
            )
        self._device_tensors: dict[torch.device, tuple[Tensor, ...]] = {}
        if verify:
            self._verify()

    def _verify(self) -> None:
        mine = torch.tensor([self.chunk_map.digest()], dtype=torch.int64, device=self.comm.device)
        every = torch.empty(self.comm.size(), dtype=torch.int64, device=self.comm.device)
        self.comm.all_gather_into_tensor(every, mine)
        every = every.tolist()
        bad = [s for s, d in enumerate(every) if d != every[self.rank]]
        if bad:
            raise ValueError(
                f"msa_torch.cp.CpPlan: ranks {bad} built another chunk map than rank "
                f"{self.rank} ({self.chunk_map!r}); every rank must split the same pack the "
                "same way"
            )

    @property
    def total_q(self) -> int:
        """The rank's local rows (queries), ``chunk_map.tokens_per_rank``."""
        return self.layout.total_q

    @property
    def local_token_index(self) -> Tensor:
        """int64: the pack tokens of this rank's rows, in order."""
        return self.chunk_map.local_token_index(self.rank)

    def _tensors(self, device: torch.device) -> tuple[Tensor, ...]:
        """``(cu_seqlens_q, cu_seqlens_k, fragment_indices, gathered_kv_index)`` on ``device``
        (built once per device)."""
        if device not in self._device_tensors:
            lay = self.layout
            i32 = dict(dtype=torch.int32, device=device)
            self._device_tensors[device] = (
                torch.tensor(lay.cu_seqlens_q, **i32),
                torch.tensor(lay.cu_seqlens_k, **i32),
                torch.tensor(lay.fragment_indices, **i32),
                self.chunk_map.gathered_kv_index(self.rank).to(device),
            )
        return self._device_tensors[device]

    def _check_local(self, op: str, name: str, t: Tensor) -> None:
        if not isinstance(t, Tensor):
            raise TypeError(f"msa_torch.cp.{op}: {name} must be a torch.Tensor")
        if t.dim() == 0 or t.shape[0] != self.total_q:
            raise ValueError(
                f"msa_torch.cp.{op}: {name} must hold the rank's {self.total_q} local rows "
                f"(chunks {list(self.layout.chunks)} of {self.chunk_map.chunk_size} tokens), got "
                f"shape {list(t.shape)}"
            )
        check = getattr(self.comm, "check", None)
        if check is not None:
            check(op, name, t)

    def _check_packed(self, op: str, name: str, t: Tensor) -> None:
        if not isinstance(t, Tensor) or t.dim() == 0 or t.shape[0] != self.layout.total_k:
            shape = list(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(
                f"msa_torch.cp.{op}: {name} must be the rank's packed rows "
                f"[{self.layout.total_k}, ...] (CpPlan.gather), got {shape}"
            )

    def _gather_one(self, x: Tensor) -> Tensor:
        full = x.new_empty((self.comm.size() * x.shape[0], *x.shape[1:]))
        self.comm.all_gather_into_tensor(full, x.contiguous())
        return full.index_select(0, self._tensors(x.device)[3])

    def _reduce_scatter(self, grads: Sequence[Tensor], dtypes: Sequence[torch.dtype]):
        out = []
        for g, dtype in zip(grads, dtypes):
            index = self._tensors(g.device)[3]
            acc = torch.promote_types(dtype, torch.float32)
            full = g.new_zeros((self.comm.size() * self.total_q, *g.shape[1:]), dtype=acc)
            # The rank's packed rows are distinct rows of the full buffer.
            full.index_copy_(0, index, g.to(acc))
            local = g.new_empty((self.total_q, *g.shape[1:]), dtype=acc)
            self.comm.reduce_scatter_tensor(local, full)
            out.append(local.to(dtype))
        return out

    def gather(self, *local: Tensor) -> tuple[Tensor, ...]:
        """The rank's packed rows ``[layout.total_k, ...]`` of each local tensor
        ``[total_q, ...]`` (one all-gather each). Differentiable: the backward reduce-scatters
        the packed gradients (fp32 sum, rounded once to the input's dtype)."""
        for i, x in enumerate(local):
            self._check_local("gather", f"tensor {i}", x)
        return _GatherPacked.apply(self, *local)

    def reduce_scatter(
        self, *packed: Tensor, dtype: Optional[torch.dtype] = None
    ) -> tuple[Tensor, ...]:
        """Each rank's local rows of the sum over ranks of the packed gradients ``packed``
        (``[layout.total_k, ...]``): scattered into a zeroed fp32 full buffer, reduce-scattered,
        rounded once to ``dtype`` (default: each input's)."""
        for i, g in enumerate(packed):
            self._check_packed("reduce_scatter", f"tensor {i}", g)
            check = getattr(self.comm, "check", None)
            if check is not None:
                check("reduce_scatter", f"tensor {i}", g)
        return tuple(
            self._reduce_scatter(packed, [dtype or g.dtype for g in packed])
        )

    def layout_kwargs(self, device: torch.device) -> dict:
        """``cu_seqlens_q``, ``cu_seqlens_k``, ``fragment_indices`` (int32 on ``device``) and the
        integers of :func:`msa_torch.attention.prepare`, for the rank's layout."""
        cu_q, cu_k, frag, _ = self._tensors(device)
        lay = self.layout
        return dict(
            cu_seqlens_q=cu_q,
            cu_seqlens_k=cu_k,
            fragment_indices=frag,
            total_k=lay.total_k,
            total_rows=lay.total_rows,
            max_seqlen_q=lay.max_seqlen_q,
            max_seqlen_k=lay.max_seqlen_k,
        )


def _check_plan(op: str, plan) -> CpPlan:
    if not isinstance(plan, CpPlan):
        raise TypeError(f"msa_torch.cp.{op}: plan must be a CpPlan, got {type(plan).__name__}")
    return plan


def _check_metadata(op: str, plan: CpPlan, metadata) -> None:
    total_k = getattr(metadata, "total_k", None)
    total_q = getattr(metadata, "total_q", None)
    if (total_q, total_k) != (plan.total_q, plan.layout.total_k):
        raise ValueError(
            f"msa_torch.cp.{op}: the metadata is for {total_q} queries over {total_k} keys, the "
            f"plan's rank {plan.rank} has {plan.total_q} over {plan.layout.total_k}: build it "
            "with msa_torch.cp.prepare(topk, plan)"
        )


# ---------------------------------------------------------------------------------------------
# CP versions of the msa_v1 calls


def indexer_forward(
    qi: Tensor,
    ki: Tensor,
    plan: CpPlan,
    *,
    ki_packed: Optional[Tensor] = None,
    lse_temperature: float = 1.0,
    deterministic: bool = False,
    use_fp16_score: bool = False,
):
    """:func:`msa_torch.indexer.forward` of the rank's queries over its packed keys: ``(topk
    int32 [4, total_q, 16], selected_lse f32 [4, total_q])`` for local ``qi [total_q, 4, 128]``
    and local ``ki [total_q, 1, 128]`` (all-gathered here, or pass the rank's ``ki_packed``
    from :meth:`CpPlan.gather`). Not differentiable (the KL backward gives dki)."""
    op = "indexer_forward"
    plan = _check_plan(op, plan)
    plan._check_local(op, "qi", qi)
    plan._check_local(op, "ki", ki)
    if ki_packed is None:
        with torch.no_grad():
            (ki_packed,) = plan.gather(ki.detach())
    plan._check_packed(op, "ki_packed", ki_packed)
    kw = plan.layout_kwargs(qi.device)
    return plan.local_ops.indexer_forward(
        qi,
        ki_packed,
        cu_seqlens_q=kw["cu_seqlens_q"],
        cu_seqlens_kv=kw["cu_seqlens_k"],
        max_seqlen_q=kw["max_seqlen_q"],
        max_seqlen_kv=kw["max_seqlen_k"],
        fragment_indices=kw["fragment_indices"],
        lse_temperature=lse_temperature,
        deterministic=deterministic,
        use_fp16_score=use_fp16_score,
    )


def _prepare(op: str, fn_name: str, topk_indices: Tensor, plan, prepare_kl_schedule: bool):
    plan = _check_plan(op, plan)
    if not isinstance(topk_indices, Tensor) or topk_indices.dim() != 3:
        raise ValueError(f"msa_torch.cp.{op}: topk_indices must be [4, total_q, 16]")
    if topk_indices.shape[1] != plan.total_q:
        raise ValueError(
            f"msa_torch.cp.{op}: topk_indices covers {topk_indices.shape[1]} queries, the "
            f"plan's rank {plan.rank} has {plan.total_q}"
        )
    return getattr(plan.local_ops, fn_name)(
        topk_indices,
        prepare_kl_schedule=prepare_kl_schedule,
        **plan.layout_kwargs(topk_indices.device),
    )


def prepare(topk_indices: Tensor, plan: CpPlan, *, prepare_kl_schedule: bool = True):
    """:func:`msa_torch.attention.prepare` on the rank's layout (no communication):
    ``topk_indices`` int32 ``[4, total_q, 16]`` of the rank's queries, document-local block
    ids as in the whole pack. Validates the selection (a synchronization)."""
    return _prepare("prepare", "prepare", topk_indices, plan, prepare_kl_schedule)


def prepare_unchecked(topk_indices: Tensor, plan: CpPlan, *, prepare_kl_schedule: bool = True):
    """:func:`prepare` without the validation (:func:`msa_torch.attention.prepare_unchecked`)."""
    return _prepare(
        "prepare_unchecked", "prepare_unchecked", topk_indices, plan, prepare_kl_schedule
    )


def attention_forward(q: Tensor, k: Tensor, v: Tensor, metadata, plan: CpPlan, **kwargs):
    """:func:`msa_torch.attention.forward` of the rank's queries: local ``q [total_q, 64,
    128]``, ``k``, ``v [total_q, 4, 128]`` (all-gathered and packed here), the rank's
    ``metadata`` (:func:`prepare`); keyword arguments as msa_torch's. Differentiable in q, k, v:
    dq stays local, dk and dv are reduce-scattered to their ranks in the backward."""
    op = "attention_forward"
    plan = _check_plan(op, plan)
    for name, t in (("q", q), ("k", k), ("v", v)):
        plan._check_local(op, name, t)
    _check_metadata(op, plan, metadata)
    k_packed, v_packed = plan.gather(k, v)
    return plan.local_ops.attention_forward(q, k_packed, v_packed, metadata, **kwargs)


def attention_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dout: Tensor,
    out: Tensor,
    lse: Tensor,
    metadata,
    plan: CpPlan,
    *,
    k_packed: Optional[Tensor] = None,
    v_packed: Optional[Tensor] = None,
    **kwargs,
):
    """:func:`msa_torch.attention.backward` of the rank's queries, explicit: ``(dq, dk, dv)``
    of the rank's local rows (dk, dv reduce-scattered over the group). ``k``, ``v`` are local
    (all-gathered here unless the rank's ``k_packed`` / ``v_packed`` are given)."""
    op = "attention_backward"
    plan = _check_plan(op, plan)
    for name, t in (("q", q), ("k", k), ("v", v), ("dout", dout), ("out", out), ("lse", lse)):
        plan._check_local(op, name, t)
    _check_metadata(op, plan, metadata)
    with torch.no_grad():
        if k_packed is None:
            (k_packed,) = plan.gather(k.detach())
        if v_packed is None:
            (v_packed,) = plan.gather(v.detach())
    plan._check_packed(op, "k_packed", k_packed)
    plan._check_packed(op, "v_packed", v_packed)
    dq, dk_packed, dv_packed = plan.local_ops.attention_backward(
        q, k_packed, v_packed, dout, out, lse, metadata, **kwargs
    )
    dk, dv = plan._reduce_scatter((dk_packed, dv_packed), (k.dtype, v.dtype))
    return dq, dk, dv


def kl_backward(
    q: Tensor,
    k: Tensor,
    teacher_lse: Tensor,
    qi: Tensor,
    ki: Tensor,
    indexer_lse: Tensor,
    metadata,
    plan: CpPlan,
    *,
    k_packed: Optional[Tensor] = None,
    ki_packed: Optional[Tensor] = None,
    loss_coeff: float = 1.0,
    **kwargs,
):
    """:func:`msa_torch.kl.backward` of the whole pack's loss, ``loss_coeff / (4 T) * sum`` over
    the pack's ``T`` queries, for the rank's rows: ``(dqi [total_q, 4, 128], dki [total_q, 1,
    128])`` (dki reduce-scattered over the group). Each rank's local call normalizes by its own
    queries, so it runs with ``loss_coeff * total_q / T``; a framework that averages gradients
    over the CP ranks (and so wants each rank's local mean) passes ``loss_coeff * cp_size``.
    ``q``, ``k``, ``qi``, ``ki``, ``teacher_lse`` (``[total_q, 64]``) and ``indexer_lse``
    (``[4, total_q]``) are the rank's; k and ki are all-gathered here unless ``k_packed`` /
    ``ki_packed`` are given."""
    op = "kl_backward"
    plan = _check_plan(op, plan)
    for name, t in (("q", q), ("k", k), ("teacher_lse", teacher_lse), ("qi", qi), ("ki", ki)):
        plan._check_local(op, name, t)
    if not isinstance(indexer_lse, Tensor) or indexer_lse.dim() != 2 or (
        indexer_lse.shape[1] != plan.total_q
    ):
        raise ValueError(
            f"msa_torch.cp.{op}: indexer_lse must be [4, {plan.total_q}] (the rank's queries)"
        )
    _check_metadata(op, plan, metadata)
    with torch.no_grad():
        if k_packed is None:
            (k_packed,) = plan.gather(k.detach())
        if ki_packed is None:
            (ki_packed,) = plan.gather(ki.detach())
    plan._check_packed(op, "k_packed", k_packed)
    plan._check_packed(op, "ki_packed", ki_packed)
    local_coeff = float(loss_coeff) * plan.total_q / plan.chunk_map.total_tokens
    dqi, dki_packed = plan.local_ops.kl_backward(
        q, k_packed, teacher_lse, qi, ki_packed, indexer_lse, metadata,
        loss_coeff=local_coeff, **kwargs,
    )
    (dki,) = plan._reduce_scatter((dki_packed,), (ki.dtype,))
    return dqi, dki
