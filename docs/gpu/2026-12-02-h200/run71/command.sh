# Run 71 (session 15): the backward zeroes its fp32 dQ accumulator inside the main kernel
# (target/bwd-dqz.patch = docs/next/bwd-dqz.patch, "bdqz": three producer-side warps zero it one
# query at a time, per-query flags gate each tile's dQ adds; the 384 MiB memset goes) against main
# with fwd-inunion merged ("base"): M5 on each, the backward in both modes on recent16 and random
# (3 calls per median, two rounds in reverse order); the flags' memset (64 KB) timed by events;
# then bdqz's correctness jobs concurrently: attention_matches on all 33 edge layouts (both
# modes), graph:: + attention::deterministic (suite2), racecheck + memcheck.
# Carried: .gpu-bundle (main's bundle = base, var.tar.xz with var/{base,bdqz}).
bash scripts/device/unpack-variants.sh
VAR_NAMES="base bdqz" VAR_STAGES=backward,backward_det VAR_PATTERN=recent16,random VAR_ITERS=3 \
  VAR_M5_ITERS=2 VAR_LIMIT=80 timeout 330 bash scripts/device/variants-bench.sh
timeout 30 python3 scripts/device/memset_rate.py 2 12288 > $OUT/memset.log 2>&1; cat $OUT/memset.log
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/bdqz FINAL_JOBS="edge sanitize suite2" FINAL_LIMIT=215 \
  bash scripts/device/final-check.sh
