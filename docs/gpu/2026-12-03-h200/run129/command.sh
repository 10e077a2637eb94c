#!/usr/bin/env bash
# Run 129 (session 26): #12's pre/post share on main 2dd5e63 (backward kernels as in session 19),
# measured as run 64 / run 91 did: ncu per-launch durations of the delta preprocess and the
# epilogue on all 32 development rows (recent16, unmodified clocks), the dQ accumulator's memset by
# CUDA events (scripts/device/memset_rate.py), and the backward's medians (5 calls) on a quiet GPU;
# the share weighted as MSA weights the rows.
# Built here: bash scripts/build-variants.sh main=- (run 128's bundle). Carried: .gpu-bundle.
set -u; R="$PWD"
bash scripts/device/unpack-variants.sh
S="$OUT/s"; mkdir -p "$S"
(cd .gpu-bundle/var/main && timeout 150 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 \
  --stages backward,backward_det --warmup 1 --iters 5 --json "$S/bench.jsonl" > "$S/bench.log" 2>&1; echo "bench rc=$?")
timeout 60 python3 scripts/device/memset_rate.py > "$S/memset.log" 2>&1; echo "memset rc=$?"; cat "$S/memset.log"
(cd .gpu-bundle/var/main && timeout 90 ncu --clock-control none -k regex:"preprocess|epilogue" --metrics gpu__time_duration.sum \
  ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 --stages backward --warmup 0 --iters 1 \
  > "$S/ncu.log" 2>&1; echo "ncu rc=$?")
python3 - "$S" <<'PY'
import json, re, sys
s = sys.argv[1]
rows = [json.loads(l) for l in open(f"{s}/bench.jsonl")]
rows = [d for d in rows if d.get("record") == "case"]
# ncu lists kernels in launch order: per row one preprocess and one epilogue (backward stage only).
dur = []
kern = None
for line in open(f"{s}/ncu.log"):
    if re.search(r"(preprocess|epilogue)\w*\(", line) or re.search(r"(preprocess|epilogue)_kernel", line):
        kern = "delta" if "preprocess" in line else "epilogue"
    m = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
    if m and kern:
        unit, v = m.group(1).lower(), float(m.group(2).replace(",", ""))
        us = v / 1e3 if unit.startswith("n") else v * 1e3 if unit.startswith("m") else v
        dur.append((kern, us)); kern = None
delta = [v for k, v in dur if k == "delta"]; epi = [v for k, v in dur if k == "epilogue"]
ms = re.findall(r"([\d.]+) us", open(f"{s}/memset.log").read())
memset = float(ms[0]) if ms else float("nan")
print(f"{len(rows)} rows, {len(delta)} delta, {len(epi)} epilogue launches; memset {memset} us")
num = den = dnum = dden = 0.0
for d, dl, ep in zip(rows, delta, epi):
    st = {x["stage"]: x["median_ms"] * 1e3 for x in d["stages"]}
    w = d["weight"]; pp = dl + memset + ep
    num += w * pp; den += w * st["backward"]; dden += w * st["backward_det"]
    print(f"{d['case']:>26} delta {dl:6.1f} epilogue {ep:6.1f} pre+post {pp:6.1f} us  backward {st['backward']:7.1f} us  share {100 * pp / st['backward']:5.2f}%")
if den:
    print(f"weighted pre/post share: {100 * num / den:.2f}% of the backward, {100 * num / dden:.2f}% of the deterministic one")
PY
sed -n "/^summary/,/^prepare as/p" "$S/bench.log" | head -8
(cd "$OUT" && tar czf s.tgz s && rm -rf s)
