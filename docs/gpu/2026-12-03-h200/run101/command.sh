#!/usr/bin/env bash
# Run 101 (session 21): the two-builder kernel's claim gate on 434/r0, the one development row that
# runs it (run 97: SM active 94.9% of the elapsed cycles; a CTA may hold up to ~6 tiles of ~4 us
# when the counter runs out). base = main fcf0e5e (gate 8 blocks, claims weigh 4, polled every
# 256 ns); a4, a6, a12: the gate at 4, 6, 12 blocks (claims weigh half); p32: polled every 32 ns.
# The forward of 434/r0 (recent16 and random), 30 calls per median, four rounds in alternating
# order; then ncu's full set with SASS sampling of main's forward_kernel<2> on 434/r0.
# Built here: bash scripts/build-variants.sh base=- a4=docs/next/fwd-a4.patch a6=docs/next/fwd-a6.patch \
#   a12=docs/next/fwd-a12.patch p32=docs/next/fwd-p32.patch. Carried: .gpu-bundle.
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/g"
names="base a4 a6 a12 p32"; rev="p32 a12 a6 a4 base"
for round in 1 2 3 4; do
  order=$names; [ $((round % 2)) = 0 ] && order=$rev
  for v in $order; do
    (cd .gpu-bundle/var/$v && timeout 40 ./msa bench --cases 434:0 --pattern recent16,random --stages forward \
       --warmup 2 --iters 30 --json "$OUT/g/$v-$round.jsonl" > "$OUT/g/$v-$round.log" 2>&1 || echo "$v $round rc=$?")
    printf "%s r%s %s\n" "$v" "$round" "$(grep -E '^  forward' "$OUT/g/$v-$round.log" | awk '{print $2, $5}' | tr '\n' ' ')"
  done
done
(cd .gpu-bundle/var/base && timeout 120 ncu --clock-control none --set full --import-source no -k regex:"forward_kernel" -c 1 \
   -o "$OUT/g/fwd434" ./msa bench --cases 434:0 --pattern recent16 --stages forward --warmup 0 --iters 1 > "$OUT/g/ncu.log" 2>&1; echo "ncu rc=$?")
ncu --import "$OUT/g/fwd434.ncu-rep" --page details > "$OUT/g/details434r0.txt" 2>&1
ncu --import "$OUT/g/fwd434.ncu-rep" --page source --print-source sass --csv > "$OUT/g/sass434r0.csv" 2>&1
grep -E "Duration|Elapsed Cycles|SM Active Cycles|Compute \(SM\) Throughput|Registers Per" "$OUT/g/details434r0.txt" | head -6
rm -f "$OUT/g/fwd434.ncu-rep"; (cd "$OUT" && tar czf g.tgz g && rm -rf g); ls -la "$OUT"
