#!/usr/bin/env bash
# session 7, one call: det-issuer-order ("det", .gpu-bundle/var/det with its own gpu-suite) against
# main ("base") on the development benchmark (backward, backward_det; two rounds in reverse order),
# then det's correctness: bitwise repeat, graph replay, attention_matches on the sm_90a set (three
# shards), racecheck and memcheck on the small all-kernel case, concurrently.
set -uo pipefail
R="$PWD"; T0=$SECONDS
# det's binaries were built in /work/wt-det: its compiled-in data path must resolve
mkdir -p /work/wt-det && ln -sfn "$R/data" /work/wt-det/data
VAR_NAMES="base det" VAR_STAGES=backward,backward_det VAR_M5=0 VAR_LIMIT=100 bash scripts/device/variants-bench.sh
echo "bench done at $((SECONDS - T0)) s"
D="$R/.gpu-bundle/var/det"; F="$OUT/t"; mkdir -p "$F"
left=$((585 - (SECONDS - T0)))
job() { local n="$1"; shift; ( cd "$D" && timeout "$left" "$@" > "$F/$n.log" 2>&1; echo "rc=$?" >> "$F/$n.log" ) & }
job det ./gpu-suite --test-threads=1 attention::deterministic graph:: --nocapture
for s in 0..11 11..22 22..33; do
  job "edge${s%..*}" env MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS="$s" ./gpu-suite attention_matches --nocapture
done
job racecheck compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact
job memcheck compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact
wait
for j in det edge0 edge11 edge22 racecheck memcheck; do
  echo "== $j: $(tail -n 1 "$F/$j.log")"; grep -E "test result|ERROR SUMMARY|RACECHECK SUMMARY|panicked" "$F/$j.log" | tail -n 3
done
(cd "$OUT" && tar czf t.tgz t && rm -rf t)
