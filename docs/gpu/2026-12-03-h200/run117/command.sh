#!/usr/bin/env bash
# Run 117 (session 24): the two-builder claim gate retuned under the claim order (kAheadShort 4 was
# chosen in run 101 for the end the order has since changed): g5, g6, g8
# (docs/next/fwd-order-g{5,6,8}.patch) and s2 again against main 267fc2e, 434/r0's forward, four
# rounds in alternating order. If g5, g6 or g8 reaches 1.005x main: its M2, suite2, the 33 edge
# layouts, racecheck/memcheck and real cases 27-28.
# Built here: bash scripts/build-variants.sh main=- g5=docs/next/fwd-order-g5.patch \
#   g6=docs/next/fwd-order-g6.patch g8=docs/next/fwd-order-g8.patch s2=docs/next/fwd-order-s2.patch;
#   M2 as var/{g5,g6,g8}/m2. Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
ROW_NAMES="main g5 g6 g8 s2" ROW_PICK="g5 g6 g8" ROW_MIN=1.005 timeout 200 bash scripts/device/row-ab.sh
SEL=$(cat "$OUT/g/pick" 2>/dev/null); echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
[ -n "$SEL" ] || exit 0
mkdir -p "$OUT/m"
(cd .gpu-bundle/var/$SEL && timeout 60 ./m2 3 > "$OUT/m/m2-$SEL.log" 2>&1; echo "m2 $SEL rc=$?"); grep -E "M2" "$OUT/m/m2-$SEL.log" | tail -2
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/$SEL FINAL_LIMIT=${RUN117_LIMIT:-290} FINAL_REAL=27..29 \
  FINAL_JOBS="suite2 edge sanitize real" bash scripts/device/final-check.sh
ls -la "$OUT"
