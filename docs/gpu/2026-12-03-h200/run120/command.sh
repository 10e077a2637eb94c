#!/usr/bin/env bash
# Run 120 (session 25): the half softmax (docs/next/fwd-halfsm.patch: a warp whose query sees at
# most a block's first 64 keys exponentiates, sums and packs only those columns; S and PV keep
# their shapes) against main 0645081, and hss2 = the same plus s2 (docs/next/fwd-order-s2.patch,
# rebased on 0645081). 434/r0's forward, four rounds in alternating order; the 32 rows' recent16
# forward for main and hs, two rounds; M2 (every element of O and LSE on six layouts, 24x512 being
# the two-builder kernel with unions up to 4, where s2's risk lies) for hs and hss2. If hs or hss2
# reaches 1.005x main on 434/r0 (pick): the 32 rows for main and hs, and the 33 edge layouts on
# the pick; otherwise suite2 on main (its host code, 0645081, had not run on a GPU).
# Built here: bash scripts/build-variants.sh main=- hs=docs/next/fwd-halfsm.patch \
#   hss2=docs/next/fwd-halfsm.patch+docs/next/fwd-order-s2.patch; M2 as var/{hs,hss2}/m2.
# Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
ROW_NAMES="main hs hss2" ROW_PICK="hs hss2" ROW_MIN=1.005 timeout 120 bash scripts/device/row-ab.sh
SEL=$(cat "$OUT/g/pick" 2>/dev/null); echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
mkdir -p "$OUT/m"
for v in hs hss2 hss2 hs; do
  n=$(ls "$OUT/m" | grep -c "^m2-$v"); (cd .gpu-bundle/var/$v && timeout 60 ./m2 10 > "$OUT/m/m2-$v-$n.log" 2>&1; echo "m2 $v rc=$?")
  grep -E "^(24x512|6x2048|odd) |M2" "$OUT/m/m2-$v-$n.log" | awk '{print $1, $5, $6, $8, $NF}' | paste -sd' '
done
(cd "$OUT" && tar czf m.tgz m && rm -rf m)
if [ -z "$SEL" ]; then
  FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/main FINAL_LIMIT=150 FINAL_JOBS="suite2" bash scripts/device/final-check.sh
  ls -la "$OUT"; exit 0
fi
VAR_NAMES="main hs" VAR_STAGES=forward VAR_PATTERN=recent16 VAR_ITERS=5 VAR_LIMIT=60 VAR_M5=0 \
  timeout 200 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|^clocks"
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/$SEL FINAL_LIMIT=200 FINAL_JOBS="edge" bash scripts/device/final-check.sh
ls -la "$OUT"
