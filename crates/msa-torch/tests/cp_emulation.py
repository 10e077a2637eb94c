"""CP ranks as threads of one process: a :class:`msa_torch.cp.Collectives` whose all-gather and
reduce-scatter meet at a barrier, so one GPU (or the CPU) runs every rank's share of a CP call
with the real per-rank code path.

On a GPU every thread queues on the device's current stream, so the copies a collective makes
are ordered after the producers the other threads queued before the barrier. Autograd is not
for threads here: a CUDA backward runs on the device's one autograd thread, where a rank waiting
at the barrier would block the others; use the explicit ``cp.attention_backward``."""

from __future__ import annotations

import threading

import torch


class _Hub:
    def __init__(self, size: int, timeout: float):
        self.size = size
        self.slots: list = [None] * size
        self.barrier = threading.Barrier(size, timeout=timeout)


class ThreadCollectives:
    """Rank ``rank`` of a group of threads sharing ``hub``."""

    def __init__(self, hub: _Hub, rank: int, device: torch.device):
        self.hub, self._rank, self.device = hub, rank, device

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self.hub.size

    def _exchange(self, t):
        self.hub.slots[self._rank] = t
        self.hub.barrier.wait()
        every = list(self.hub.slots)
        self.hub.barrier.wait()  # nobody overwrites a slot before everyone has read it
        return every

    def all_gather_into_tensor(self, output, input):
        torch.cat(self._exchange(input), out=output)

    def reduce_scatter_tensor(self, output, input):
        every = self._exchange(input)
        n = output.shape[0]
        total = every[0][self._rank * n : (self._rank + 1) * n].clone()
        for t in every[1:]:  # rank order on every rank: one summation order
            total += t[self._rank * n : (self._rank + 1) * n]
        output.copy_(total)


def run_ranks(size: int, fn, device, timeout: float = 600.0) -> list:
    """``[fn(ThreadCollectives of rank r) for r in range(size)]``, each rank in its own thread;
    the first exception of any rank is raised (the barrier is broken so no rank hangs)."""
    hub = _Hub(size, timeout)
    results: list = [None] * size
    errors: list = []

    def body(r):
        try:
            results[r] = fn(ThreadCollectives(hub, r, torch.device(device)))
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)
            hub.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        # A broken barrier in the other ranks is a consequence, not the cause.
        errors.sort(key=lambda e: isinstance(e, threading.BrokenBarrierError))
        raise errors[0]
    return results
