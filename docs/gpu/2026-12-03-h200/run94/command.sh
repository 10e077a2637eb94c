# Run 94 (session 19): disp (docs/next/fwd-disp.patch: the forward with two builders where the
# fragments average at most 4 KV blocks, main's one builder elsewhere) against main: M2 (its
# 24x512 layout takes the two-builder kernel, the others the one-builder kernel), the forward on
# recent16 and random in two rounds in reverse order (3 calls per median), then the final check
# of disp's build: suite1, suite2, the 33 edge layouts on the sm_90a set, racecheck/memcheck,
# msa-torch (disp's wheel) with train_step.py on c151r7 and c434r2, the real-case sweep (27-36).
# Built here: bash scripts/build-variants.sh base=- disp=docs/next/fwd-disp.patch (the first form, in the
# history at 178cac1; deleted since); M2 of disp into
# var/disp/m2; `cargo xtask wheel` in disp's worktree, its wheel in target/wheels.
# Carried: .gpu-bundle (var.tar.xz with var/{base,disp}), target/wheels.
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
(cd .gpu-bundle/var/disp && timeout 60 ./m2 3 > "$OUT/r/m2-disp.log" 2>&1; echo "m2 disp rc=$?"); grep -E "M2" "$OUT/r/m2-disp.log" | tail -2
grep -E "^[0-9a-z_]+ +[0-9]+ " "$OUT/r/m2-disp.log" | head -8
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="base disp" VAR_ROUNDS=2 VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_ITERS=3 VAR_LIMIT=60 VAR_M5=0 \
  timeout 170 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|random|^clocks"
FINAL_SKIP_TIMING=1 FINAL_LIMIT=320 FINAL_REAL=27..36 FINAL_SUITE=.gpu-bundle/var/disp \
  FINAL_JOBS="suite1 suite2 edge sanitize torch real" bash scripts/device/final-check.sh
ls -la "$OUT"
