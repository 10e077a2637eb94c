#!/usr/bin/env bash
# session 7, one call: "new" (main + the backward's fused zeroing and programmatic dependent
# launches + the forward's lazy rescaling; .gpu-bundle and .gpu-bundle/var/new) against main
# ("base") on the development benchmark (prepare, forward, backward, backward_det; two rounds in
# reverse order); "lag" (branch det-lag: the deterministic dQ order in the issuer thread with a
# one-tile release lag) on backward_det, one round, with its bitwise-repeat test; then new's
# correctness, concurrently: bitwise repeat and graph replay, attention_matches on the sm_90a set
# (three shards), the empty-selection test, racecheck and memcheck on the small all-kernel case.
set -uo pipefail
R="$PWD"; T0=$SECONDS
mkdir -p "$R/.gpu-bundle/var/new" && cp "$R/.gpu-bundle/msa" "$R/.gpu-bundle/var/new/msa"  # carried once
VAR_NAMES="base new" VAR_STAGES=prepare,forward,backward,backward_det VAR_M5=0 VAR_LIMIT=100 \
  bash scripts/device/variants-bench.sh
mv "$OUT/var.tgz" "$OUT/var-new.tgz"
if [ -x "$R/.gpu-bundle/var/lag/msa" ]; then
  # lag's binaries were built in /work/wt-det: its compiled-in manifest path must resolve there
  mkdir -p /work/wt-det/crates/msa-workloads && ln -sfn "$R/data" /work/wt-det/data
  VAR_NAMES="lag" VAR_ROUNDS=1 VAR_STAGES=backward,backward_det VAR_M5=0 VAR_LIMIT=100 \
    bash scripts/device/variants-bench.sh
  mv "$OUT/var.tgz" "$OUT/var-lag.tgz"
fi
echo "bench done at $((SECONDS - T0)) s"
F="$OUT/t"; mkdir -p "$F"
left=$((580 - (SECONDS - T0)))
job() { local n="$1" d="$2"; shift 2; ( cd "$d" && timeout "$left" "$@" > "$F/$n.log" 2>&1; echo "rc=$?" >> "$F/$n.log" ) & }
B="$R/.gpu-bundle"
job det "$B" ./gpu-suite --test-threads=1 attention::deterministic attention::empty graph:: --nocapture
for s in 0..11 11..22 22..33; do
  job "edge${s%..*}" "$B" env MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS="$s" ./gpu-suite attention_matches --nocapture
done
job racecheck "$B" compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact
job memcheck "$B" compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact
[ -x "$R/.gpu-bundle/var/lag/gpu-suite" ] && \
  job lag-det "$R/.gpu-bundle/var/lag" ./gpu-suite --test-threads=1 attention::deterministic --nocapture
wait
for j in det edge0 edge11 edge22 racecheck memcheck lag-det; do
  [ -f "$F/$j.log" ] || continue
  echo "== $j: $(tail -n 1 "$F/$j.log")"; grep -E "test result|ERROR SUMMARY|RACECHECK SUMMARY|panicked" "$F/$j.log" | tail -n 3
done
(cd "$OUT" && tar czf t.tgz t && rm -rf t)
