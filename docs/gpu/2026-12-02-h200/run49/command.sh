#!/usr/bin/env bash
# session 9, one call: the backward register split against main ("base"): "regs" = branch bwd-regs
# (setmaxnreg 24/240), "dk" = branch bwd-regs-dk (+ dK issued last, in flight across the dQ
# staging), backward and deterministic, two rounds in reverse order; then the faster of regs/dk
# (by the mean of its rounds' default-mode aggregate) gets its correctness concurrently:
# attention_matches on the sm_90a set (three shards), bitwise-repeat / empty / graph, racecheck
# and memcheck (each variant's own gpu-suite, carried under .gpu-bundle/var/).
set -uo pipefail
R="$PWD"; T0=$SECONDS; B="$R/.gpu-bundle"
mkdir -p "$B/var/base" && cp "$B/msa" "$B/var/base/msa"
mkdir -p /work/wt-bwd/crates/msa-workloads && ln -sfn "$R/data" /work/wt-bwd/data
VAR_NAMES="base regs dk" VAR_STAGES=backward,backward_det VAR_M5=0 VAR_LIMIT=80 \
  bash scripts/device/variants-bench.sh
echo "bench done at $((SECONDS - T0)) s"
tar xzf "$OUT/var.tgz" -C /tmp
agg() { awk '$1=="recent16" && $2=="backward" {s+=$5; n++} END {printf "%.2f", s/n}' /tmp/var/bench-$1-*.log; }
for v in base regs dk; do echo "$v backward mean $(agg $v)"; done
W=regs; awk -v a="$(agg dk)" -v b="$(agg regs)" 'BEGIN {exit !(a > b)}' && W=dk
echo "correctness on $W"
F="$OUT/t"; mkdir -p "$F"; V="$B/var/$W"
left=$((590 - (SECONDS - T0)))
job() { local n="$1"; shift; mkdir -p "$F/$n"; ( cd "$V" && MSA_GPU_RESULTS="$F/$n" timeout "$left" "$@" > "$F/$n/log" 2>&1; echo "rc=$?" >> "$F/$n/log" ) & }
for s in 0..11 11..22 22..33; do
  job "edge${s%..*}" env MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS="$s" ./gpu-suite attention_matches --nocapture
done
job det ./gpu-suite --test-threads=1 attention::deterministic attention::empty graph:: --nocapture
job sanitize bash -c "compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3; compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3"
wait
for d in "$F"/*/; do
  n="$(basename "$d")"
  echo "=== $n: $(tail -n 1 "$d/log")"
  grep -E "^test .*(ok|FAILED)$|test result|^PASS|^FAIL|passed|failed|SUMMARY|rc=" "$d/log" | tail -6
done
echo "all done at $((SECONDS - T0)) s"
(cd "$OUT" && tar czf t.tgz t && rm -rf t)
