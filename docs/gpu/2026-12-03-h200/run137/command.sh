#!/usr/bin/env bash
# Run 137 (session 27): M9 again with the lagged forms (run 136 had plain and lag0 only, then
# called "last"): each add published on its chunk's counter L = 0, 4, 12 adds after it was issued,
# so up to L adds stay in flight per issuing lane.
# Built here: MICROBENCH_ONLY=m9_last_cast bash kernels/microbench/build.sh DIR, the binary copied
# to .gpu-bundle/. Carried: .gpu-bundle.
set -u
timeout 120 .gpu-bundle/m9_last_cast | tee "$OUT/m9.log"
