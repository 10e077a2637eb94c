#!/usr/bin/env bash
# Run 99 (session 21): the merge gate for run 98's `all` (docs/next/fwd-epi.patch, fwd-epi-g.patch,
# fwd-epi-log.patch on a696b09; the bundle run 98 carried, rebuilt by its command header). M2 of all,
# then final-check.sh with all's msa timed (recent16: prepare, forward, backward, deterministic;
# random: forward beside v1's) with main's peers, and the correctness jobs with all's gpu-suite:
# suite2, the 33 edge layouts on the sm_90a set, racecheck/memcheck, msa-torch (all's wheel in
# target/wheels) and the real cases 27-36.
# Carried: .gpu-bundle, target/wheels.
bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
(cd .gpu-bundle/var/all && timeout 60 ./m2 3 > "$OUT/r/m2-all.log" 2>&1; echo "m2 all rc=$?"); grep -E "M2" "$OUT/r/m2-all.log" | tail -2
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
FINAL_BENCH=.gpu-bundle/var/all FINAL_SUITE=.gpu-bundle/var/all FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_FLEX_EXACT=0 \
  FINAL_PATTERNS=random FINAL_PATTERN_STAGES=forward,forward_sm80 FINAL_PATTERN_LIMIT=90 \
  FINAL_LIMIT=${RUN99_FINAL_LIMIT:-470} FINAL_REAL=27..36 FINAL_JOBS="suite2 edge sanitize torch real" bash scripts/device/final-check.sh
ls -la "$OUT"
