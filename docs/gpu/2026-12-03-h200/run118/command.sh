#!/usr/bin/env bash
# Run 118 (session 24): how much idle SM time the claim order leaves on 434/r0: ncu's per-SM active
# cycles (min / avg / max against the elapsed cycles) of forward_kernel<2>, two launches each, on
# main 267fc2e and s2 (docs/next/fwd-order-s2.patch), as run 110 measured main before the order
# (317,478 / 324,377 / 335,612 of 339,094). Built: run 117's var.tar.xz. Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/g"
m=gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max
for v in main s2; do
  (cd .gpu-bundle/var/$v && timeout 60 ncu --clock-control none --metrics $m -k regex:"forward_kernel|order_kernel" -s 4 -c 4 \
     ./msa bench --cases 434:0 --pattern recent16 --stages forward --warmup 2 --iters 2 > "$OUT/g/ncu-$v.log" 2>&1 || echo "ncu $v rc=$?")
  echo "== $v"; grep -E "^  [a-z_]+.*\(|sm__cycles_active|sm__cycles_elapsed|gpu__time_duration" "$OUT/g/ncu-$v.log" | awk '{print $1, $(NF)}' | paste -sd' '
done
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
