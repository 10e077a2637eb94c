#!/usr/bin/env bash
# Run 113 (session 24): the two-builder kernel's claim order written before the launch. ord
# (docs/next/fwd-order.patch: order_kernel, one CTA in the counter memset's place, writes the
# order the counter walks, the first 2 x grid first-block tiles of a 1,024-claim window last; the
# forward is its programmatic dependent), ordp (+fwd-order-plain.patch: launched plainly), ordn
# (+fwd-order-none.patch: the order mechanism without deferral, a measurement), idx
# (fwd-idx.patch: one dependent index load per claim, a diagnostic) and rel (run 112's) against
# base = main 74c6ed1, 434/r0's forward, four rounds in alternating order. If ord or ordp reaches
# 1.005x base: its M2, suite2, the 33 edge layouts, racecheck/memcheck, real cases 27-29.
# Built here: bash scripts/build-variants.sh base=- idx=docs/next/fwd-idx.patch \
#   rel=docs/next/fwd-cheaplast.patch+docs/next/fwd-cheap-one.patch+docs/next/fwd-cheap-rel.patch \
#   ord=docs/next/fwd-order.patch ordp=docs/next/fwd-order.patch+docs/next/fwd-order-plain.patch \
#   ordn=docs/next/fwd-order.patch+docs/next/fwd-order-none.patch; M2 as var/{ord,ordp}/m2.
# Carried: .gpu-bundle (main's msa and gpu-suite are base's).
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/base/msa .gpu-bundle/var/base/gpu-suite .gpu-bundle/
ROW_NAMES="base idx rel ord ordp ordn" ROW_PICK="ord ordp" ROW_MIN=1.005 timeout 200 bash scripts/device/row-ab.sh
SEL=$(cat "$OUT/g/pick" 2>/dev/null); echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
[ -n "$SEL" ] || exit 0
mkdir -p "$OUT/m"
(cd .gpu-bundle/var/$SEL && timeout 60 ./m2 3 > "$OUT/m/m2-$SEL.log" 2>&1; echo "m2 $SEL rc=$?"); grep -E "M2" "$OUT/m/m2-$SEL.log" | tail -2
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/$SEL FINAL_LIMIT=${RUN113_LIMIT:-300} FINAL_REAL=27..29 \
  FINAL_JOBS="suite2 edge sanitize real" bash scripts/device/final-check.sh
ls -la "$OUT"
