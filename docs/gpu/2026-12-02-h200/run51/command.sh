#!/usr/bin/env bash
# session 9, one call: the backward with the previous tile's dQ staged during the next tile,
# against main at cfa3a36 ("base", the bundle's msa; kernels of 3c4266e): "defer" = staged while that tile's S^T is
# in flight (branch bwd-s-early), "defer2" = while S^T and dP^T are (branch bwd-defer2); forward
# and backward, two rounds in reverse order. Then FlexAttention with MSA's exact semantics on the
# 32 rows (bench_peers.py --flex-exact -1, ratios against base's first-round times), on the quiet
# GPU. Then the faster of defer/defer2 gets its correctness concurrently: attention_matches on the
# sm_90a set (three shards), bitwise-repeat / empty / graph, racecheck and memcheck.
set -uo pipefail
R="$PWD"; T0=$SECONDS; B="$R/.gpu-bundle"
mkdir -p "$B/var/base" && cp "$B/msa" "$B/var/base/msa"
mkdir -p /work/wt-bwd/crates/msa-workloads && ln -sfn "$R/data" /work/wt-bwd/data
VAR_NAMES="base defer defer2" VAR_STAGES=forward,backward VAR_M5=0 VAR_LIMIT=70 \
  bash scripts/device/variants-bench.sh
echo "bench done at $((SECONDS - T0)) s"
tar xzf "$OUT/var.tgz" -C /tmp
agg() { awk '$1=="recent16" && $2=="backward" {s+=$5; n++} END {printf "%.2f", s/n}' /tmp/var/bench-$1-*.log; }
for v in base defer defer2; do echo "$v backward mean $(agg $v)"; done
mkdir -p "$OUT/peers"
(cd "$B" && timeout 200 python3 bench_peers.py "$OUT/peers/peers.jsonl" --layouts /tmp/var/bench-base-1.jsonl \
   --iters 10 --flex-exact -1 > "$OUT/peers/peers.log" 2>&1; echo "peers rc=$?")
grep -E "flex|failed" "$OUT/peers/peers.log" | tail -n 70
echo "peers done at $((SECONDS - T0)) s"
W=defer; awk -v a="$(agg defer2)" -v b="$(agg defer)" 'BEGIN {exit !(a > b)}' && W=defer2
echo "correctness on $W"
F="$OUT/t"; mkdir -p "$F"; V="$B/var/$W"
left=$((585 - (SECONDS - T0)))
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
(cd "$OUT" && tar czf t.tgz t peers && rm -rf t peers)
