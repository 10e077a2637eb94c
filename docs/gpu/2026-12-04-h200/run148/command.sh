#!/usr/bin/env bash
# Run 148 (session 30): the merge check of main 33013a1 (every dQ group zeroed in the main kernel,
# groups 1-3 paced). M5 (accumulator poisoned; device items, split tables and the group-first
# words against the host rule); b0p99 (both backward modes); then scripts/device/final-check.sh's
# correctness jobs: suite1 alone on the quiet GPU first (FINAL_SOLO), then suite2 (graphs,
# deterministic), detrows (the deterministic backward bitwise-repeated on all 32 rows), the 33
# edge layouts on the sm_90a set, racecheck + memcheck, msa-torch's GPU suite and train_step on
# two real ranks (the wheel built from 33013a1), the sampled real-case sweep (cases 27-48).
# Built here: bash scripts/build-variants.sh main=-; cargo xtask gpu-bundle; cargo xtask wheel.
# Carried: .gpu-bundle, target/wheels.
set -u; R="$PWD"; T0=$SECONDS
bash scripts/device/unpack-variants.sh
mkdir -p "$OUT/m"
(cd .gpu-bundle/var/main && timeout 60 ./m5 3 > "$OUT/m/m5.log" 2>&1; echo "m5 rc=$?")
grep -E "differ|MISMATCH|M5 correctness|^[a-z0-9_x]+ +[0-9]+ " "$OUT/m/m5.log"
(cd .gpu-bundle/var/main && timeout 90 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern b0p99 \
  --stages backward,backward_det --warmup 1 --iters 3 --json "$OUT/m/b0p99.jsonl" > "$OUT/m/b0p99.log" 2>&1; echo "b0p99 rc=$?")
sed -n '/^summary/,/^prepare as/p' "$OUT/m/b0p99.log" | grep -E "^  [a-z0-9]+ +backward"
(cd "$OUT" && tar czf m.tgz m && rm -rf m)
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/main FINAL_SOLO=suite1 \
  FINAL_JOBS="suite2 detrows edge sanitize torch real" FINAL_LIMIT=$((585 - (SECONDS - T0))) \
  bash scripts/device/final-check.sh
