# Run 59 (session 13): the backward A/B of main ("base"), bwd-claim and bwd-claim + dq-incast
# (recent16, spread, 3 calls per median, two rounds, M5 on each), then prep-persist: its prepare::
# and graph:: tests, its A/B against base (prepare, forward), prepare's kernels per launch under
# ncu on 655/r1 for both; last, the durations and ncu's full set of the forward on 434/r0.
# Carried: .gpu-bundle (main's bundle = base, var.tar.xz from scripts/build-variants.sh).
T0=$SECONDS; left() { echo $((${1:-570} - (SECONDS - T0))); }
bash scripts/device/unpack-variants.sh
VAR_NAMES="base claim incast" VAR_STAGES=backward,backward_det VAR_PATTERN=recent16,spread VAR_ITERS=3 \
  VAR_M5_ITERS=2 VAR_LIMIT=100 timeout 380 bash scripts/device/variants-bench.sh
mv "$OUT/var.tgz" "$OUT/var-bwd.tgz"
echo "=== pprep prepare:: graph:: ($(left) s left)"
(cd .gpu-bundle/var/pprep && timeout 60 ./gpu-suite --test-threads=1 prepare:: graph:: > "$OUT/pprep-suite.log" 2>&1; echo "rc=$?")
grep -E "test result|FAILED|panicked" "$OUT/pprep-suite.log" | head
VAR_NAMES="base pprep" VAR_STAGES=prepare,forward VAR_M5=0 VAR_ITERS=3 VAR_LIMIT=45 timeout 190 \
  bash scripts/device/variants-bench.sh
mv "$OUT/var.tgz" "$OUT/var-prep.tgz"
for v in base pprep; do
  (cd .gpu-bundle/var/$v && timeout 30 ncu --clock-control none --metrics gpu__time_duration.sum,launch__grid_size \
     ./msa bench --cases 655:1 --pattern recent16 --stages prepare --warmup 0 --iters 1 > "$OUT/ncu-prep-$v.log" 2>&1
   echo "ncu $v rc=$?"); grep -E "_kernel|gpu__time|memset" "$OUT/ncu-prep-$v.log" | head -20
done
L=$(left); echo "=== profile 434/r0 ($L s left)"
[ "$L" -gt 60 ] && PROF_ROWS=434:0 PROF_FULL_ROW=434:0 PROF_KERNELS=fwd timeout "$L" bash scripts/device/profile.sh
cd "$OUT" && tar czf logs.tgz *.log prof 2>/dev/null; rm -rf *.log prof; ls -la "$OUT"
