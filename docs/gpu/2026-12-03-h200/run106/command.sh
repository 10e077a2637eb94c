#!/usr/bin/env bash
# Run 106 (session 22): the forward's claim counter zeroed by a kernel whose programmatic dependent
# the forward is (pdl, docs/next/fwd-pdl.patch: no memset in front of the launch; the builders
# wait for it before their first counter claim), the second builder's help conditions (hb1:
# kHelpBelow 1, main 2; hu2 / hu5: kHelpUnion 2 / 5, main 3), and a per-CTA timeline of main's
# two-builder kernel on 434/r0 (diag, docs/next/fwd-diag.patch: printf at each CTA's end).
# base = main 802c699. 434/r0's forward (recent16, random), 30 calls per median, four rounds in
# alternating order; base and pdl on all 32 rows (recent16 forward, two rounds: pdl changes both
# kernels' launch); diag's timeline; then pdl's M2, and suite2 (graphs), the 33 edge layouts,
# racecheck/memcheck, msa-torch (pdl's wheel) and real cases 27-29 (final-check.sh).
# Built here: bash scripts/build-variants.sh base=- pdl=docs/next/fwd-pdl.patch hb1=docs/next/fwd-hb1.patch \
#   hu2=docs/next/fwd-hu2.patch hu5=docs/next/fwd-hu5.patch diag=docs/next/fwd-diag.patch; pdl's M2 as var/pdl/m2;
#   pdl's wheel (cargo xtask wheel in ../wt-pdl) in target/wheels. Carried: .gpu-bundle, target/wheels.
bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/g"
names="base pdl hb1 hu2 hu5"; rev="hu5 hu2 hb1 pdl base"; dead=""
for round in 1 2 3 4; do
  order=$names; [ $((round % 2)) = 0 ] && order=$rev
  for v in $order; do
    case " $dead " in *" $v "*) continue;; esac  # a build that hung is not timed again
    (cd .gpu-bundle/var/$v && timeout 25 ./msa bench --cases 434:0 --pattern recent16,random --stages forward \
       --warmup 2 --iters 30 --json "$OUT/g/$v-$round.jsonl" > "$OUT/g/$v-$round.log" 2>&1) || { echo "$v $round hung"; dead="$dead $v"; }
    printf "%s r%s %s\n" "$v" "$round" "$(grep -E '^  forward' "$OUT/g/$v-$round.log" | awk '{print $2, $5}' | tr '\n' ' ')"
  done
done
for round in 1 2; do
  order="base pdl"; [ $round = 2 ] && order="pdl base"
  for v in $order; do
    case " $dead " in *" $v "*) continue;; esac
    (cd .gpu-bundle/var/$v && timeout 60 ./msa bench --suite "$PWD/../../../data/cases/dev_bench.json" --pattern recent16 \
       --stages forward --warmup 1 --iters 5 --json "$OUT/g/all-$v-$round.jsonl" > "$OUT/g/all-$v-$round.log" 2>&1 || echo "all $v rc=$?")
    echo "all $v r$round $(grep -E '^  recent16 +forward' "$OUT/g/all-$v-$round.log" | head -1)"
  done
done
(cd .gpu-bundle/var/diag && timeout 30 ./msa bench --cases 434:0 --pattern recent16 --stages forward --warmup 1 --iters 3 \
   > "$OUT/g/diag.log" 2>&1; echo "diag rc=$? lines $(grep -c '^TL' "$OUT/g/diag.log")")
case " $dead " in *" pdl "*) (cd "$OUT" && tar czf g.tgz g && rm -rf g); exit 1;; esac
(cd .gpu-bundle/var/pdl && timeout 60 ./m2 3 > "$OUT/g/m2-pdl.log" 2>&1; echo "m2 pdl rc=$?"); grep -E "M2" "$OUT/g/m2-pdl.log" | tail -2
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/pdl FINAL_LIMIT=${RUN106_LIMIT:-300} FINAL_REAL=27..29 \
  FINAL_JOBS="suite2 edge sanitize torch real" bash scripts/device/final-check.sh
ls -la "$OUT"
