# Run 80 (session 17): timings of the split prepare (prepare_forward = validation only, one
# cooperative kernel; build_tables = the whole prepare kernel where the backward starts) on a
# quiet GPU: the development benchmark on recent16 and random with the stages prepare (now the
# validation), tables, forward, backward (5 calls per median), and ncu per-launch durations of
# validate_kernel and prepare_kernel on 434/r0 and 741/r2. (Two earlier tries of a call that also
# held the correctness jobs were taken back for other work; those jobs are run 81.)
# Carried: .gpu-bundle.
R=$PWD; mkdir -p "$OUT/b"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
(cd .gpu-bundle && bash "$R/scripts/device/clocks.sh" "$OUT/b/clocks.csv" timeout 150 ./msa bench --suite "$R/data/cases/dev_bench.json" \
   --pattern recent16,random --stages prepare,tables,forward,backward --warmup 1 --iters 5 --json "$OUT/b/bench.jsonl" \
   > "$OUT/b/bench.log" 2>&1; echo "bench rc=$?")
sed -n '/^summary/,$p' "$OUT/b/bench.log"
(cd .gpu-bundle && timeout 40 ncu --clock-control none -k regex:"validate_kernel|prepare_kernel" --metrics gpu__time_duration.sum,launch__grid_size \
   ./msa bench --cases 434:0,741:2 --pattern recent16 --stages prepare,tables --warmup 0 --iters 1 > "$OUT/b/ncu.log" 2>&1; echo "ncu rc=$?")
grep -E "_kernel|gpu__time|grid_size" "$OUT/b/ncu.log" | head -24
(cd "$OUT" && tar czf b.tgz b && rm -rf b)
