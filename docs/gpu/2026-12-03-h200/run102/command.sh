#!/usr/bin/env bash
# Run 102 (session 21): the two-builder kernel's claim gate below run 101's best (a4: 434/r0 +0.5%)
# and the merge gate of a4. base = main fcf0e5e (8 blocks); a2, a3, a4: the gate at 2, 3, 4 blocks
# (docs/next/fwd-aN.patch). The forward of 434/r0 (recent16, random), 30 calls per median, four
# rounds in alternating order; M2 of a4; then final-check.sh's correctness jobs with a4's
# gpu-suite: suite2, the 33 edge layouts on the sm_90a set, racecheck/memcheck, real cases 27-30.
# Built here: bash scripts/build-variants.sh base=- a2=docs/next/fwd-a2.patch a3=docs/next/fwd-a3.patch \
#   a4=docs/next/fwd-a4.patch; M2 of a4 into var/a4/m2. Carried: .gpu-bundle.
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/g"
names="base a2 a3 a4"; rev="a4 a3 a2 base"
for round in 1 2 3 4; do
  order=$names; [ $((round % 2)) = 0 ] && order=$rev
  for v in $order; do
    (cd .gpu-bundle/var/$v && timeout 40 ./msa bench --cases 434:0 --pattern recent16,random --stages forward \
       --warmup 2 --iters 30 --json "$OUT/g/$v-$round.jsonl" > "$OUT/g/$v-$round.log" 2>&1 || echo "$v $round rc=$?")
    printf "%s r%s %s\n" "$v" "$round" "$(grep -E '^  forward' "$OUT/g/$v-$round.log" | awk '{print $2, $5}' | tr '\n' ' ')"
  done
done
(cd .gpu-bundle/var/a4 && timeout 60 ./m2 3 > "$OUT/g/m2-a4.log" 2>&1; echo "m2 a4 rc=$?"); grep -E "M2" "$OUT/g/m2-a4.log" | tail -1
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
FINAL_SKIP_TIMING=1 FINAL_LIMIT=${RUN102_FINAL_LIMIT:-320} FINAL_REAL=27..30 FINAL_SUITE=.gpu-bundle/var/a4 \
  FINAL_JOBS="suite2 edge sanitize real" bash scripts/device/final-check.sh
ls -la "$OUT"
