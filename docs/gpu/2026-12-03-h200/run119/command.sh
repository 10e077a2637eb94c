#!/usr/bin/env bash
# Run 119 (session 24): the two-builder K/V loader's peek (docs/next/fwd-kvpeek.patch: the next
# tile's slot and entries taken before this tile's last K load waits for its ring stage, so their
# L2 round trip overlaps that wait) as kvpf, and with s2 (fwd-order-s2.patch) as kvs2, against main
# 47b0899; 434/r0's forward, four rounds in alternating order. If either reaches 1.005x main: its
# M2, suite2, the 33 edge layouts, racecheck/memcheck and real cases 27-28.
# Built here: bash scripts/build-variants.sh main=- kvpf=docs/next/fwd-kvpeek.patch \
#   kvs2=docs/next/fwd-order-s2.patch+docs/next/fwd-kvpeek.patch; M2 as var/{kvpf,kvs2}/m2.
# Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
ROW_NAMES="main kvpf kvs2" ROW_PICK="kvpf kvs2" ROW_MIN=1.005 timeout 120 bash scripts/device/row-ab.sh
SEL=$(cat "$OUT/g/pick" 2>/dev/null); echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
[ -n "$SEL" ] || exit 0
mkdir -p "$OUT/m"
(cd .gpu-bundle/var/$SEL && timeout 60 ./m2 3 > "$OUT/m/m2-$SEL.log" 2>&1; echo "m2 $SEL rc=$?"); grep -E "M2" "$OUT/m/m2-$SEL.log" | tail -2
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/$SEL FINAL_LIMIT=${RUN119_LIMIT:-210} FINAL_REAL=27..29 \
  FINAL_JOBS="suite2 edge sanitize real" bash scripts/device/final-check.sh
ls -la "$OUT"
