#!/usr/bin/env bash
# session 8, one call: M4 with the u64 reduce-add; the backward variants against main ("base"):
# "B" = P^T computed while dP^T is in flight (branch bwd-pdp), "AB" = B + the dQ staging
# double-buffered without the "staging free" barrier (branch bwd-db; the bundle's own msa and
# gpu-suite, and target/wheels), backward and deterministic, two rounds in reverse order; then
# AB's correctness concurrently: attention_matches on the sm_90a set (three shards), the
# bitwise-repeat / empty / graph tests, racecheck and memcheck, suite1, msa-torch with the example
# training step, and the real-case sweep (sampled, cases 27..48, three shards).
set -uo pipefail
R="$PWD"; T0=$SECONDS; B="$R/.gpu-bundle"
timeout 60 .microbench/m4_bulk_reduce > "$OUT/m4.log" 2>&1; echo "m4 rc=$?"; cat "$OUT/m4.log"
mkdir -p "$B/var/AB" && cp "$B/msa" "$B/var/AB/msa"  # carried once
for wt in wt-bwdB wt-bwd; do mkdir -p /work/$wt/crates/msa-workloads && ln -sfn "$R/data" /work/$wt/data; done
VAR_NAMES="base B AB" VAR_STAGES=backward,backward_det VAR_M5=0 VAR_LIMIT=80 \
  bash scripts/device/variants-bench.sh
echo "bench done at $((SECONDS - T0)) s"
F="$OUT/t"; mkdir -p "$F"
left=$((585 - (SECONDS - T0)))
job() { local n="$1"; shift; mkdir -p "$F/$n"; ( cd "$B" && MSA_GPU_RESULTS="$F/$n" timeout "$left" "$@" > "$F/$n/log" 2>&1; echo "rc=$?" >> "$F/$n/log" ) & }
for s in 0..11 11..22 22..33; do
  job "edge${s%..*}" env MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS="$s" ./gpu-suite attention_matches --nocapture
done
job det ./gpu-suite --test-threads=1 attention::deterministic attention::empty graph:: --nocapture
job sanitize bash -c "compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3; compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3"
job suite1 ./gpu-suite --test-threads=1 prepare:: task_build:: reference:: indexer:: kl:: pre_post::
job torch bash -c "cd $R && MSA_TORCH_SITE=/tmp/site-t MSA_TORCH_PROFILE=0 bash crates/msa-torch/tests/run_gpu.sh -k 'not overhead'; for r in c151r7 c434r2; do PYTHONPATH=/tmp/site-t python3 crates/msa-torch/examples/train_step.py --rank \$r; echo \"train_step \$r rc=\$?\"; done"
for s in 27..34 34..41 41..48; do
  job "real${s%..*}" env MSA_REAL_FULL=0 MSA_REAL_CASES="$s" ./gpu-suite real_cases --test-threads=1 --nocapture
done
wait
for d in "$F"/*/; do
  n="$(basename "$d")"
  echo "=== $n: $(tail -n 1 "$d/log")"
  grep -E "^test .*(ok|FAILED)$|test result|^PASS|^FAIL|passed|failed|SUMMARY|real_cases\] case|train_step|rc=" "$d/log" | tail -6
done
echo "all done at $((SECONDS - T0)) s"
(cd "$OUT" && tar czf t.tgz t && rm -rf t)
