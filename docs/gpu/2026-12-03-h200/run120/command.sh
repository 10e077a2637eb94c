#!/usr/bin/env bash
# Run 120 (session 24): s2 (docs/next/fwd-order-s2.patch) where its risk lies: M2's 24x512 layout
# (documents of 4 blocks, so the two-builder kernel with unions up to 4, where the helper's gate can
# stay shut) beside main 3b32c5d; M2 checks every element of O and LSE on its six layouts and
# times them, two rounds in alternating order, 10 calls per median.
# Built here: bash scripts/build-variants.sh main=- s2=docs/next/fwd-order-s2.patch; M2 as
# var/{main,s2}/m2. Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/g"
for v in main s2 s2 main; do
  n=$(ls "$OUT/g" | grep -c "^m2-$v"); (cd .gpu-bundle/var/$v && timeout 60 ./m2 10 > "$OUT/g/m2-$v-$n.log" 2>&1; echo "$v rc=$?")
  grep -E "^(24x512|6x2048|odd) |M2" "$OUT/g/m2-$v-$n.log" | awk '{print $1, $5, $6, $8, $NF}' | paste -sd' '
done
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
