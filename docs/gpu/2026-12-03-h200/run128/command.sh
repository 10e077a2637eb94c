#!/usr/bin/env bash
# Run 128 (session 26): main 2dd5e63 (ba87ac2: the validation's reduction as a programmatic
# dependent; 39e47c5: the prepare stage reads a selection written on the device after the spacer).
# First, on a quiet GPU, every development row's prepare and forward, recent16 and spread (5 calls
# per median): #11's prepare clause on every row. Then the correctness jobs of the new launch path,
# concurrently: the prepare tests (dev cases, edge layouts, every top-k fault, graph capture),
# suite2 (its graph captures raw::prepare_validate beside prepare), the 33 edge layouts,
# racecheck/memcheck, real cases 27-30, msa-torch on main's wheel with train_step.py.
# Built here: bash scripts/build-variants.sh main=-; `cargo xtask wheel` in ../wt-main, copied to
# target/wheels. Carried: .gpu-bundle, target/wheels.
set -u; R="$PWD"
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
A="$OUT/a"; mkdir -p "$A"
(cd .gpu-bundle/var/main && timeout 150 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16,spread \
  --stages prepare,forward --warmup 1 --iters 5 --json "$A/bench.jsonl" > "$A/bench.log" 2>&1; echo "bench rc=$?")
sed -n "/^summary/,\$p" "$A/bench.log" | head -12
(cd "$OUT" && tar czf a.tgz a && rm -rf a)
P="$OUT/p"; mkdir -p "$P"
(cd .gpu-bundle/var/main && MSA_GPU_RESULTS="$P" timeout 280 ./gpu-suite --test-threads=1 prepare:: > "$P/log" 2>&1; echo "rc=$?" >> "$P/log") &
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/main FINAL_LIMIT=290 FINAL_REAL=27..30 \
  FINAL_JOBS="suite2 edge sanitize real torch" bash scripts/device/final-check.sh
wait
echo "=== prepare: $(tail -n 1 "$P/log")"; grep -E "test result|FAILED|panicked" "$P/log" | tail -4
(cd "$OUT" && tar czf p.tgz p && rm -rf p)
ls -la "$OUT"
