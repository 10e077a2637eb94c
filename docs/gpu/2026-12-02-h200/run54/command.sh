#!/usr/bin/env bash
# session 10, one call: "combo" = main + prep-sort + bwd-launch + det-fixed as revised after run 53
# (the dQ grid's block bounds only for selected rows, coalesced; dq_step a warp per (query, group);
# the dK/dV chain's slot loads batched), against main ("base") in the same call, both backward
# modes, two rounds in reverse order; then combo on spread, random, b0p99 and indexer (both
# modes, one round); ncu of its deterministic-mode kernels on 151:7. Then correctness on combo
# (its own gpu-suite): suite2 (graph, deterministic, outlier keys), detrows (all 32 rows bitwise),
# attention_matches (three shards), racecheck/memcheck, and suite1 without task_build (prepare,
# indexer, KL, pre/post, reference). Also ncu of the base main kernel's memory traffic on 151:15
# under recent16 and spread.
set -uo pipefail
R="$PWD"; T0=$SECONDS; B="$R/.gpu-bundle"
tar xJf "$B/var.tar.xz" -C "$B"
mkdir -p /work/wt-combo/crates/msa-workloads /work/wt-combo/crates/msa-harness && ln -sfn "$R/data" /work/wt-combo/data
VAR_NAMES="base combo" VAR_STAGES=backward,backward_det VAR_M5=0 VAR_LIMIT=60 bash scripts/device/variants-bench.sh
echo "A/B done at $((SECONDS - T0)) s"
mkdir -p "$OUT/p"
(cd "$B/var/combo" && timeout 150 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern spread,random,b0p99,indexer \
   --stages backward,backward_det --warmup 1 --iters 3 --json "$OUT/p/patterns.jsonl" > "$OUT/p/patterns.log" 2>&1; echo "patterns rc=$?")
sed -n '/^summary/,/^prepare as/p' "$OUT/p/patterns.log" | grep -E "^  [a-z0-9]+ +backward"
echo "patterns done at $((SECONDS - T0)) s"
(cd "$B/var/combo" && timeout 40 ncu --clock-control none \
   -k regex:"backward_kv_bound|backward_dq_step|backward_order|backward_items|backward_kernel|backward_epilogue" \
   --metrics gpu__time_duration.sum ./msa bench --cases 151:7 --pattern recent16 \
   --stages backward,backward_det --warmup 0 --iters 1 > "$OUT/p/ncu.log" 2>&1; echo "ncu rc=$?")
grep -E "^  [a-z].*_kernel|gpu__time" "$OUT/p/ncu.log" | sed -E 's/\(const.*\) \(/ (/' | head -24
# Where spread's backward loses to recent16's (410.6 vs 447.2 in run 52): the main kernel's memory
# traffic on the same rank under both patterns (base build).
for pat in recent16 spread; do
  (cd "$B/var/base" && timeout 60 ncu --clock-control none -k regex:"backward_kernel" --section SpeedOfLight \
     --metrics lts__t_sector_hit_rate.pct,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_red.sum \
     ./msa bench --cases 151:15 --pattern $pat --stages backward --warmup 0 --iters 1 > "$OUT/p/ncu-$pat.log" 2>&1
   echo "ncu $pat rc=$?")
  grep -E "Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|hit_rate|dram__bytes|lts__t_sectors" "$OUT/p/ncu-$pat.log" | head -10
done
L=$((580 - (SECONDS - T0))); echo "correctness on combo, $L s"
mkdir -p "$OUT/s1"
(cd "$B/var/combo" && MSA_GPU_RESULTS="$OUT/s1" timeout $((L - 15)) ./gpu-suite --test-threads=1 prepare:: attention::empty \
   reference:: indexer:: kl:: pre_post:: > "$OUT/s1/log" 2>&1; echo "rc=$?" >> "$OUT/s1/log") &
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/combo FINAL_JOBS="suite2 detrows edge sanitize" \
  FINAL_LIMIT=$((L - 15)) bash scripts/device/final-check.sh
wait
echo "=== suite1 (no task_build): $(tail -n 1 "$OUT/s1/log")"; grep -E "^test |test result" "$OUT/s1/log" | tail -24
echo "all done at $((SECONDS - T0)) s"
(cd "$OUT" && tar czf p.tgz p s1 && rm -rf p s1)
