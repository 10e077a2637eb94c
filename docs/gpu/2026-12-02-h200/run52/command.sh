#!/usr/bin/env bash
# session 9, one call: main at the merge of the deferred dQ staging (205210a's kernels; bundle and
# target/wheels carried): final-check's timings (recent16: prepare, forward, both backward modes;
# spread / random / b0p99 / indexer: the backward; PyTorch peers without the exact FlexAttention
# rows, which run 51 timed), then the msa-torch suite and the example training step.
set -uo pipefail
FINAL_PATTERNS=spread,random,b0p99,indexer FINAL_PATTERN_STAGES=backward FINAL_PATTERN_LIMIT=150 \
FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_JOBS="torch" FINAL_LIMIT=295 bash scripts/device/final-check.sh
