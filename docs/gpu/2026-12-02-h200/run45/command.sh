#!/usr/bin/env bash
# session 8, one call: wgmma descriptors in uniform registers ("desc", branch fwd-desc: forward and
# backward) against main ("base") on forward, backward and deterministic; then the forward of
# desc + the softmax cuts ("cuts", branch fwd-desc-cuts) and cuts + O through shared memory and TMA
# stores ("epi", branch fwd-epi) beside desc. Then epi's correctness (its gpu-suite is the
# bundle's): bitwise repeat, empty, graph replay, attention_matches on the sm_90a set (three
# shards), racecheck and memcheck.
set -uo pipefail
R="$PWD"; T0=$SECONDS
B="$R/.gpu-bundle"
mkdir -p "$B/var/epi" && cp "$B/msa" "$B/var/epi/msa"  # carried once
# binaries built in other worktrees: their compiled-in manifest path must resolve there
for wt in wt-desc wt-cuts wt-epi; do mkdir -p /work/$wt/crates/msa-workloads && ln -sfn "$R/data" /work/$wt/data; done
VAR_NAMES="base desc" VAR_STAGES=forward,backward,backward_det VAR_M5=0 VAR_LIMIT=90 \
  bash scripts/device/variants-bench.sh
mv "$OUT/var.tgz" "$OUT/var-desc.tgz"
echo "bench 1 done at $((SECONDS - T0)) s"
VAR_NAMES="desc cuts epi" VAR_STAGES=forward VAR_M5=0 VAR_LIMIT=60 \
  bash scripts/device/variants-bench.sh
mv "$OUT/var.tgz" "$OUT/var-fwd.tgz"
echo "bench 2 done at $((SECONDS - T0)) s"
F="$OUT/t"; mkdir -p "$F"
left=$((585 - (SECONDS - T0)))
job() { local n="$1" d="$2"; shift 2; ( cd "$d" && timeout "$left" "$@" > "$F/$n.log" 2>&1; echo "rc=$?" >> "$F/$n.log" ) & }
job det "$B" ./gpu-suite --test-threads=1 attention::deterministic attention::empty graph:: --nocapture
for s in 0..11 11..22 22..33; do
  job "edge${s%..*}" "$B" env MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS="$s" ./gpu-suite attention_matches --nocapture
done
job racecheck "$B" compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact
job memcheck "$B" compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact
wait
for j in det edge0 edge11 edge22 racecheck memcheck; do
  echo "== $j: $(tail -n 1 "$F/$j.log")"; grep -E "test result|ERROR SUMMARY|RACECHECK SUMMARY|panicked" "$F/$j.log" | tail -n 3
done
echo "all done at $((SECONDS - T0)) s"
(cd "$OUT" && tar czf t.tgz t && rm -rf t)
