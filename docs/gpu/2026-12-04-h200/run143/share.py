"""#12's pre/post share per build from runs 143-144's logs: ncu per-launch durations of the delta
preprocess, the epilogue and (where the build has it) backward_zero_dq_kernel, in launch order
(one backward call per row), plus the memset by CUDA events for `main` (the one build that
memsets the whole accumulator; gz* builds zero it in the kernel or by the zero kernel), against
the backward's medians over both bench rounds. Usage: share.py DIR BUILD..."""
import json
import re
import statistics
import sys

s = sys.argv[1]
memset = float(re.findall(r"([\d.]+) us", open(f"{s}/memset.log").read())[0])
for build in sys.argv[2:]:
    dur = []
    kern = None
    for line in open(f"{s}/ncu-{build}.log"):
        m = re.search(r"(preprocess|epilogue|zero_dq)", line)
        if m and "(" in line:
            kern = {"preprocess": "delta", "epilogue": "epilogue", "zero_dq": "zero"}[m.group(1)]
        m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
        if m and kern:
            unit, v = m.group(1).lower(), float(m.group(2).replace(",", ""))
            dur.append((kern, v / 1e3 if unit.startswith("n") else v * 1e3 if unit.startswith("m") else v))
            kern = None
    rows = {}
    for r in ("r1", "r2"):
        for line in open(f"{s}/{build}-{r}.jsonl"):
            d = json.loads(line)
            if d.get("record") == "case":
                st = {x["stage"]: x["median_ms"] * 1e3 for x in d["stages"]}
                rows.setdefault(d["case"], []).append((st["backward"], st["backward_det"], d["weight"]))
    # Per row: delta, [zero], epilogue in launch order.
    per = []
    cur = {}
    for k, v in dur:
        cur[k] = v
        if k == "epilogue":
            per.append(cur)
            cur = {}
    has_zero = any("zero" in p for p in per)
    uses_memset = build == "main"
    num = den = dden = 0.0
    print(f"== {build}: {len(per)} rows from ncu, {f'memset {memset:.1f} us' if uses_memset else 'zero kernel' if has_zero else 'zeroed in the kernel'}")
    for (case, v), p in zip(rows.items(), per):
        bwd = statistics.mean(x[0] for x in v)
        det = statistics.mean(x[1] for x in v)
        w = v[0][2]
        pp = p["delta"] + p["epilogue"] + (memset if uses_memset else p.get("zero", 0.0))
        num += w * pp
        den += w * bwd
        dden += w * det
        print(f"{case:>26} delta {p['delta']:6.1f} zero {memset if uses_memset else p.get('zero', 0.0):6.1f} epilogue {p['epilogue']:6.1f}"
              f" pre+post {pp:6.1f} us  backward {bwd:7.1f} us  share {100 * pp / bwd:5.2f}%")
    if den:
        print(f"{build}: weighted pre/post share {100 * num / den:.2f}% of the backward, "
              f"{100 * num / dden:.2f}% of the deterministic one")
