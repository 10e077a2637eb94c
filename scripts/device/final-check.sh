#!/usr/bin/env bash
# One device call for a whole merge: timings first on a quiet GPU (the development benchmark,
# its PyTorch peers, msa-torch's host overhead, prepare's kernels under ncu), then the
# correctness jobs concurrently (GPU suite parts, compute-sanitizer, context parallelism on one
# GPU, the msa-torch suite, a slice of the real-case sweep), each bounded by the time left.
#   bash scripts/device/final-check.sh    (repo root; .gpu-bundle and target/wheels carried)
# Logs under $OUT/<job>/, packed into $OUT/final.tgz (few files come back).
set -uo pipefail
R="$PWD"; b="$R/.gpu-bundle"; end=$((SECONDS + ${FINAL_LIMIT:-340}))
mkdir -p "$OUT/f"; F="$OUT/f"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
echo "=== bench (dev suite)"
(cd "$b" && timeout 120 ./msa bench --suite ../data/cases/dev_bench.json --pattern recent16 \
   --stages prepare,forward,backward,backward_det --warmup 1 --iters 5 --json "$F/bench.jsonl" > "$F/bench.log" 2>&1; echo "rc=$?")
sed -n '/^summary/,$p' "$F/bench.log"; grep -E "prepare as %" "$F/bench.log"
echo "=== peers"
(cd "$b" && timeout 60 python3 bench_peers.py "$F/peers.jsonl" --layouts "$F/bench.jsonl" --iters 10 > "$F/peers.log" 2>&1; echo "rc=$?"); tail -n 12 "$F/peers.log"
echo "=== torch host overhead"
MSA_TORCH_SITE=/tmp/site-o timeout 90 bash crates/msa-torch/tests/run_gpu.sh -k overhead > "$F/overhead.log" 2>&1; echo "rc=$?"
grep -E "ms/call|passed|failed" "$F/overhead.log" | tail -8
echo "=== ncu prepare 151:7"
(cd "$b" && timeout 40 ncu --clock-control none -k regex:"select_kernel|level_kernel|offsets_kernel|scatter_kernel" \
   --metrics gpu__time_duration.sum,launch__grid_size ./msa bench --cases 151:7 --pattern recent16 --stages prepare \
   --warmup 0 --iters 1 > "$F/ncu.log" 2>&1; echo "rc=$?"); grep -E "_kernel|gpu__time" "$F/ncu.log" | head -16
L=$((end - SECONDS)); echo "=== concurrent jobs, $L s"
job() { local n="$1"; shift; mkdir -p "$F/$n"; ( cd "$b" && MSA_GPU_RESULTS="$F/$n" timeout "$L" "$@" > "$F/$n/log" 2>&1; echo "rc=$?" >> "$F/$n/log" ) & }
job suite1 ./gpu-suite --test-threads=1 prepare:: task_build:: attention::empty reference::
job suite2 ./gpu-suite --test-threads=1 graph:: attention::deterministic
job sanitize bash -c "compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3; compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3"
job cp bash "$R/scripts/gpu-cp.sh" ./msa "$F/cp/out"
job torch bash -c "cd $R && MSA_TORCH_SITE=/tmp/site-t MSA_TORCH_PROFILE=0 bash crates/msa-torch/tests/run_gpu.sh -k 'not overhead'"
job real env MSA_REAL_FULL=0 MSA_REAL_CASES=20..48 ./gpu-suite real_cases --test-threads=1 --nocapture
wait
for n in suite1 suite2 sanitize cp torch real; do
  echo "=== $n: $(tail -n 1 "$F/$n/log")"
  grep -E "^test .*(ok|FAILED)$|test result|^PASS|^FAIL|passed|failed|SUMMARY|real_cases\] case" "$F/$n/log" | tail -12
done
cd "$OUT" && tar czf final.tgz f && rm -rf f
