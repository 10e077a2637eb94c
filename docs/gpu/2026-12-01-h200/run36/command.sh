#!/usr/bin/env bash
# session 6, call 1: SASS facts of each variant's sm_90a backward, then variants-bench.
set -uo pipefail
R="$PWD"; mkdir -p "$OUT/sass"
for v in base A B C; do
  cuobjdump -sass "$R/.gpu-bundle/var/$v/msa" > "/tmp/$v.sass" 2>/dev/null
  python3 - "/tmp/$v.sass" "$v" <<'PY' | tee -a "$OUT/sass/counts.txt"
import sys, re
text = open(sys.argv[1]).read().split("Function : ")
for f in text[1:]:
    name = f.split("\n", 1)[0]
    if not re.search(r"backward_kernelILb[01]E|forward_kernelILNS0_8ScheduleE1E", name): continue
    ops = {k: len(re.findall(k, f)) for k in ["CCTL", "MEMBAR", "HGMMA", "FMNMX", "MUFU.EX2", "LDL", "STL"]}
    print(sys.argv[2], name[:70], ops)
PY
done
VAR_NAMES="base A B C" VAR_ROUNDS=1 VAR_STAGES=forward,backward,backward_det bash scripts/device/variants-bench.sh
mv "$OUT/var.tgz" "$OUT/var1.tgz"
VAR_NAMES="A base" VAR_ROUNDS=1 VAR_STAGES=forward,backward,backward_det VAR_M5=0 bash scripts/device/variants-bench.sh
mv "$OUT/var.tgz" "$OUT/var2.tgz"
