# Run 78 (session 16): bwd-kvfin (docs/next/bwd-kvfin.patch: a split row's dK/dV cast in the main
# kernel by the row's last item to finish, so the epilogue casts only dQ) against main (base), on
# the last ~400 s of the session's device budget: M5 of kvfin (every element against v1); the
# backward in both modes on recent16 (3 calls per median, one round each); ncu per-launch
# durations of the delta preprocess and the epilogue on kvfin (32 rows), for #12's pre/post share;
# then kvfin's correctness jobs concurrently for 150 s: the bitwise deterministic sweep (2 shards),
# suite2, edge layouts 0..11, racecheck/memcheck.
# Carried: .gpu-bundle (var.tar.xz with var/{base,kvfin}).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
(cd .gpu-bundle/var/kvfin && timeout 40 ./m5 3 > "$OUT/r/m5-kvfin.log" 2>&1; echo "m5 kvfin rc=$?"); grep -E "^[0-9a-z]|M5" "$OUT/r/m5-kvfin.log" | grep -v "^case" | cut -c1-150
VAR_NAMES="base kvfin" VAR_ROUNDS=1 VAR_STAGES=backward,backward_det VAR_PATTERN=recent16 VAR_ITERS=3 VAR_LIMIT=45 VAR_M5=0 \
  timeout 100 bash scripts/device/variants-bench.sh
(cd .gpu-bundle/var/kvfin && timeout 45 ncu --clock-control none -k regex:"preprocess|epilogue" --metrics gpu__time_duration.sum \
   ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 --stages backward --warmup 0 --iters 1 \
   > "$OUT/r/ncu-kvfin.log" 2>&1; echo "ncu rc=$?"); grep -cE "gpu__time_duration" "$OUT/r/ncu-kvfin.log"
L=150; cd .gpu-bundle/var/kvfin
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
  echo "== $(basename $f)"; grep -E "test result|FAILED|panicked|ERROR SUMMARY|RACECHECK|rc=|edge group" "$f" | tail -4; done
cd "$OUT" && tar czf r.tgz r && rm -rf r; ls -la "$OUT"
