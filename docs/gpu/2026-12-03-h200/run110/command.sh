#!/usr/bin/env bash
# Run 110 (session 23): why run 108's cheap (fwd-cheaplast.patch) lost 4% on 434/r0. mid
# (+fwd-cheap-mid.patch: only claims in the second half of the items are tested and set aside)
# and sel (+fwd-cheap-sel.patch, a diagnostic: every claim tests its tile as cheap does until
# 2 x gridDim first-block tiles are counted, none is set aside). base = main 80f6014. 434/r0's
# forward, four rounds in alternating order (row-ab.sh); then ncu's per-SM active cycles of the
# two-builder kernel on base and cheap.
# Built here: bash scripts/build-variants.sh base=- cheap=docs/next/fwd-cheaplast.patch \
#   mid=docs/next/fwd-cheaplast.patch+docs/next/fwd-cheap-mid.patch \
#   sel=docs/next/fwd-cheaplast.patch+docs/next/fwd-cheap-sel.patch. Carried: .gpu-bundle.
set -u
ROW_NAMES="base cheap mid sel" timeout 200 bash scripts/device/row-ab.sh
m=gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max
for v in base cheap; do
  (cd .gpu-bundle/var/$v && timeout 60 ncu --clock-control none --metrics $m -k regex:"forward_kernel" -s 2 -c 2 \
     ./msa bench --cases 434:0 --pattern recent16 --stages forward --warmup 2 --iters 2 > "$OUT/g/ncu-$v.log" 2>&1 || echo "ncu $v rc=$?")
  echo "== $v"; grep -E "sm__cycles_active|sm__cycles_elapsed|gpu__time_duration" "$OUT/g/ncu-$v.log" | awk '{print $1, $(NF)}' | paste -sd' '
done
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
