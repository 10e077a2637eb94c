#!/usr/bin/env bash
# One device call of verification work, run concurrently (one GPU, 16 cores; the suites are
# mostly host-bound): the edge-layout attention test (sm_90a and sm_80 kernels), the naive GPU
# reference against the CPU reference on edge layouts, compute-sanitizer racecheck on the small
# all-kernel case, and a slice of the real-case sweep (MSA_REAL_CASES, default 5..8).
# Each job writes its own log and JSON results under $OUT/<job>/.
#   bash scripts/device/verify-suite.sh      (from the repo root, .gpu-bundle carried)
set -uo pipefail
b="$PWD/.gpu-bundle"
limit="${VERIFY_LIMIT:-560}"
job() {
    local name="$1"; shift
    mkdir -p "$OUT/$name"
    ( cd "$b" && MSA_GPU_RESULTS="$OUT/$name" timeout "$limit" "$@" >"$OUT/$name/log" 2>&1
      echo "rc=$?" >>"$OUT/$name/log" ) &
}
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
job edge ./gpu-suite --test-threads=1 attention_matches
job reference ./gpu-suite --test-threads=1 gpu_reference_matches_the_cpu_reference_on_edge_layouts
job racecheck compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact
MSA_REAL_CASES="${MSA_REAL_CASES:-5..8}" job real ./gpu-suite real_cases --test-threads=1 --nocapture
wait
for j in edge reference racecheck real; do
    echo "== $j: $(tail -n 1 "$OUT/$j/log")"; grep -E "^test |test result" "$OUT/$j/log" | tail -n 3
done
gzip -f "$OUT"/*/gpu-results.jsonl 2>/dev/null
