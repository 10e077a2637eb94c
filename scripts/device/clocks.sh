#!/usr/bin/env bash
# Samples the GPU's SM clock, memory clock, power and temperature every 100 ms while a command
# runs, so a timing can be read against the clocks it ran at (run 58's deterministic samples rose
# call over call with nothing logged to say why). Prints min / median / max per column after.
#   bash scripts/device/clocks.sh OUT.csv COMMAND [ARGS...]
set -uo pipefail
csv="$1"; shift
: > "$csv"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader,nounits \
  -lms 100 > "$csv" 2>&1 &
smi=$!
"$@"; rc=$?
kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
python3 - "$csv" <<'PY'
import statistics, sys
cols = {"SM MHz": [], "mem MHz": [], "W": [], "C": []}
for line in open(sys.argv[1]):
    f = [x.strip() for x in line.split(",")]
    try:
        vals = [float(x) for x in f[1:5]]
    except ValueError:
        continue
    for k, v in zip(cols, vals):
        cols[k].append(v)
if not cols["W"]:
    print("clocks: no samples (nvidia-smi missing or the command ended first)")
else:
    print("clocks:", ", ".join(f"{k} {min(v):.0f}/{statistics.median(v):.0f}/{max(v):.0f}" for k, v in cols.items()),
          f"(min/median/max of {len(cols['W'])} samples)")
PY
exit "$rc"
