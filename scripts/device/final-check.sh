#!/usr/bin/env bash
# One device call for a whole merge: timings first on a quiet GPU (the development benchmark,
# its PyTorch peers, msa-torch's host overhead, prepare's and the run orders' kernels under
# ncu), then the correctness jobs concurrently, each bounded by the time left.
#   FINAL_JOBS="suite1 suite2 edge sanitize torch real" bash scripts/device/final-check.sh
#   (repo root; .gpu-bundle and target/wheels carried)
# Jobs: suite1 (prepare, task build, reference, indexer, KL, pre/post), suite2 (graphs,
# deterministic), detrows (the deterministic backward bitwise-repeated on all 32 development rows,
# recent16 and random, two shards), edge (attention_matches on the sm_90a set, in three shards), sanitize
# (racecheck, memcheck), cp (msa run --cp on one GPU), torch (the msa-torch suite and the example
# training step on two real ranks), real (the real-case sweep, sampled, cases FINAL_REAL in three
# shards). FINAL_SKIP_TIMING=1 skips the timings, FINAL_OVERHEAD=0 the host-overhead one,
# FINAL_NCU=0 the ncu one; FINAL_PATTERNS=random,b0p99,indexer also times those patterns
# (forward, v1's forward beside it, both backward modes, 3 iterations; FINAL_PATTERN_STAGES
# replaces the list, FINAL_PATTERN_LIMIT the 240 s bound) on the quiet GPU. FINAL_JOBS=" " runs
# no correctness job; FINAL_SOLO="suite1" runs those jobs one at a time on the quiet GPU before
# the concurrent ones (suite1's task-build sweep does not finish among ten jobs);
# FINAL_SUITE=.gpu-bundle/var/NAME runs them with that variant's gpu-suite
# and msa (variants-bench.sh's layout; the torch job tests target/wheels against that msa), FINAL_BENCH=.gpu-bundle/var/NAME
# times that variant's msa (the peers stay main's bundle's). FINAL_FLEX_EXACT=N
# adds FlexAttention with MSA's exact semantics on the first N benchmark rows (-1: all 32), each
# with its ratio to msa bench's time and their weighted aggregates (scripts/bench_peers.py).
# The timings run under scripts/device/clocks.sh (SM clock, power, temperature every 100 ms).
# Logs under $OUT/<job>/, packed into $OUT/final.tgz (few files come back).
set -uo pipefail
R="$PWD"; b="$R/.gpu-bundle"; m="$R/${FINAL_BENCH:-.gpu-bundle}"; suite="$R/${FINAL_SUITE:-.gpu-bundle}"; end=$((SECONDS + ${FINAL_LIMIT:-340}))
bash scripts/device/unpack-variants.sh || exit 1
mkdir -p "$OUT/f"; F="$OUT/f"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
if [ -z "${FINAL_SKIP_TIMING:-}" ]; then
echo "=== bench (dev suite)"
(cd "$m" && bash "$R/scripts/device/clocks.sh" "$F/clocks-bench.csv" timeout 120 ./msa bench --suite "$R/data/cases/dev_bench.json" \
   --pattern recent16 --stages prepare,forward,backward,backward_det --warmup 1 --iters 5 --json "$F/bench.jsonl" \
   > "$F/bench.log" 2>&1; echo "rc=$?")
sed -n '/^summary/,$p' "$F/bench.log"; grep -E "prepare as %" "$F/bench.log"
if [ -n "${FINAL_PATTERNS:-}" ]; then
echo "=== bench (dev suite, $FINAL_PATTERNS)"
(cd "$m" && bash "$R/scripts/device/clocks.sh" "$F/clocks-patterns.csv" timeout "${FINAL_PATTERN_LIMIT:-240}" ./msa bench \
   --suite "$R/data/cases/dev_bench.json" --pattern "$FINAL_PATTERNS" \
   --stages "${FINAL_PATTERN_STAGES:-forward,forward_sm80,backward,backward_det}" --warmup 1 --iters 3 --json "$F/patterns.jsonl" > "$F/patterns.log" 2>&1; echo "rc=$?")
sed -n '/^summary/,/^prepare as/p' "$F/patterns.log" | grep -E "^  [a-z0-9]+ +(forward|backward)"; grep -h "^clocks:" "$F/patterns.log"
fi
echo "=== peers"
fx="${FINAL_FLEX_EXACT:-0}"; fl=$((60 + (fx < 0 ? 32 : fx) * 8))
(cd "$b" && timeout "$fl" python3 bench_peers.py "$F/peers.jsonl" --layouts "$F/bench.jsonl" --iters 10 \
   --flex-exact "$fx" > "$F/peers.log" 2>&1; echo "rc=$?"); grep -E "sdpa-cudnn|flex|varlen" "$F/peers.log" | tail -n 60
if [ "${FINAL_OVERHEAD:-1}" = 1 ]; then
echo "=== torch host overhead"
MSA_TORCH_SITE=/tmp/site-o timeout 90 bash crates/msa-torch/tests/run_gpu.sh -k overhead > "$F/overhead.log" 2>&1; echo "rc=$?"
grep -E "ms/call|passed|failed" "$F/overhead.log" | tail -8
fi
if [ "${FINAL_NCU:-1}" = 1 ]; then
echo "=== ncu prepare and run orders, 151:7"
(cd "$m" && timeout 40 ncu --clock-control none \
   -k regex:"prepare_kernel|backward_items_kernel" \
   --metrics gpu__time_duration.sum,launch__grid_size ./msa bench --cases 151:7 --pattern recent16 \
   --stages prepare,forward,backward --warmup 0 --iters 1 > "$F/ncu.log" 2>&1; echo "rc=$?"); grep -E "_kernel|gpu__time" "$F/ncu.log" | head -24
fi
fi
job() { local n="$1"; shift; mkdir -p "$F/$n"; ( cd "$suite" && MSA_GPU_RESULTS="$F/$n" timeout "$L" "$@" > "$F/$n/log" 2>&1; echo "rc=$?" >> "$F/$n/log" ) & }
real="${FINAL_REAL:-27..48}"; ra="${real%..*}"; rb="${real#*..}"; r1=$((ra + (rb - ra) / 3)); r2=$((ra + 2 * (rb - ra) / 3))
jobs="${FINAL_JOBS:-suite1 suite2 detrows edge sanitize torch real}"
start() { local n="$1"; case "$n" in
  suite1) job suite1 ./gpu-suite --test-threads=1 prepare:: task_build:: attention::empty reference:: indexer:: kl:: pre_post:: ;;
  suite2) job suite2 ./gpu-suite --test-threads=1 graph:: attention::deterministic \
            --skip deterministic_backward_is_bitwise_on_every_bench_row ;;
  detrows) for s in 0..16 16..32; do
          job "detrows${s%..*}" env MSA_DET_ROWS="$s" ./gpu-suite deterministic_backward_is_bitwise_on_every_bench_row --nocapture
        done ;;
  edge) for s in 0..11 11..22 22..33; do
          job "edge${s%..*}" env MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS="$s" ./gpu-suite attention_matches --nocapture
        done ;;
  sanitize) job sanitize bash -c "compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3; compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3" ;;
  cp) job cp bash "$R/scripts/gpu-cp.sh" ./msa "$F/cp/out" ;;
  torch) job torch bash -c "cd $R && MSA_BUNDLE=$suite MSA_TORCH_SITE=/tmp/site-t MSA_TORCH_PROFILE=0 bash crates/msa-torch/tests/run_gpu.sh -k 'not overhead'; for r in c151r7 c434r2; do PYTHONPATH=/tmp/site-t python3 crates/msa-torch/examples/train_step.py --rank \$r; echo \"train_step \$r rc=\$?\"; done" ;;
  real) for s in "$ra..$r1" "$r1..$r2" "$r2..$rb"; do
          job "real${s%..*}" env MSA_REAL_FULL=0 MSA_REAL_CASES="$s" ./gpu-suite real_cases --test-threads=1 --nocapture
        done ;;
  *) echo "unknown job $n" ;;
esac; }
for n in ${FINAL_SOLO:-}; do L=$((end - SECONDS)); echo "=== $n alone, $L s"; start "$n"; wait; done
L=$((end - SECONDS)); echo "=== concurrent jobs, $L s"
for n in $jobs; do start "$n"; done
wait
for d in "$F"/*/; do
  [ -d "$d" ] || continue  # FINAL_JOBS=" ": no job ran
  n="$(basename "$d")"
  echo "=== $n: $(tail -n 1 "$d/log")"
  grep -E "^test .*(ok|FAILED)$|test result|^PASS|^FAIL|passed|failed|SUMMARY|real_cases\] case|train_step|rc=" "$d/log" | tail -12
  rows="$(grep -c '^\[determinism_bench_rows\]' "$d/log")"; [ "$rows" -gt 0 ] && echo "rows checked: $rows"
done
cd "$OUT" && tar czf final.tgz f && rm -rf f
