# Run 70 (session 15, first call): the gated in-kernel forward union (docs/next/fwd-inunion.patch,
# "fwdj", the shared-memory-atomics form not run before): M2 on its kernel, a second A/B round
# against main ("base") on recent16 and random, then attention_matches on all 33 edge layouts and
# racecheck + memcheck with fwdj's gpu-suite.
# Carried: .gpu-bundle (main's bundle, m2-fwdj, var.tar.xz with var/{base,fwdj}).
bash scripts/device/unpack-variants.sh
(cd .gpu-bundle && timeout 90 ./m2-fwdj 5 > $OUT/m2-fwdj.log 2>&1; echo "m2 rc=$?"; tail -15 $OUT/m2-fwdj.log)
VAR_NAMES="base fwdj" VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_M5=0 VAR_ITERS=3 \
  VAR_LIMIT=60 timeout 280 bash scripts/device/variants-bench.sh
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/fwdj FINAL_JOBS="edge sanitize" FINAL_LIMIT=240 \
  bash scripts/device/final-check.sh
