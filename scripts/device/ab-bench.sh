#!/usr/bin/env bash
# A/B timing of two builds in one device call, on a quiet GPU: the development benchmark
# (recent16, 32 rows, medians) with .gpu-bundle/msa ("new") and .gpu-bundle/old/msa ("old", the
# build it is compared with: copy its msa there before carrying), back to back; then each
# variant's `backward_items_kernel` time under ncu on two rows.
#   AB_STAGES=prepare,forward,backward,backward_det bash scripts/device/ab-bench.sh
# Logs and JSON under $OUT/ab/ (scripts/ab-compare.py prints the per-row ratios).
set -uo pipefail
R="$PWD"; b="$R/.gpu-bundle"; F="$OUT/ab"; mkdir -p "$F"
stages="${AB_STAGES:-prepare,forward,backward,backward_det}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for v in new old; do
  d="$b"; [ "$v" = old ] && d="$b/old"
  (cd "$d" && timeout "${AB_LIMIT:-130}" ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 \
     --stages "$stages" --warmup 1 --iters 5 --json "$F/bench-$v.jsonl" > "$F/bench-$v.log" 2>&1; echo "$v rc=$?")
  sed -n '/^summary/,/^prepare as/p' "$F/bench-$v.log"
done
for v in new old; do
  d="$b"; [ "$v" = old ] && d="$b/old"
  (cd "$d" && timeout 60 ncu --clock-control none -k regex:"backward_items_kernel" \
     --metrics gpu__time_duration.sum ./msa bench --cases 151:15,434:0 --pattern recent16 --stages forward,backward \
     --warmup 0 --iters 1 > "$F/ncu-$v.log" 2>&1; echo "ncu $v rc=$?")
  grep -E "_kernel|gpu__time" "$F/ncu-$v.log" | head -8
done
