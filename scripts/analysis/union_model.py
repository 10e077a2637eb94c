#!/usr/bin/env python3
"""Lane-by-lane model of the sm_90a forward's union builder (kernels/src/attention/forward_sm90.cuh:
warp_sort128 and build_union_warp), checked against a brute-force union on random tiles: scattered
selections, duplicates and -1 holes, short documents, recent windows. Run it after changing either
function (it mirrors their index arithmetic, not their code).

    python3 scripts/analysis/union_model.py [TRIALS]
"""
import random
import sys

NONE = 0xFFFFFFFF


def sort128(keys):  # keys: list of 32 lanes x 4
    k = [list(x) for x in keys]
    size = 2
    while size <= 128:
        stride = size >> 1
        while stride > 0:
            new = [list(x) for x in k]
            for lane in range(32):
                up = ((4 * lane) & size) == 0
                if stride >= 4:
                    lanes = stride >> 2
                    keep_min = ((lane & lanes) != 0) != up
                    for r in range(4):
                        other = k[lane ^ lanes][r]
                        new[lane][r] = min(k[lane][r], other) if keep_min else max(k[lane][r], other)
                else:
                    for r in range(4):
                        q = r ^ stride
                        if q < r: continue
                        asc = ((r & 2) == 0) if size == 2 else up
                        lo, hi = min(k[lane][r], k[lane][q]), max(k[lane][r], k[lane][q])
                        new[lane][r], new[lane][q] = (lo, hi) if asc else (hi, lo)
            k = new
            stride >>= 1
        size <<= 1
    return k


def union(cands):  # cands[q][s] block or -1 -> entries [(block, mask)]
    keys = [[NONE]*4 for _ in range(32)]
    for lane in range(32):
        qi = lane >> 2
        for r in range(4):
            e = cands[qi][4*(lane & 3) + r]
            if e >= 0: keys[lane][r] = (e << 3) | qi
    k = sort128(keys)
    flat = [x for l in k for x in l]
    assert flat == sorted(flat), "not sorted"
    first = [[False]*4 for _ in range(32)]
    for lane in range(32):
        below = NONE if lane == 0 else k[lane-1][3]
        for r in range(4):
            prev = k[lane][r-1] if r > 0 else below
            first[lane][r] = k[lane][r] != NONE and (k[lane][r] >> 3) != (prev >> 3)
    out = {}
    n = sum(first[l][r] for l in range(32) for r in range(4))
    for lane in range(32):
        rank = sum(first[l][r] for l in range(lane) for r in range(4))
        for r in range(4):
            if not first[lane][r]: continue
            block = k[lane][r] >> 3; mask = 0; i = 4*lane + r
            while i < 128 and (flat[i] >> 3) == block:
                mask |= 1 << (flat[i] & 7); i += 1
            assert rank not in out
            out[rank] = (block, mask); rank += 1
    return [out[i] for i in range(n)]


def brute(cands):
    d = {}
    for q in range(8):
        for e in cands[q]:
            if e >= 0:
                d[e] = d.get(e, 0) | (1 << q)
    return sorted(d.items())


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = random.Random(1)
    for trial in range(trials):
        kind = trial % 4
        cands = []
        for q in range(8):
            if kind == 0:
                row = [rng.randrange(-1, 40) for _ in range(16)]
            elif kind == 1:
                row = rng.sample(range(2000), 16)
            elif kind == 2:
                row = [rng.randrange(0, 3) if rng.random() < 0.2 else -1 for _ in range(16)]
            else:
                row = (list(range(max(0, 100 + q - 15), 100 + q + 1)) + [-1] * 16)[:16]
            cands.append(row)
        assert union(cands) == brute(cands), (trial, cands)
    print(f"union model: {trials} random tiles, union == brute force")


if __name__ == "__main__":
    main()
