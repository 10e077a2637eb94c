#!/usr/bin/env bash
# Run 136 (session 27): M9 (kernels/microbench/m9_last_cast.cu), #12's open idea: the dQ cast by
# the last of a chunk's 16 contributors (each add waited for and published on a per-chunk
# counter) against today's adds plus a separate cast pass, at T = 12,288, recent and random add
# orders, 1 and 2 CTAs of 8 issuing warps per SM. Every dQ value is checked.
# Built here: MICROBENCH_ONLY=m9_last_cast bash kernels/microbench/build.sh DIR, the binary copied
# to .gpu-bundle/. Carried: .gpu-bundle.
set -u
timeout 120 .gpu-bundle/m9_last_cast | tee "$OUT/m9.log"
