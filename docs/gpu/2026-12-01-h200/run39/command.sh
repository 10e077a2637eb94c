#!/usr/bin/env bash
# session 6, one call: the PDL build ("new" = .gpu-bundle) against HEAD ("base") on prepare and
# forward; the other selection patterns on the new build; the deterministic backward with the
# default's dQ path ("H", a diagnostic) on three rows; then final-check.sh (timings, peers and the
# correctness jobs) in the time left.
set -uo pipefail
R="$PWD"; F="$OUT/d"; mkdir -p "$F"; T0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
bench() {  # dir name limit args...
  local d="$1" n="$2" l="$3"; shift 3
  (cd "$d" && timeout "$l" ./msa bench --warmup 1 --json "$F/$n.jsonl" "$@" > "$F/$n.log" 2>&1; echo "$n rc=$?")
  grep -E "^  [a-z0-9]+ +(prepare|forward|backward)" "$F/$n.log"; grep -E "prepare as %" "$F/$n.log" | head -2
}
S="$R/data/cases/dev_bench.json"
bench "$R/.gpu-bundle/var/base" base-pf 60 --suite "$S" --pattern recent16 --stages prepare,forward --iters 5
bench "$R/.gpu-bundle" new-pf 60 --suite "$S" --pattern recent16 --stages prepare,forward --iters 5
bench "$R/.gpu-bundle" patterns 170 --suite "$S" --pattern random,b0p99,indexer --stages forward,backward,backward_det --iters 3
for v in base H; do
  bench "$R/.gpu-bundle/var/$v" "$v-det" 30 --cases 151:15,605:14,655:1 --pattern recent16 --stages backward,backward_det --iters 5
done
(cd "$OUT" && tar czf d.tgz d && rm -rf d)
FINAL_LIMIT=$((590 - (SECONDS - T0))) FINAL_OVERHEAD=0 FINAL_JOBS="${JOBS:-suite1 suite2 edge sanitize torch real}" \
  bash scripts/device/final-check.sh
