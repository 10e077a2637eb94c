#!/usr/bin/env bash
# Run 107 (session 22): wr (docs/next/fwd-wr.patch): shared_builder's claim that finds no item
# returns its gate weight (main keeps it, so the other builder's gate counts 2 phantom blocks
# at the very end; a deadlock at gates below 3, run 104). base = main 802c699. 434/r0's forward
# (recent16, random), 30 calls per median, four rounds in alternating order; wr's M2; suite2 and
# racecheck/memcheck with wr's gpu-suite (run 105 passed the 33 edge layouts on e21, whose exit
# path is this one). forward_kernel<1>'s SASS is identical in both builds (checked here).
# Built here: bash scripts/build-variants.sh base=- wr=docs/next/fwd-wr.patch; wr's M2 as var/wr/m2.
# Carried: .gpu-bundle.
bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/g"
names="base wr"; rev="wr base"; dead=""
for round in 1 2 3 4; do
  order=$names; [ $((round % 2)) = 0 ] && order=$rev
  for v in $order; do
    case " $dead " in *" $v "*) continue;; esac
    (cd .gpu-bundle/var/$v && timeout 25 ./msa bench --cases 434:0 --pattern recent16,random --stages forward \
       --warmup 2 --iters 30 --json "$OUT/g/$v-$round.jsonl" > "$OUT/g/$v-$round.log" 2>&1) || { echo "$v $round hung"; dead="$dead $v"; }
    printf "%s r%s %s\n" "$v" "$round" "$(grep -E '^  forward' "$OUT/g/$v-$round.log" | awk '{print $2, $5}' | tr '\n' ' ')"
  done
done
case " $dead " in *" wr "*) (cd "$OUT" && tar czf g.tgz g && rm -rf g); exit 1;; esac
(cd .gpu-bundle/var/wr && timeout 60 ./m2 3 > "$OUT/g/m2-wr.log" 2>&1; echo "m2 wr rc=$?"); grep -E "M2" "$OUT/g/m2-wr.log" | tail -2
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/wr FINAL_LIMIT=${RUN107_LIMIT:-170} FINAL_JOBS="suite2 sanitize" \
  bash scripts/device/final-check.sh
ls -la "$OUT"
