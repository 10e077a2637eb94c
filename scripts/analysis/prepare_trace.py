#!/usr/bin/env python3
"""Where the timed prepare's device time goes, from a scripts/device/cupti_trace.c CSV of
`msa bench --stages prepare`: per call, the gap from the setup's last operation to the validation
kernel, the validation kernel, the gap to the reduction, the reduction and the span from the
setup's end to the reduction's. (Kernel launches go through the runtime API, which the tracer does
not record, so the driver-call rows carry no launch times to compare with.)
    python3 scripts/analysis/prepare_trace.py trace.csv[.gz] ..."""
import csv, gzip, statistics, sys


def rows(path):
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        yield from csv.DictReader(f)


def summary(path):
    ops = []
    for r in rows(path):
        if r["kind"] != "driver":
            r["start"], r["end"] = int(r["start_ns"]), int(r["end_ns"])
            ops.append(r)
    ops.sort(key=lambda r: r["start"])
    calls = []
    for i, r in enumerate(ops):
        if r["kind"] != "kernel" or "validate_kernel" not in r["name"]:
            continue
        before = ops[i - 1]
        after = next((x for x in ops[i + 1:] if x["kind"] == "kernel"), None)
        if after is None or "validate_reduce" not in after["name"]:
            continue
        calls.append({
            "pre_gap": (r["start"] - before["end"]) / 1e3,
            "pre_op": before["kind"] + ":" + before["name"][:20],
            "validate": (r["end"] - r["start"]) / 1e3,
            "mid_gap": (after["start"] - r["end"]) / 1e3,
            "reduce": (after["end"] - after["start"]) / 1e3,
            "span": (after["end"] - before["end"]) / 1e3,
        })
    # The bench's timed calls are the last 30 (warmup calls and the metadata build come first).
    timed = calls[-30:]
    print(f"{path}: {len(calls)} validations, the last {len(timed)} summarized (median, min, max us)")
    for key in ("pre_gap", "validate", "mid_gap", "reduce", "span"):
        xs = [c[key] for c in timed]
        print(f"  {key:>9} {statistics.median(xs):8.2f} {min(xs):8.2f} {max(xs):8.2f}")
    print("  op before the validation:", sorted({c["pre_op"] for c in timed}))


for p in sys.argv[1:]:
    summary(p)
