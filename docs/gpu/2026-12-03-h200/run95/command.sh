# Run 95 (session 19): disp's final form (docs/next/fwd-disp.patch, both commits: the one-builder
# kernel is main's SASS but for register names, the two-builder counters last) against main: M2
# (both kernels), racecheck and memcheck with disp's gpu-suite (sanitizer_small runs the
# two-builder kernel), and the forward on recent16, one round (3 calls per median).
# Built here: bash scripts/build-variants.sh base=- disp=docs/next/fwd-disp.patch; M2 of disp into
# var/disp/m2. Carried: .gpu-bundle (var.tar.xz with var/{base,disp}).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
(cd .gpu-bundle/var/disp && timeout 40 ./m2 3 > "$OUT/r/m2-disp.log" 2>&1; echo "m2 disp rc=$?"); grep -E "M2" "$OUT/r/m2-disp.log" | tail -1
(cd .gpu-bundle/var/disp && timeout 60 compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -2; \
  timeout 30 compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -2) > "$OUT/r/sanitize.log" 2>&1; cat "$OUT/r/sanitize.log"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="base disp" VAR_ROUNDS=1 VAR_STAGES=forward VAR_PATTERN=recent16 VAR_ITERS=3 VAR_LIMIT=40 VAR_M5=0 \
  timeout 90 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|^clocks"
ls -la "$OUT"
