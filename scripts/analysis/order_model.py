#!/usr/bin/env python3
"""The two-builder forward's claim order (forward_sm90.cuh, order_kernel), replayed on random
layouts: each thread j of the one CTA (kOrderThreads) classifies claim j (item grid + j), counts the
first-block ("cheap") claims before it, and writes order[pos] = grid + j; threads then write the
claims past the window. Checked: order is a permutation of the items grid..items-1, the deferred
items are the first min(cheap, kDeferWaves x grid) cheap claims of the window in natural order and
come last, and every other claim keeps natural order.

    python3 scripts/analysis/order_model.py [runs]
"""
import random
import sys

K_DEFER_WAVES = 2


def order(n, grid, cheap, threads):
    """order_kernel's writes, thread by thread; cheap[j]: claim j is a first-block tile."""
    flags = [j < n and cheap[j] for j in range(threads)]
    total = sum(flags)
    d = min(total, K_DEFER_WAVES * grid)
    out = [None] * n
    for j in range(threads):
        before = sum(flags[:j])
        if j < n:
            pos = n - d + before if flags[j] and before < d else j - min(before, d)
            assert out[pos] is None, f"position {pos} written twice"
            out[pos] = grid + j
        for i in range(threads + j, n, threads):
            assert out[i - d] is None, f"position {i - d} written twice"
            out[i - d] = grid + i
    return out, d


def run(seed):
    rng = random.Random(seed)
    threads = rng.choice([4, 8, 32, 64])
    grid = rng.randint(1, 12)
    n = rng.randint(0, 6 * threads)
    p = rng.random()
    cheap = [rng.random() < p for _ in range(max(n, threads))]
    try:
        out, d = order(n, grid, cheap, threads)
    except AssertionError as e:
        return f"seed {seed}: {e}"
    if sorted(x for x in out if x is not None) != list(range(grid, grid + n)) or None in out:
        return f"seed {seed}: not a permutation: {out}"
    window = [j for j in range(min(n, threads)) if cheap[j]]
    deferred = [grid + j for j in window[:d]]
    if out[n - d:] != deferred:
        return f"seed {seed}: last {d} claims {out[n - d:]}, expected {deferred}"
    if out[: n - d] != sorted(out[: n - d]):
        return f"seed {seed}: the other claims are out of natural order"
    return None


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    bad = [r for r in (run(seed) for seed in range(runs)) if r]
    print(f"{runs} layouts, {len(bad)} failures")
    for b in bad[:10]:
        print(" ", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
