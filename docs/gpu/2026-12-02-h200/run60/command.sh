# Run 60 (session 13): the final check of main with bwd-claim and prep-persist merged, with a
# fresh wheel: the development benchmark (recent16; spread, random, b0p99, indexer backward in
# both modes), the peers, then every correctness job concurrently.
# Carried: .gpu-bundle, target/wheels.
FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_PATTERNS=spread,random,b0p99,indexer \
  FINAL_PATTERN_STAGES=backward,backward_det FINAL_PATTERN_LIMIT=170 FINAL_LIMIT=570 \
  bash scripts/device/final-check.sh
