#!/usr/bin/env bash
# Run 96: M8 (the dQ accumulator in compressible memory) and M5 with the accumulator in cudaMalloc
# and in compressible memory, alternating. Binaries: kernels/microbench/build.sh (m8_compressible,
# m5_backward_sm90) copied into .gpu-bundle/mb.
set -uo pipefail
cd .gpu-bundle/mb
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/gpu.txt"
./m8_compressible 2>&1 | tee "$OUT/m8.txt"
for round in 1 2; do
    for c in 0 1; do
        echo "== M5 round $round, M5_DQ_COMPRESSIBLE=$c"
        M5_DQ_COMPRESSIBLE=$c ./m5_backward_sm90 15
    done
done 2>&1 | tee "$OUT/m5.txt"
