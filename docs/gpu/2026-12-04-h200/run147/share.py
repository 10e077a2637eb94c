"""#12's pre/post share from run 147: ncu per-launch durations of the delta preprocess and the
epilogue (one backward call per row, launch order = the suite's row order), against the backward
medians of final-check's bench.jsonl (same kernels, same call). The dQ accumulator is zeroed inside
the main kernel, so nothing else runs before or after it. Usage: share.py NCU_LOG BENCH_JSONL"""
import json
import re
import sys

dur, kern = [], None
for line in open(sys.argv[1]):
    m = re.search(r"(preprocess|epilogue)_kernel", line)
    if m and "(" in line and "==PROF==" not in line:
        kern = m.group(1)
    m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and kern:
        unit, v = m.group(1).lower(), float(m.group(2).replace(",", ""))
        dur.append((kern, v / 1e3 if unit.startswith("n") else v * 1e3 if unit.startswith("m") else v))
        kern = None
per = [dict(dur[i : i + 2]) for i in range(0, len(dur), 2)]
rows = []
for line in open(sys.argv[2]):
    d = json.loads(line)
    if d.get("record") == "case":
        st = {x["stage"]: x["median_ms"] * 1e3 for x in d["stages"]}
        rows.append((d["case"], st["backward"], st["backward_det"], d["weight"]))
assert len(rows) == len(per), (len(rows), len(per))
num = den = dden = 0.0
for (case, bwd, det, w), p in zip(rows, per):
    pp = p["preprocess"] + p["epilogue"]
    num, den, dden = num + w * pp, den + w * bwd, dden + w * det
    print(f"{case:>26} delta {p['preprocess']:6.1f} epilogue {p['epilogue']:6.1f} us  backward {bwd:7.1f} us  share {100 * pp / bwd:5.2f}%")
print(f"weighted pre/post share {100 * num / den:.2f}% of the backward, {100 * num / dden:.2f}% of the deterministic one")
