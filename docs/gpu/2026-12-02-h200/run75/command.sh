# Run 75 (session 16): why run 74's band counting stalls, and the band cast with a longer lag.
# 1. M5 (every element against v1, the bands' counts against the adds made) of main (base) and of
#    band builds that differ only in the issuer's counting (M5 binaries built with -D flags from
#    the dq-band commit plus its MSA_BAND_LAG / MSA_BAND_DIAG switches, not in the repository):
#    L2 = run 74's band (count tile m - 2 after bulk_wait<2>, then fence.proxy.async.global +
#    fence.acq_rel.gpu and relaxed reds), NF = L2 without the two fences, NW = L2 without the bulk
#    wait, NWF = neither (NF, NW, NWF are incorrect orderings, timed only); bandl5 = L2 with lag 5.
# 2. bandl5 (docs/next/dq-band.patch + dq-band-lag.patch) against main: the backward in both modes
#    on recent16 (3 calls per median, two rounds in reverse order); ncu per-launch durations of
#    every backward kernel on bandl5 (32 rows); bandl5's correctness jobs concurrently (bitwise
#    deterministic sweep, suite2, edge layouts in three shards, racecheck/memcheck).
# Carried: .gpu-bundle (var.tar.xz with var/{base,bandl5}; diag/m5-{L2,NF,NW,NWF}).
R=$PWD; T0=$SECONDS; left() { echo $((${1:-560} - (SECONDS - T0))); }
bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for m in var/base/m5 diag/m5-L2 var/bandl5/m5 diag/m5-NF diag/m5-NW diag/m5-NWF; do
  n=$(echo $m | tr '/' '-'); (cd .gpu-bundle && timeout 60 ./$m 3 > "$OUT/r/$n.log" 2>&1; echo "$m rc=$?")
  grep -E "^[0-9a-z]|M5|differ" "$OUT/r/$n.log" | grep -v "^case" | awk '{print "  "$0}' | cut -c1-150
done
echo "=== A/B ($(left) s left)"
VAR_NAMES="base bandl5" VAR_STAGES=backward,backward_det VAR_PATTERN=recent16 VAR_ITERS=3 VAR_LIMIT=50 VAR_M5=0 \
  timeout 170 bash scripts/device/variants-bench.sh
echo "=== ncu ($(left) s left)"
(cd .gpu-bundle/var/bandl5 && timeout 80 ncu --clock-control none -k regex:"preprocess|epilogue|band_count|zero_slots|items_kernel|backward_kernel" \
   --metrics gpu__time_duration.sum ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 --stages backward \
   --warmup 0 --iters 1 > "$OUT/r/ncu-bandl5.log" 2>&1; echo "ncu rc=$?"); grep -cE "gpu__time_duration" "$OUT/r/ncu-bandl5.log"
L=$(left); echo "=== bandl5 correctness, $L s"
cd .gpu-bundle/var/bandl5
for s in 0..16 16..32; do
  (MSA_GPU_RESULTS="$OUT/r" MSA_DET_ROWS=$s timeout "$L" ./gpu-suite deterministic_backward_is_bitwise_on_every_bench_row --nocapture \
     > "$OUT/r/detrows${s%..*}.log" 2>&1; echo "rc=$?" >> "$OUT/r/detrows${s%..*}.log") &
done
(MSA_GPU_RESULTS="$OUT/r" timeout "$L" ./gpu-suite --test-threads=1 graph:: attention::deterministic \
   --skip deterministic_backward_is_bitwise_on_every_bench_row > "$OUT/r/suite2.log" 2>&1; echo "rc=$?" >> "$OUT/r/suite2.log") &
for s in 0..11 11..22 22..33; do
  (MSA_GPU_RESULTS="$OUT/r" MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS=$s timeout "$L" ./gpu-suite attention_matches --nocapture \
     > "$OUT/r/edge${s%..*}.log" 2>&1; echo "rc=$?" >> "$OUT/r/edge${s%..*}.log") &
done
(timeout "$L" bash -c "compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3; \
   compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3" \
   > "$OUT/r/sanitize.log" 2>&1; echo "rc=$?" >> "$OUT/r/sanitize.log") &
wait
for f in "$OUT"/r/detrows*.log "$OUT"/r/suite2.log "$OUT"/r/edge*.log "$OUT"/r/sanitize.log; do
  echo "== $(basename $f)"; grep -E "test result|FAILED|panicked|ERROR SUMMARY|RACECHECK|rc=" "$f" | tail -4; done
cd "$OUT" && tar czf r.tgz r && rm -rf r; ls -la "$OUT"
