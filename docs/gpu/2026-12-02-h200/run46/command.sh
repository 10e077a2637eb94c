#!/usr/bin/env bash
# session 8, one call on main at the merge of fwd-epi (uniform wgmma descriptors, the softmax cuts,
# O by TMA stores; kernels as run 45's "epi", whose attention_matches, bitwise-repeat, graph and
# sanitizer jobs passed): timings on a quiet GPU (development benchmark with prepare, spread and
# the scattered patterns with v1's forward beside, peers, ncu of prepare), then Nsight Compute
# with source counters on the backward main kernel, the forward kernel and prepare's scatter.
set -uo pipefail
T0=$SECONDS
FINAL_JOBS=" " FINAL_OVERHEAD=0 FINAL_PATTERNS=spread,random,b0p99,indexer FINAL_PATTERN_LIMIT=240 \
  bash scripts/device/final-check.sh
echo "timings done at $((SECONDS - T0)) s"
PROF_ROWS=151:15 PROF_KERNELS="bwd fwd scatter" timeout $((590 - (SECONDS - T0))) bash scripts/device/profile.sh
echo "all done at $((SECONDS - T0)) s"
