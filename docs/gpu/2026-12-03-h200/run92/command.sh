# Run 92 (session 19): the half-block skip (docs/next/fwd-half.patch) against main: M2, the
# forward on recent16 and random in two rounds in reverse order (3 calls per median), then the
# 33 edge layouts on the sm_90a set and racecheck/memcheck with half's gpu-suite, concurrently.
# Built here: bash scripts/build-variants.sh base=- half=docs/next/fwd-half.patch, then M2 of half
# (MICROBENCH_ONLY=m2_forward_sm90 kernels/microbench/build.sh) into var/half/m2.
# Carried: .gpu-bundle (var.tar.xz with var/{base,half}).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
(cd .gpu-bundle/var/half && timeout 60 ./m2 3 > "$OUT/r/m2-half.log" 2>&1; echo "m2 half rc=$?"); grep -E "M2" "$OUT/r/m2-half.log" | tail -2
grep -E "^[0-9a-z_]+ +[0-9]+ " "$OUT/r/m2-half.log" | head -8
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="base half" VAR_ROUNDS=2 VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_ITERS=3 VAR_LIMIT=60 VAR_M5=0 \
  timeout 170 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|random|^clocks"
FINAL_SKIP_TIMING=1 FINAL_LIMIT=230 FINAL_SUITE=.gpu-bundle/var/half FINAL_JOBS="edge sanitize" \
  bash scripts/device/final-check.sh
ls -la "$OUT"
