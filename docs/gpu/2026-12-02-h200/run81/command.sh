# Run 81 (session 17): validate_kernel with one grid barrier (per-CTA fault slots reduced by CTA
# 0, instead of a zeroed word, a barrier and an atomicMax): prepare (the validation) and the
# forward on the development benchmark, recent16 (5 calls per median); then every correctness
# job of final-check.sh concurrently on this build: suite1 (prepare's sweeps, whole and split,
# the fault words, graph capture, NoTables; task build, reference, indexer, KL, pre/post), suite2
# (graphs, determinism), the 33 edge layouts and the real-case sweep through the harness (which
# now runs prepare_forward → forward → build_tables → backward/KL), racecheck/memcheck, msa-torch.
# Carried: .gpu-bundle, target/wheels.
R=$PWD; mkdir -p "$OUT/b"
(cd .gpu-bundle && bash "$R/scripts/device/clocks.sh" "$OUT/b/clocks.csv" timeout 90 ./msa bench --suite "$R/data/cases/dev_bench.json" \
   --pattern recent16 --stages prepare,forward --warmup 1 --iters 5 --json "$OUT/b/bench.jsonl" > "$OUT/b/bench.log" 2>&1; echo "bench rc=$?")
sed -n '/^summary/,$p' "$OUT/b/bench.log" | head -12
(cd "$OUT" && tar czf b.tgz b && rm -rf b)
FINAL_SKIP_TIMING=1 FINAL_LIMIT=430 FINAL_JOBS="suite1 suite2 edge sanitize torch real" bash scripts/device/final-check.sh
ls -la "$OUT"
