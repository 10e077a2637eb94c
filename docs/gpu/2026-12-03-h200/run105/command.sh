#!/usr/bin/env bash
# Run 105 (session 22): run 104 again after its fix. Run 104's variants hung (every call past 40 s):
# a claim that finds no item added kClaimWeight to `ahead` and never took it back, so the other
# builder's gate at 1 or 2 blocks never opened (at 4 it did). scripts/analysis/builders_model.py,
# given the end gate, finds that deadlock in 239 of 500 interleavings and none with the weight
# returned, which docs/next/fwd-end.patch now does. Same builds and measurements as run 104
# (base = main 802c699; e21 = end window 2 x gridDim items, gate 1; w1, a2, w4), then on e21:
# M2, and suite2, the 33 edge layouts on the sm_90a set and racecheck/memcheck (final-check.sh).
# Built here as run 104 (scripts/build-variants.sh ...), plus e21's M2 (kernels/microbench/build.sh)
# as var/e21/m2. Carried: .gpu-bundle.
bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/g"
names="base e21 w1 a2 w4"; rev="w4 a2 w1 e21 base"; dead=""
for round in 1 2 3 4; do
  order=$names; [ $((round % 2)) = 0 ] && order=$rev
  for v in $order; do
    case " $dead " in *" $v "*) continue;; esac  # a build that hung is not timed again
    (cd .gpu-bundle/var/$v && timeout 25 ./msa bench --cases 434:0 --pattern recent16,random --stages forward \
       --warmup 2 --iters 30 --json "$OUT/g/$v-$round.jsonl" > "$OUT/g/$v-$round.log" 2>&1) || { echo "$v $round hung"; dead="$dead $v"; }
    printf "%s r%s %s\n" "$v" "$round" "$(grep -E '^  forward' "$OUT/g/$v-$round.log" | awk '{print $2, $5}' | tr '\n' ' ')"
  done
done
m=sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_elapsed.max,gpu__time_duration.sum
for v in $names; do
  case " $dead " in *" $v "*) continue;; esac
  (cd .gpu-bundle/var/$v && timeout 60 ncu --clock-control none --metrics $m -k regex:"forward_kernel" -s 2 -c 2 \
     ./msa bench --cases 434:0 --pattern recent16 --stages forward --warmup 2 --iters 2 > "$OUT/g/ncu-$v.log" 2>&1 || echo "ncu $v rc=$?")
  echo "== $v"; grep -E "sm__cycles_active|sm__cycles_elapsed|gpu__time_duration" "$OUT/g/ncu-$v.log" | awk '{print $1, $(NF)}' | paste -sd' '
done
case " $dead " in *" e21 "*) (cd "$OUT" && tar czf g.tgz g && rm -rf g); exit 1;; esac
(cd .gpu-bundle/var/e21 && timeout 60 ./m2 3 > "$OUT/g/m2-e21.log" 2>&1; echo "m2 e21 rc=$?"); grep -E "M2" "$OUT/g/m2-e21.log" | tail -2
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/e21 FINAL_LIMIT=${RUN105_LIMIT:-290} FINAL_JOBS="suite2 edge sanitize" \
  bash scripts/device/final-check.sh
ls -la "$OUT"
