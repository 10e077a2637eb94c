# Run 74 (session 16): dq-band (docs/next/dq-band.patch: the dQ cast inside the main kernel, band by
# band) and its diagnostic bandnc (+ dq-band-nocast.patch: the bands counted, no cast warp) against
# main (base): M5 on each (every element against v1, the bands' counts against the adds made), the
# backward in both modes on recent16 (3 calls per median, two rounds in reverse order); ncu
# per-launch durations on band of every backward kernel (all 32 rows, unmodified clocks); then
# band's correctness jobs concurrently: the bitwise deterministic sweep (2 shards), suite2,
# racecheck/memcheck, edge layouts 0..11.
# Carried: .gpu-bundle (var.tar.xz with var/{base,band,bandnc}).
R=$PWD; T0=$SECONDS; left() { echo $((${1:-560} - (SECONDS - T0))); }
VAR_NAMES="base band bandnc" VAR_STAGES=backward,backward_det VAR_PATTERN=recent16 VAR_ITERS=3 VAR_LIMIT=50 \
  VAR_M5_ITERS=5 timeout 300 bash scripts/device/variants-bench.sh
mkdir -p "$OUT/r"; echo "=== ncu ($(left) s left)"
(cd .gpu-bundle/var/band && timeout 90 ncu --clock-control none -k regex:"preprocess|epilogue|band_count|zero_slots|items_kernel|backward_kernel" \
   --metrics gpu__time_duration.sum ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 --stages backward \
   --warmup 0 --iters 1 > "$OUT/r/ncu-band.log" 2>&1; echo "ncu rc=$?"); grep -cE "gpu__time_duration" "$OUT/r/ncu-band.log"
L=$(left); echo "=== band correctness, $L s"
cd .gpu-bundle/var/band
for s in 0..16 16..32; do
  (MSA_GPU_RESULTS="$OUT/r" MSA_DET_ROWS=$s timeout "$L" ./gpu-suite deterministic_backward_is_bitwise_on_every_bench_row --nocapture \
     > "$OUT/r/detrows${s%..*}.log" 2>&1; echo "rc=$?" >> "$OUT/r/detrows${s%..*}.log") &
done
(MSA_GPU_RESULTS="$OUT/r" timeout "$L" ./gpu-suite --test-threads=1 graph:: attention::deterministic \
   --skip deterministic_backward_is_bitwise_on_every_bench_row > "$OUT/r/suite2.log" 2>&1; echo "rc=$?" >> "$OUT/r/suite2.log") &
(MSA_GPU_RESULTS="$OUT/r" MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS=0..11 timeout "$L" ./gpu-suite attention_matches --nocapture \
   > "$OUT/r/edge0.log" 2>&1; echo "rc=$?" >> "$OUT/r/edge0.log") &
(timeout "$L" bash -c "compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3; \
   compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3" \
   > "$OUT/r/sanitize.log" 2>&1; echo "rc=$?" >> "$OUT/r/sanitize.log") &
wait
for f in "$OUT"/r/detrows*.log "$OUT"/r/suite2.log "$OUT"/r/edge0.log "$OUT"/r/sanitize.log; do
  echo "== $(basename $f)"; grep -E "test result|FAILED|panicked|SUMMARY|ERROR SUMMARY|RACECHECK|rc=" "$f" | tail -4; done
cd "$OUT" && tar czf r.tgz r && rm -rf r; ls -la "$OUT"
