#!/usr/bin/env bash
# Run 135 (session 27): main 761df12 (run 134's pdl merged: order_kernel a programmatic dependent
# that waits first, the validation's reduction triggering at its start; the bench's prepare stage
# as what it adds to the forward). The merge check: every development row on recent16 (prepare,
# forward, both backward modes, 5 calls per median) with cuDNN and varlen peers, then suite1, the
# msa-torch suite and train_step.py on main's wheel, real cases 27-30 (run 134 ran suite2, the 33
# edge layouts, racecheck/memcheck and the prepare tests on the same kernels).
# Built here: bash scripts/build-variants.sh main=-; `cargo xtask wheel` in ../wt-main, copied to
# target/wheels. Carried: .gpu-bundle, target/wheels.
set -u
bash scripts/device/unpack-variants.sh && cp .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_SUITE=.gpu-bundle/var/main FINAL_BENCH=.gpu-bundle/var/main FINAL_LIMIT=470 \
  FINAL_REAL=27..30 FINAL_JOBS="suite1 torch real" bash scripts/device/final-check.sh
