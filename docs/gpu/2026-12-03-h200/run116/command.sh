#!/usr/bin/env bash
# Run 116 (session 24): #11's same-run peers on main 267fc2e: the development benchmark (recent16,
# prepare / forward / backward / deterministic backward, 5 calls per median), cuDNN dense causal,
# the dense varlen peer of the short-document rows, and FlexAttention with MSA's exact semantics on
# all 32 rows, each with its ratio to msa bench's time and the weighted aggregates.
# Built here: bash scripts/build-variants.sh main=- (run 114's var.tar.xz). Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh
FINAL_BENCH=.gpu-bundle/var/main FINAL_FLEX_EXACT=-1 FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_JOBS=" " FINAL_LIMIT=520 \
  bash scripts/device/final-check.sh
