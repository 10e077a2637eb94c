#!/usr/bin/env bash
# Run 138 (session 28): the store items (docs/next/bwd-store.patch: each query's own block
# stores its first dQ contribution, no dQ memset) against main b2150ca. M5 on both (the device
# item build against the host rule word for word, dQ/dK/dV against v1), then, only if store's M5
# passes, the backward on all 32 development rows (recent16, both modes, 5 calls per median) in
# two rounds of reversed order, then store alone on random and b0p99, then the edge layouts on
# store's sm_90a kernels (shard 0..11) with the time left.
# Built here: bash scripts/build-variants.sh main=- store=docs/next/bwd-store.patch. Carried: .gpu-bundle.
set -u; R="$PWD"; end=$((SECONDS + 560))
bash scripts/device/unpack-variants.sh
S="$OUT/s"; mkdir -p "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for v in main store; do
  (cd .gpu-bundle/var/$v && timeout 90 ./m5 3 > "$S/m5-$v.log" 2>&1; echo "m5 $v rc=$?")
  grep -E "differ|MISMATCH|M5 correctness|^[a-z0-9_x]+ +[0-9]+ " "$S/m5-$v.log"
done
grep -q "M5 correctness: PASS" "$S/m5-store.log" || { echo "store M5 failed: no timing"; exit 0; }
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
L=$((end - SECONDS)); echo "=== edge 0..11 on store, $L s"
[ "$L" -gt 30 ] && (cd .gpu-bundle/var/store && MSA_GPU_RESULTS="$S/edge" MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS=0..11 \
  timeout "$L" ./gpu-suite attention_matches --nocapture > "$S/edge.log" 2>&1; echo "edge rc=$?"; tail -5 "$S/edge.log")
tar czf "$OUT/s.tgz" -C "$OUT" s
