#!/usr/bin/env bash
# Run 114 (session 24): the claim order's settings on merged main (267fc2e: kDeferWaves 2) against
# w1, w3, w4 (docs/next/fwd-order-w{1,3,4}.patch: 1, 3, 4 x grid first-block tiles deferred) and
# s2 (fwd-order-s2.patch: both builders' first items by CTA index, the counter's order from
# 2 x grid, so no builder waits for order_kernel at the start); 434/r0's forward, four rounds in
# alternating order. Then the development benchmark and its peers on the build kept (the one that
# reaches 1.005x main, else main), and its correctness jobs (a variant: M2, suite2, the 33 edge
# layouts, racecheck/memcheck, real cases 27-28; always: msa-torch and train_step.py on main's wheel).
# Built here: bash scripts/build-variants.sh main=- w1=docs/next/fwd-order-w1.patch \
#   w3=docs/next/fwd-order-w3.patch w4=docs/next/fwd-order-w4.patch s2=docs/next/fwd-order-s2.patch;
#   M2 as var/{w1,w3,w4,s2}/m2; the wheel by `cargo xtask wheel` at 267fc2e.
# Carried: .gpu-bundle, target/wheels.
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
ROW_NAMES="main w1 w3 w4 s2" ROW_PICK="w1 w3 w4 s2" ROW_MIN=1.005 timeout 200 bash scripts/device/row-ab.sh
SEL=$(cat "$OUT/g/pick" 2>/dev/null); echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
JOBS="torch"
if [ -n "$SEL" ]; then
  mkdir -p "$OUT/m"
  (cd .gpu-bundle/var/$SEL && timeout 60 ./m2 3 > "$OUT/m/m2-$SEL.log" 2>&1; echo "m2 $SEL rc=$?"); grep -E "M2" "$OUT/m/m2-$SEL.log" | tail -2
  JOBS="suite2 edge sanitize real torch"
fi
V=${SEL:-main}
FINAL_BENCH=.gpu-bundle/var/$V FINAL_SUITE=.gpu-bundle/var/$V FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_REAL=27..29 \
  FINAL_LIMIT=${RUN114_LIMIT:-460} FINAL_JOBS="$JOBS" bash scripts/device/final-check.sh
ls -la "$OUT"
