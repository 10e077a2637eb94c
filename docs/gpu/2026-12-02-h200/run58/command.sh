# Run 58 (session 11): the final check of main at 4cf8bde (det-dnorm + bwd-qorder + det-parts),
# with a fresh wheel. Carried: .gpu-bundle, target/wheels.
FINAL_JOBS="torch real" FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_PATTERNS=spread,random,b0p99,indexer \
  FINAL_PATTERN_STAGES=backward,backward_det FINAL_PATTERN_LIMIT=210 FINAL_LIMIT=575 \
  bash scripts/device/final-check.sh
