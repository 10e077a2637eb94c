# Run 63 (session 13, the last 258 s of device time): fwd-inunion (docs/next/fwd-inunion.patch:
# the forward builds its unions in-kernel and claims items) timed alone (base: run 60's forward on
# main), then its correctness jobs concurrently: attention_matches on all 33 edge layouts (six
# shards, sm_90a set), the empty-selection test, racecheck on sanitizer_small.
# Carried: .gpu-bundle (main's bundle, var.tar.xz with var/fwdu).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
cd .gpu-bundle/var/fwdu
timeout 45 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 --stages forward --warmup 1 --iters 3 \
  --json "$OUT/r/fwd.jsonl" > "$OUT/r/fwd.log" 2>&1; echo "bench rc=$?"
sed -n '/^summary/,$p' "$OUT/r/fwd.log" | head -6
for s in 0..6 6..12 12..18 18..24 24..29 29..33; do
  (MSA_GPU_RESULTS="$OUT/r" MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS=$s timeout 105 ./gpu-suite attention_matches --nocapture \
     > "$OUT/r/edge${s%..*}.log" 2>&1; echo "edge $s rc=$?" >> "$OUT/r/edge${s%..*}.log") &
done
(timeout 105 ./gpu-suite attention::empty > "$OUT/r/empty.log" 2>&1; echo "empty rc=$?" >> "$OUT/r/empty.log") &
(timeout 105 compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact \
   > "$OUT/r/race.log" 2>&1; echo "race rc=$?" >> "$OUT/r/race.log") &
wait
for f in "$OUT"/r/*.log; do echo "== $(basename $f)"; grep -E "test result|FAILED|panicked|SUMMARY|rc=" "$f" | tail -3; done
cd "$OUT" && tar czf r.tgz r && rm -rf r
