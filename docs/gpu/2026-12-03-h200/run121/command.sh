#!/usr/bin/env bash
# Run 121 (session 25): the half softmax's forms against main 0645081, 434/r0's forward, four
# rounds in alternating order: hs (docs/next/fwd-halfsm.patch, run 120's), hm (+fwd-halfsm-mask.patch:
# the full form masks only chunks 8-15, since n_visible > 64 there) and hq (+fwd-halfsm-quarter.patch:
# a third form for n_visible <= 32). The best of them if it reaches 1.005x main: M2, then suite2
# (graph replay, deterministic mode; also the host code of 0645081, not yet run on a GPU), the 33
# edge layouts, racecheck/memcheck and real cases 27-29.
# Built here: bash scripts/build-variants.sh main=- hs=docs/next/fwd-halfsm.patch \
#   hm=docs/next/fwd-halfsm.patch+docs/next/fwd-halfsm-mask.patch \
#   hq=docs/next/fwd-halfsm.patch+docs/next/fwd-halfsm-mask.patch+docs/next/fwd-halfsm-quarter.patch;
#   M2 as var/{hs,hm,hq}/m2. Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
ROW_NAMES="main hs hm hq" ROW_PICK="hs hm hq" ROW_MIN=1.005 timeout 150 bash scripts/device/row-ab.sh
SEL=$(cat "$OUT/g/pick" 2>/dev/null); echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
[ -n "$SEL" ] || exit 0
mkdir -p "$OUT/m"
(cd .gpu-bundle/var/$SEL && timeout 60 ./m2 3 > "$OUT/m/m2-$SEL.log" 2>&1; echo "m2 $SEL rc=$?"); grep -E "M2" "$OUT/m/m2-$SEL.log" | tail -2
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/$SEL FINAL_LIMIT=${RUN121_LIMIT:-330} FINAL_REAL=27..29 \
  FINAL_JOBS="suite2 edge sanitize real" bash scripts/device/final-check.sh
ls -la "$OUT"
