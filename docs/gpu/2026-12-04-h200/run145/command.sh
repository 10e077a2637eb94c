#!/usr/bin/env bash
# Run 145 (session 29): the merge check of b6448f3 (the dQ accumulator zeroed inside the main
# kernel). M5 (accumulator poisoned); then scripts/device/final-check.sh: the development benchmark
# (recent16: prepare, forward, both backward modes) with cuDNN's dense causal peers in the same
# call, random / spread / indexer (both backward modes), then the correctness jobs concurrently:
# suite1, suite2 (graphs, deterministic), detrows (the bitwise deterministic backward on all 32
# rows), the 33 edge layouts on the sm_90a set, racecheck + memcheck, msa-torch's GPU suite and
# train_step on two real ranks, the sampled real-case sweep.
# Built here: bash scripts/build-variants.sh main=- (M5 and the suite, var/main), cargo xtask
# gpu-bundle (copied into .gpu-bundle), cargo xtask wheel. Carried: .gpu-bundle, target/wheels.
set -u; R="$PWD"
bash scripts/device/unpack-variants.sh
mkdir -p "$OUT/m"
(cd .gpu-bundle/var/main && timeout 60 ./m5 3 > "$OUT/m/m5.log" 2>&1; echo "m5 rc=$?")
grep -E "differ|MISMATCH|M5 correctness|^[a-z0-9_x]+ +[0-9]+ " "$OUT/m/m5.log"
FINAL_BENCH=.gpu-bundle/var/main FINAL_SUITE=.gpu-bundle/var/main FINAL_OVERHEAD=0 FINAL_NCU=0 \
  FINAL_PATTERNS=random,spread,indexer FINAL_PATTERN_STAGES=backward,backward_det FINAL_PATTERN_LIMIT=150 \
  FINAL_JOBS="suite1 suite2 detrows edge sanitize torch real" FINAL_LIMIT=520 bash scripts/device/final-check.sh
(cd "$OUT" && tar czf m.tgz m && rm -rf m)
