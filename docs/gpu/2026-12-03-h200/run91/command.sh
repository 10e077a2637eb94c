# Run 91 (session 19): (1) M7, the backward's HBM-bound passes in several forms (#12's pre/post
# share: can any pass beat run 64's rates?); (2) blate (docs/next/fwd-builders*.patch, the second
# builder's first claim gated) against main on the forward, recent16 and random, two rounds in
# reverse order, with M2; (3) bwd-finish-unroll against main on the backward (recent16, two rounds)
# with M5, and ncu per-launch durations of the delta preprocess and the epilogue on both (32 rows).
# Built here: bash scripts/build-variants.sh base=- blate=docs/next/fwd-builders.patch+docs/next/fwd-builders-help.patch+docs/next/fwd-builders-adapt.patch+docs/next/fwd-builders-late.patch finish=docs/next/bwd-finish-unroll.patch
# then M2 of blate (MICROBENCH_ONLY=m2_forward_sm90 kernels/microbench/build.sh) into var/blate/m2,
# M7 (MICROBENCH_ONLY=m7_prepost) into .gpu-bundle/m7. Carried: .gpu-bundle.
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
timeout 60 .gpu-bundle/m7 > "$OUT/r/m7.log" 2>&1; echo "m7 rc=$?"; cat "$OUT/r/m7.log"
(cd .gpu-bundle/var/blate && timeout 60 ./m2 3 > "$OUT/r/m2-blate.log" 2>&1; echo "m2 blate rc=$?"); grep -E "M2|PASS|FAIL" "$OUT/r/m2-blate.log" | tail -2
(cd .gpu-bundle/var/finish && timeout 60 ./m5 3 > "$OUT/r/m5-finish.log" 2>&1; echo "m5 finish rc=$?"); grep -E "M5" "$OUT/r/m5-finish.log" | tail -2
for v in base finish; do
  (cd .gpu-bundle/var/$v && timeout 45 ncu --clock-control none -k regex:"preprocess|epilogue" --metrics gpu__time_duration.sum \
     ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 --stages backward --warmup 0 --iters 1 \
     > "$OUT/r/ncu-$v.log" 2>&1; echo "ncu $v rc=$?"); grep -cE "gpu__time_duration" "$OUT/r/ncu-$v.log"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="base blate" VAR_ROUNDS=2 VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_ITERS=3 VAR_LIMIT=60 VAR_M5=0 \
  timeout 170 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|random|^clocks"
mv "$OUT/var.tgz" "$OUT/var-fwd.tgz"
VAR_NAMES="base finish" VAR_ROUNDS=2 VAR_STAGES=backward VAR_PATTERN=recent16 VAR_ITERS=3 VAR_LIMIT=45 VAR_M5=0 \
  timeout 120 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|^clocks"
ls -la "$OUT"
