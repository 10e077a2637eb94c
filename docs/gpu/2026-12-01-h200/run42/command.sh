#!/usr/bin/env bash
# session 7, one call: final-check.sh on the merged build (main + the forward's lazy rescaling;
# the backward as in run 39): timings and peers, the other patterns with v1's forward beside the
# sm_90a forward, ncu of prepare, then suite1, suite2, sanitize, torch and the real-case sweep.
# attention_matches ran on this forward code in run 41 (the backward there differed only in its
# launches, reverted since).
FINAL_LIMIT=560 FINAL_OVERHEAD=0 FINAL_PATTERNS=random,b0p99,indexer \
  FINAL_JOBS="suite1 suite2 sanitize torch real" bash scripts/device/final-check.sh
