# Run 90 (session 18): main 0a9e786 (qwarp merged) timed with its peers in one call: msa bench on
# recent16 (prepare, forward, backward, deterministic backward; 5 calls per median), cuDNN dense
# causal and the dense varlen peer (bench_peers.py). No correctness job (run 89 ran them).
# Carried: .gpu-bundle.
FINAL_JOBS=" " FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_FLEX_EXACT=0 FINAL_LIMIT=240 bash scripts/device/final-check.sh
ls -la "$OUT"
