#!/usr/bin/env bash
# Run 115 (session 24): main 267fc2e (the claim order merged) on the other selection patterns and
# the real-case sweep. First, on a quiet GPU, the development benchmark's forward under spread,
# random, b0p99 and indexer with v1's forward beside it (3 calls per median); then the real-case
# sweep (sampled checks, both input modes, every pattern) over manifest entries 27-48 in six
# concurrent shards. Run 114 timed recent16 (all four stages) and the peers on the same build.
# Built here: bash scripts/build-variants.sh main=- (with run 114's variants). Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh; R="$PWD"; F="$OUT/f"; mkdir -p "$F"; M="$PWD/.gpu-bundle/var/main"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
(cd "$M" && bash "$R/scripts/device/clocks.sh" "$F/clocks-patterns.csv" timeout 210 ./msa bench \
   --suite "$R/data/cases/dev_bench.json" --pattern spread,random,b0p99,indexer --stages forward,forward_sm80 \
   --warmup 1 --iters 3 --json "$F/patterns.jsonl" > "$F/patterns.log" 2>&1; echo "patterns rc=$?")
sed -n '/^summary/,/^prepare as/p' "$F/patterns.log" | grep -E "^  [a-z0-9]+ +forward"; grep -h "^clocks:" "$F/patterns.log"
for s in 27..31 31..35 35..39 39..43 43..46 46..48; do
  mkdir -p "$F/real${s%..*}"
  (cd "$M" && MSA_GPU_RESULTS="$F/real${s%..*}" MSA_REAL_FULL=0 MSA_REAL_CASES="$s" timeout 320 ./gpu-suite real_cases \
     --test-threads=1 --nocapture > "$F/real${s%..*}/log" 2>&1; echo "rc=$?" >> "$F/real${s%..*}/log") &
done
wait
for d in "$F"/real*/; do echo "=== $(basename "$d"): $(tail -n 1 "$d/log") $(grep -c '^\[real_cases\] case.*[a-z0-9]$' "$d/log") runs"; grep -E "test result|FAILED|panicked" "$d/log" | tail -3; done
(cd "$OUT" && tar czf final.tgz f && rm -rf f)
