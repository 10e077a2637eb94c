# Run 72 (session 15): the final check of main with fwd-inunion merged (68a74e0): M5 of main
# ("base") and of bdqz v2 (m5-dqz2: the dq_accum zeroing in the main kernel with round counters
# and a proxy fence only on tiles that acquired zeros), then final-check.sh: the development
# benchmark (recent16: prepare, forward, backward, backward_det), the forward and v1's forward on
# random, b0p99, indexer, the PyTorch peers (cuDNN, FlexAttention, varlen), then suite1, suite2,
# msa-torch (suite + train_step) and the real-case sweep on cases 27..39 concurrently.
# Carried: .gpu-bundle (main's bundle, m5-dqz2, var.tar.xz with var/{base,bdqz}), target/wheels.
bash scripts/device/unpack-variants.sh
for m in var/base/m5 m5-dqz2; do (cd .gpu-bundle && timeout 60 ./$m 2 > $OUT/$(basename $m)-m5.log 2>&1; echo "$m rc=$?"; grep -E "^[0-9a-z_]+ +[0-9]|M5" $OUT/$(basename $m)-m5.log); done
FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_FLEX_EXACT=0 FINAL_PATTERNS=random,b0p99,indexer \
  FINAL_PATTERN_STAGES=forward,forward_sm80 FINAL_PATTERN_LIMIT=130 FINAL_REAL=27..39 FINAL_LIMIT=490 \
  FINAL_JOBS="suite1 suite2 torch real" bash scripts/device/final-check.sh
