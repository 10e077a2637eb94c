#!/usr/bin/env bash
# session 10, last call (~190 s of device time left): the deterministic grid with run 54's hang
# fixed (the block-bound loop at the CTA's trip count), in two builds on top of main + prep-sort +
# bwd-launch: "combo" (rounding on the tile's tail) and "combo2" (rounding while the next tile's
# S^T is in flight). Timed on the development rows (recent16), combo2 also on random; then
# correctness on combo2 (its own gpu-suite): the deterministic backward bitwise-repeated on all 32
# rows x recent16 and random (the rows where run 54 hung), racecheck/memcheck on the sanitizer
# case (odd block key counts), the outlier-key test and a graph replay.
set -uo pipefail
R="$PWD"; T0=$SECONDS; B="$R/.gpu-bundle"; O="$OUT/r"; mkdir -p "$O"
tar xJf "$B/var.tar.xz" -C "$B"
mkdir -p /work/wt-combo/crates/msa-workloads /work/wt-combo/crates/msa-harness && ln -sfn "$R/data" /work/wt-combo/data
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
b() { (cd "$B/var/$1" && timeout "$2" ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern "$3" --stages "$4" \
        --warmup 1 --iters "$5" --json "$O/$1-$3.jsonl" > "$O/$1-$3.log" 2>&1; echo "bench $1 $3 rc=$?")
      sed -n '/^summary/,/^prepare as/p' "$O/$1-$3.log" | grep -E "^  [a-z0-9]+ +backward"; }
b combo 40 recent16 backward_det 3
b combo2 45 recent16 backward,backward_det 3
b combo2 45 random backward,backward_det 2
echo "timing done at $((SECONDS - T0)) s"
L=$((185 - (SECONDS - T0))); V="$B/var/combo2"
job() { local n="$1"; shift; mkdir -p "$O/$n"; ( cd "$V" && MSA_GPU_RESULTS="$O/$n" timeout "$L" "$@" > "$O/$n/log" 2>&1; echo "rc=$?" >> "$O/$n/log" ) & }
for s in 0..16 16..32; do
  job "detrows${s%..*}" env MSA_DET_ROWS="$s" ./gpu-suite deterministic_backward_is_bitwise_on_every_bench_row --nocapture
done
job sanitize bash -c "compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3; compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3"
job suite2 ./gpu-suite --test-threads=1 attention::deterministic_mode_is_accurate_with_outlier_keys graph::raw_calls_replay_from_a_cuda_graph_with_a_new_topk
wait
for d in "$O"/*/; do
  echo "=== $(basename "$d"): $(tail -n 1 "$d/log")"
  grep -E "^test .*(ok|FAILED)$|test result|SUMMARY|rc=" "$d/log" | tail -6
  rows="$(grep -c '^\[determinism_bench_rows\]' "$d/log")"; [ "$rows" -gt 0 ] && echo "rows checked: $rows"
done
echo "all done at $((SECONDS - T0)) s"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
