#!/usr/bin/env bash
# Run 104 (session 22): the two-builder kernel's end-aware claim gate on 434/r0 (run 101: SM active
# 94.7% of the elapsed cycles; when the counter runs out a CTA still holds its gate of 4 blocks
# plus an item). base = main 802c699; e21: for a CTA's claims in the last 2 x gridDim items the gate
# closes at 1 block (docs/next/fwd-end.patch); w1: window 1; a2: gate 2 at the end; w4: window 4.
# The forward of 434/r0 (recent16 and random), 30 calls per median, four rounds in alternating
# order; then ncu's per-SM active cycles (min/avg/max) and the elapsed cycles of forward_kernel
# on 434/r0 for every build.
# Built here: bash scripts/build-variants.sh base=- e21=docs/next/fwd-end.patch \
#   w1=docs/next/fwd-end.patch+docs/next/fwd-end-w1.patch a2=docs/next/fwd-end.patch+docs/next/fwd-end-a2.patch \
#   w4=docs/next/fwd-end.patch+docs/next/fwd-end-w4.patch. Carried: .gpu-bundle.
bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/g"
names="base e21 w1 a2 w4"; rev="w4 a2 w1 e21 base"
for round in 1 2 3 4; do
  order=$names; [ $((round % 2)) = 0 ] && order=$rev
  for v in $order; do
    (cd .gpu-bundle/var/$v && timeout 40 ./msa bench --cases 434:0 --pattern recent16,random --stages forward \
       --warmup 2 --iters 30 --json "$OUT/g/$v-$round.jsonl" > "$OUT/g/$v-$round.log" 2>&1 || echo "$v $round rc=$?")
    printf "%s r%s %s\n" "$v" "$round" "$(grep -E '^  forward' "$OUT/g/$v-$round.log" | awk '{print $2, $5}' | tr '\n' ' ')"
  done
done
m=sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max,gpu__time_duration.sum
for v in $names; do
  (cd .gpu-bundle/var/$v && timeout 60 ncu --clock-control none --metrics $m -k regex:"forward_kernel" -s 2 -c 2 \
     ./msa bench --cases 434:0 --pattern recent16 --stages forward --warmup 2 --iters 2 > "$OUT/g/ncu-$v.log" 2>&1 || echo "ncu $v rc=$?")
  echo "== $v"; grep -E "sm__cycles_active|sm__cycles_elapsed|gpu__time_duration" "$OUT/g/ncu-$v.log" | awk '{print $1, $(NF)}' | paste -sd' '
done
(cd "$OUT" && tar czf g.tgz g && rm -rf g); ls -la "$OUT"
