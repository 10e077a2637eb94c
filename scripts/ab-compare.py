#!/usr/bin/env python3
"""Per-row useful TFLOP/s of two `msa bench --json` files (old, new) and the new/old speed ratio.

    python3 scripts/ab-compare.py OLD.jsonl NEW.jsonl [stage ...]
"""
import json
import sys


def load(path):
    rows, order = {}, []
    for line in open(path):
        r = json.loads(line)
        if r.get("record") != "case":
            continue
        case = f"{r['case']} {r.get('pattern', '')}".strip()  # one file may hold several patterns
        order.append(case)
        for s in r["stages"]:
            rows[(case, s["stage"])] = s
    return rows, order


def main():
    old, _ = load(sys.argv[1])
    new, order = load(sys.argv[2])
    stages = sys.argv[3:] or sorted({s for _, s in new if s != "prepare"})
    print("case".ljust(34) + "".join(f"{s:>30}" for s in stages))
    for case in order:
        cells = []
        for s in stages:
            a, b = old.get((case, s)), new.get((case, s))
            if a is None or b is None:
                cells.append(f"{'-':>30}")
                continue
            ratio = a["median_ms"] / b["median_ms"]
            cells.append(f"{a.get('useful_tflops', 0):8.1f} -> {b.get('useful_tflops', 0):6.1f} ({ratio:5.3f}x)")
        print(case.ljust(34) + "".join(f"{c:>30}" for c in cells))


if __name__ == "__main__":
    main()
