# Run 66 (session 14): main (66b6c12) timed with every peer in one run for #11 and #12: msa bench
# on the development suite (recent16: prepare, forward, backward, deterministic backward; 5 calls
# per median), cuDNN dense causal, the dense varlen peer, FlexAttention with MSA's exact semantics
# on all 32 rows; then suite1 and suite2 on main (the launch helpers of review commit 3bed4ce had
# not run a suite yet).
# Carried: .gpu-bundle (main's bundle).
FINAL_FLEX_EXACT=-1 FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_JOBS="suite1 suite2" FINAL_LIMIT=575 \
  bash scripts/device/final-check.sh
