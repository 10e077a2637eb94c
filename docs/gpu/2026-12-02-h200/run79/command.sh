# Run 79 (session 17): bwd-kvfin2 (docs/next/bwd-kvfin2.patch: run 78's split-row dK/dV finish in
# the main kernel, each item's ticket taken at the end of the consumers' next item) against main
# (base): M5 of kvfin2 (every element against v1); the backward in both modes on recent16, two
# rounds in reverse order (3 calls per median); ncu per-launch durations of the delta preprocess
# and the epilogue on kvfin2 (32 rows) for #12's pre/post share. Correctness jobs only if it wins.
# Carried: .gpu-bundle (var.tar.xz with var/{base,kvfin2}).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
(cd .gpu-bundle/var/kvfin2 && timeout 40 ./m5 3 > "$OUT/r/m5-kvfin2.log" 2>&1; echo "m5 kvfin2 rc=$?"); grep -E "^[0-9a-z]|M5" "$OUT/r/m5-kvfin2.log" | grep -v "^case" | cut -c1-150
VAR_NAMES="base kvfin2" VAR_ROUNDS=2 VAR_STAGES=backward,backward_det VAR_PATTERN=recent16 VAR_ITERS=3 VAR_LIMIT=45 VAR_M5=0 \
  timeout 220 bash scripts/device/variants-bench.sh
(cd .gpu-bundle/var/kvfin2 && timeout 45 ncu --clock-control none -k regex:"preprocess|epilogue" --metrics gpu__time_duration.sum \
   ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 --stages backward --warmup 0 --iters 1 \
   > "$OUT/r/ncu-kvfin2.log" 2>&1; echo "ncu rc=$?"); grep -cE "gpu__time_duration" "$OUT/r/ncu-kvfin2.log"
cd "$OUT" && tar czf r.tgz r && rm -rf r; ls -la "$OUT"
