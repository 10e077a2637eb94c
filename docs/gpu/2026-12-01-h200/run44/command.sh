#!/usr/bin/env bash
# session 7, one call: prepare's scatter kernel split into 4 threads per (head, query) ("new",
# .gpu-bundle) against run 42's build ("base", .gpu-bundle/var/base): prepare and forward on the
# development benchmark, one round each; then new's prepare tests (device prepare against the
# planner word for word, graph capture), graph replay and racecheck, concurrently.
set -uo pipefail
R="$PWD"; T0=$SECONDS
mkdir -p "$R/.gpu-bundle/var/new" && cp "$R/.gpu-bundle/msa" "$R/.gpu-bundle/var/new/msa"
VAR_NAMES="base new" VAR_ROUNDS=1 VAR_STAGES=prepare,forward VAR_M5=0 VAR_LIMIT=60 bash scripts/device/variants-bench.sh
echo "bench done at $((SECONDS - T0)) s"
F="$OUT/t"; mkdir -p "$F"; left=$((170 - (SECONDS - T0)))
job() { local n="$1"; shift; ( cd "$R/.gpu-bundle" && timeout "$left" "$@" > "$F/$n.log" 2>&1; echo "rc=$?" >> "$F/$n.log" ) & }
job prepare ./gpu-suite --test-threads=2 prepare:: graph::
job racecheck compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact
wait
for j in prepare racecheck; do
  echo "== $j: $(tail -n 1 "$F/$j.log")"; grep -E "^test |test result|RACECHECK SUMMARY|panicked" "$F/$j.log" | tail -n 10
done
(cd "$OUT" && tar czf t.tgz t && rm -rf t)
