#!/usr/bin/env python3
"""Random interleavings of docs/next/fwd-builders.patch's slot protocol on one CTA, against
deadlock, lost or repeated items and a sentinel ahead of a tile: two builders claim items from a
shared counter (other CTAs' claims interleaved), take slot indices from a shared counter, wait
for their slot's previous tile to be taken, publish; the loaders take slots in index order and
stop at the sentinel; consumers free the K stages in order (loaded). The claim gate counts built
blocks plus kClaimWeight per claimed item not yet built (returned by a claim that finds no item);
it is checked at kAheadShort and at every tighter setting.

    python3 scripts/analysis/builders_model.py [runs]
"""
import random
import sys

K_SLOTS, K_AHEAD, K_WEIGHT, BUILDERS = 4, 4, 2, 2  # forward_sm90.cuh: kSlots, kAheadShort, kClaimWeight
GATES = (1, 2, 3, K_AHEAD)  # the gate at kAheadShort and below: no setting may deadlock


def run(seed):
    rng = random.Random(seed)
    gate = GATES[seed % len(GATES)]
    grid = rng.randint(1, 6)  # CTAs; this model runs CTA 0, the others only claim
    items = rng.randint(grid, 60)  # the launch has min(items, SMs) CTAs
    sizes = [rng.choice([0, 1, 1, 2, 3, 4, 30, 100]) for _ in range(items)]
    counter = [0]
    s = dict(ahead=0, loaded=0, next_slot=0, finished=0)
    published = {}  # slot index -> item (-1: sentinel)
    taken = set()   # slot indices the loaders have taken
    seen = []
    claimed = [0]  # CTA 0's first item, by its index

    def claim():
        s["ahead"] += K_WEIGHT
        v = grid + counter[0]
        counter[0] += 1
        if v < items:
            claimed.append(v)
        return v

    def builder(bid):
        item = 0 if bid == 0 else claim()
        if bid == 0:
            s["ahead"] += K_WEIGHT
        while True:
            if item >= items:
                s["ahead"] -= K_WEIGHT  # the claim that found no item
                s["finished"] += 1
                if s["finished"] != BUILDERS:
                    return
                n = s["next_slot"]; s["next_slot"] += 1
                while n >= K_SLOTS and (n - K_SLOTS) not in taken:
                    yield
                published[n] = -1
                return
            n = s["next_slot"]; s["next_slot"] += 1
            while n >= K_SLOTS and (n - K_SLOTS) not in taken:
                yield
            yield  # the build takes time
            published[n] = item
            s["ahead"] += sizes[item] - K_WEIGHT
            while s["ahead"] - s["loaded"] >= gate:
                yield
            item = claim()

    def loader():
        n = 0
        while True:
            while n not in published:
                yield
            it = published[n]
            taken.add(n)
            if it < 0:
                return
            seen.append(it)
            for _ in range(sizes[it]):  # K loads as the consumers free stages
                yield
                s["loaded"] += 1
            n += 1

    def others():  # the other CTAs' claims
        while counter[0] + grid < items + 2 * grid:
            yield
            if rng.random() < 0.3:
                counter[0] += 1

    actors = [builder(0), builder(1), loader(), others()]
    live = list(actors)
    steps = 0
    while live:
        a = rng.choice(live)
        try:
            next(a)
        except StopIteration:
            live.remove(a)
        steps += 1
        if steps > 200000:
            return f"seed {seed}: no progress (deadlock), seen {len(seen)}"
    mine = [i for i in seen]
    if len(mine) != len(set(mine)):
        return f"seed {seed}: an item twice"
    if any(i >= items for i in mine):
        return f"seed {seed}: an item out of range"
    sentinel = [n for n, v in published.items() if v < 0]
    if len(sentinel) != 1 or max(published) != sentinel[0]:
        return f"seed {seed}: sentinel {sentinel} not after every tile"
    if sorted(mine) != sorted(claimed):
        return f"seed {seed}: claimed {sorted(claimed)} but loaded {sorted(mine)}"
    return None


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    bad = [r for r in (run(seed) for seed in range(runs)) if r]
    print(f"{runs} interleavings, {len(bad)} failures")
    for b in bad[:10]:
        print(" ", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
