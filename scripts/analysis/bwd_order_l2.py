#!/usr/bin/env python3
"""L2 reuse of the sm_90a backward's query-side traffic under two run orders (a model, no GPU).

The main kernel streams tiles of 4 queries x 16 heads through each item (a (group, block) row's
chunk of <= 512 queries); every tile reads Q and dO of its 4 queries (4 KiB each per query) and
reduce-adds their dQ (8 KiB per query): 16 KiB of query-side lines per query and tile. This
models which of those accesses an LRU cache of a given size would hit: items run on 132 CTAs by
static striding (item I on CTA I % 132) or claimed (each item to the CTA that frees first), tiles
+ 2 tile-times each (the estimate of crates/msa-cli's balance report), the accesses are ordered by time, and an access hits when fewer than
capacity / 16 KiB distinct queries were touched since the same query's previous access (LRU
stack distance). One group by default; --groups 4 models the kernel's whole list.

Orders (item ids are block-ascending, queries ascending within a row, as the item build makes
them): "lpt" (main until session 11: common/lpt_order.cuh, tile counts descending with ties in
id order, dealt to the CTAs in a snake), "band" (main since session 11: ties by the first
query's 32nd of T, attention/backward_items.cuh), "lpt-query" (ties by first query), "query"
(items sorted by their first query, no balancing: items whose query sets overlap run together)
and "claim" (session 12: items by band, ties by id, except a longest-first tail of the shortest
whose tiles reach 132 times half the longest item's, claimed by the CTAs as they free up:
common/lpt_order.cuh claim_order; --tail picks another tail).

  python3 scripts/analysis/bwd_order_l2.py [--l2-mib 40] [--groups 4] [--tail mass:0.5|items:264]
Layout: case 151 rank 15 of the development benchmark (one 181,248-key document; 6 fragments
of 2,048 queries), the row where spread's main kernel is 29% slower than recent16's (run 54).
"""
import argparse
import heapq

CU_K = [0, 17408, 50176, 82944, 115712, 148480, 181248]
Q_PER_FRAG = 2048
ITEM, TILE, CTAS, OVERHEAD = 512, 4, 132, 2
TAIL = [0.5, None]  # the claim tail: mass factor, or a fixed item count (--tail)


def positions():
    return [p for k in CU_K[1:] for p in range(k - Q_PER_FRAG, k)]


def selection(pattern, L):
    n = min(16, L + 1)
    if pattern == "recent16":
        return list(range(L + 1 - n, L + 1))
    if pattern == "spread":
        return [k * L // (n - 1) for k in range(n - 1)] + [L] if n > 1 else [L]
    raise ValueError(pattern)


def items_of(pattern, groups):
    """Items of `groups` KV groups (the same selection in each), group-major as the item build
    numbers them; a query of group g is key g * T + q (its lines are the group's 16 heads)."""
    rows = {}
    for q, p in enumerate(positions()):
        for b in selection(pattern, int(p) // 128):
            rows.setdefault(b, []).append(q)
    t = len(positions())
    items = []
    for g in range(groups):
        for b in sorted(rows):
            qs = [g * t + q for q in rows[b]]
            for s in range(0, len(qs), ITEM):
                items.append((b, qs[s:s + ITEM]))
    return items


def snake_position(j, n, grid):
    r = j // grid
    start = r * grid
    c = j - start
    m = min(grid, n - start)
    return start + (m - 1 - c if r & 1 else c)


def run_order(items, order):
    tiles = lambda it: min((len(it[1]) + TILE - 1) // TILE, 128)
    if order == "query":
        return sorted(items, key=lambda it: (it[1][0], it[0]))
    band = lambda i: items[i][1][0] * 32 // len(positions())
    if order == "claim":
        by_band = sorted(range(len(items)), key=lambda i: (band(i), i))
        by_cost = sorted(by_band, key=lambda i: -tiles(items[i]))  # stable: ties keep band order
        need, head = int(CTAS * (tiles(items[by_cost[0]]) if by_cost else 0) * TAIL[0]), len(by_cost)
        mass = 0
        while head > 0 and mass < need:
            head -= 1
            mass += tiles(items[by_cost[head]])
        if TAIL[1] is not None:
            head = len(by_cost) - min(len(by_cost), TAIL[1])
        tail = by_cost[head:]
        in_tail = set(tail)
        return [items[i] for i in by_band if i not in in_tail] + [items[i] for i in tail]
    tie = {"lpt": lambda i: i, "band": lambda i: (band(i), i),
           "lpt-query": lambda i: (items[i][1][0], i)}[order]
    by_cost = sorted(range(len(items)), key=lambda i: (-tiles(items[i]), tie(i)))
    out = [None] * len(items)
    for j, i in enumerate(by_cost):
        out[snake_position(j, len(items), CTAS)] = items[i]
    return out


def accesses(items, claimed):
    start = [0] * CTAS
    free = [(0, c) for c in range(CTAS)]
    ev = []
    for i, (_, qs) in enumerate(items):
        c = heapq.heappop(free)[1] if claimed else i % CTAS
        tiles = (len(qs) + TILE - 1) // TILE
        for j in range(tiles):
            for q in qs[TILE * j:TILE * j + TILE]:
                ev.append((start[c] + j, c, q))
        start[c] += tiles + OVERHEAD
        if claimed:
            heapq.heappush(free, (start[c], c))
    ev.sort()
    return [q for _, _, q in ev], max(start)


def hit_rate(seq, capacity):
    """Share of accesses whose LRU stack distance (distinct keys since the key's last access)
    is below capacity; first touches miss."""
    n = len(seq)
    tree = [0] * (n + 1)

    def add(i, v):
        i += 1
        while i <= n:
            tree[i] += v
            i += i & -i

    def prefix(i):  # sum of [0, i)
        s = 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    last = {}
    hits = 0
    for t, q in enumerate(seq):
        p = last.get(q)
        if p is not None:
            if prefix(t) - prefix(p + 1) < capacity:
                hits += 1
            add(p, -1)
        add(t, 1)
        last[q] = t
    return hits / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--l2-mib", type=float, default=40.0,
                    help="L2 left for query-side lines (H200: 50 MiB, less K/V tiles in flight)")
    ap.add_argument("--groups", type=int, default=1,
                    help="KV groups in one list (the kernel's list holds all 4)")
    ap.add_argument("--tail", default="mass:0.5",
                    help="claim tail: mass:F (F x grid x the longest item's tiles) or items:N")
    a = ap.parse_args()
    kind, val = a.tail.split(":")
    TAIL[:] = [float(val), None] if kind == "mass" else [1.0, int(val)]
    capacity = int(a.l2_mib * 1024 / 16)  # queries of 16 KiB
    print(f"LRU capacity {capacity} queries ({a.l2_mib} MiB / 16 KiB)")
    print("pattern   order      items  accesses  makespan(tiles)  hit rate")
    for pattern in ["recent16", "spread"]:
        items = items_of(pattern, a.groups)
        for order in ["lpt", "band", "lpt-query", "query", "claim"]:
            its = run_order(items, order)
            seq, span = accesses(its, order == "claim")
            print(f"{pattern:9} {order:10} {len(its):6} {len(seq):9} {span:12}  {hit_rate(seq, capacity):8.3f}")


if __name__ == "__main__":
    main()
