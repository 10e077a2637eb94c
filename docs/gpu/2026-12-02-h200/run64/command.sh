# Run 64 (session 14): fwd-inunion v2 (docs/next/fwd-inunion.patch) against main ("base"): M2
# (every element against v1), the forward on recent16 and random (3 calls per median, two rounds
# in reverse order); then #12's pre/post share of the backward on all 32 development rows (ncu
# per-launch durations of the delta preprocess and the epilogue, cudaMemsetAsync of the fp32 dQ
# accumulator timed by events) on the quiet GPU; last, fwdu's correctness jobs concurrently:
# attention_matches on all 33 edge layouts (six shards, sm_90a set), attention::empty, graph::,
# racecheck and memcheck on sanitizer_small.
# Carried: .gpu-bundle (main's bundle = base, m2-fwdu, var.tar.xz with var/{base,fwdu}).
R=$PWD; T0=$SECONDS; left() { echo $((${1:-585} - (SECONDS - T0))); }
bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
(cd .gpu-bundle && timeout 90 ./m2-fwdu 5 > "$OUT/r/m2.log" 2>&1; echo "m2 rc=$?"); grep -vE "^\s*$" "$OUT/r/m2.log" | tail -12
VAR_NAMES="base fwdu" VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_M5=0 VAR_ITERS=3 VAR_LIMIT=55 \
  timeout 240 bash scripts/device/variants-bench.sh
echo "=== pre/post ($(left) s left)"
(cd .gpu-bundle && timeout 130 ncu --clock-control none -k regex:"preprocess|epilogue" --metrics gpu__time_duration.sum \
   ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 --stages backward --warmup 0 --iters 1 \
   > "$OUT/r/prepost.log" 2>&1; echo "ncu rc=$?"); grep -cE "gpu__time_duration" "$OUT/r/prepost.log"
timeout 40 python3 scripts/device/memset_rate.py 12288 > "$OUT/r/memset.log" 2>&1; echo "memset rc=$?"; cat "$OUT/r/memset.log"
L=$(left); echo "=== fwdu correctness, $L s"
cd .gpu-bundle/var/fwdu
for s in 0..6 6..12 12..18 18..24 24..29 29..33; do
  (MSA_GPU_RESULTS="$OUT/r" MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS=$s timeout "$L" ./gpu-suite attention_matches --nocapture \
     > "$OUT/r/edge${s%..*}.log" 2>&1; echo "edge $s rc=$?" >> "$OUT/r/edge${s%..*}.log") &
done
(timeout "$L" ./gpu-suite --test-threads=1 attention::empty graph:: > "$OUT/r/empty-graph.log" 2>&1; echo "rc=$?" >> "$OUT/r/empty-graph.log") &
(timeout "$L" bash -c "compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3; \
   compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3" \
   > "$OUT/r/sanitize.log" 2>&1; echo "rc=$?" >> "$OUT/r/sanitize.log") &
wait
for f in "$OUT"/r/edge*.log "$OUT"/r/empty-graph.log "$OUT"/r/sanitize.log; do
  echo "== $(basename $f)"; grep -E "test result|FAILED|panicked|SUMMARY|rc=" "$f" | tail -4; done
cd "$OUT" && tar czf r.tgz r && rm -rf r; ls -la "$OUT"
