#!/usr/bin/env bash
# Run 139 (session 28): the store items, second form (docs/next/bwd-store.patch: the list runs
# each head's bands from the last down, a band's store items one band ahead of its add items,
# and an add item waits per (head, band) for the store items of its queries' bands) against main
# b2150ca. M5 on both; the backward on all 32 development rows (recent16, both modes, 5 calls per
# median) in two rounds of reversed order; store alone on random and b0p99; then store's
# correctness jobs (scripts/device/final-check.sh: edge layouts on the sm_90a set, suite2 (graphs,
# deterministic), racecheck and memcheck) with the time left.
# Built here: bash scripts/build-variants.sh main=- store=docs/next/bwd-store.patch. Carried: .gpu-bundle.
set -u; R="$PWD"; start=$SECONDS
bash scripts/device/unpack-variants.sh
S="$OUT/s"; mkdir -p "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for v in main store; do
  (cd .gpu-bundle/var/$v && timeout 90 ./m5 3 > "$S/m5-$v.log" 2>&1; echo "m5 $v rc=$?")
  grep -E "differ|MISMATCH|M5 correctness|^[a-z0-9_x]+ +[0-9]+ " "$S/m5-$v.log"
done
grep -q "M5 correctness: PASS" "$S/m5-store.log" || { echo "store M5 failed: no timing"; tar czf "$OUT/s.tgz" -C "$OUT" s; exit 0; }
bench() {  # build pattern stages tag
  (cd .gpu-bundle/var/$1 && timeout 150 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern "$2" \
    --stages "$3" --warmup 1 --iters 5 --json "$S/$1-$4.jsonl" > "$S/$1-$4.log" 2>&1; echo "$1 $4 rc=$?")
  sed -n '/^summary/,/^prepare as/p' "$S/$1-$4.log" | grep -E "^  [a-z0-9]+ +(backward)"
}
bench main recent16 backward,backward_det r1
bench store recent16 backward,backward_det r1
bench store recent16 backward,backward_det r2
bench main recent16 backward,backward_det r2
bench store random,b0p99 backward,backward_det p1
tar czf "$OUT/s.tgz" -C "$OUT" s
L=$((570 - (SECONDS - start))); echo "=== correctness jobs on store, $L s"
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/store FINAL_JOBS="edge suite2 sanitize" FINAL_LIMIT=$L \
  bash scripts/device/final-check.sh
