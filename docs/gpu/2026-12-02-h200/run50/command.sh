#!/usr/bin/env bash
# session 9, one call: the work list written by offsets_kernel (no binary search per item in
# scatter_kernel): first its word-for-word prepare tests; then prepare timed against main at
# 3c4266e ("base", carried as var/base/msa), two rounds in reverse order; then final-check's
# timings on this build ("prep": the bundle's msa) with FlexAttention under MSA's exact
# semantics on all 32 rows (FINAL_FLEX_EXACT=-1), no host-overhead job, no correctness jobs.
set -uo pipefail
R="$PWD"; T0=$SECONDS; B="$R/.gpu-bundle"
mkdir -p "$B/var/prep" && cp "$B/msa" "$B/var/prep/msa"
mkdir -p "$OUT/p"
(cd "$B" && MSA_GPU_RESULTS="$OUT/p" timeout 90 ./gpu-suite --test-threads=1 prepare:: > "$OUT/p/log" 2>&1; echo "prepare tests rc=$?")
grep -E "^test |test result" "$OUT/p/log" | tail -8
VAR_NAMES="base prep" VAR_STAGES=prepare VAR_M5=0 VAR_LIMIT=60 bash scripts/device/variants-bench.sh
echo "prepare A/B done at $((SECONDS - T0)) s"
FINAL_FLEX_EXACT=-1 FINAL_OVERHEAD=0 FINAL_JOBS=" " FINAL_LIMIT=420 bash scripts/device/final-check.sh
echo "all done at $((SECONDS - T0)) s"
(cd "$OUT" && tar czf p.tgz p && rm -rf p)
