#!/usr/bin/env bash
# msa-rs GPU runner (copied into the bundle by `cargo xtask gpu-bundle`; works from any cwd).
#
#   run.sh OUTDIR [suite args...]
#
# Stages, each logged under OUTDIR (MSA_STAGES picks a subset, in this order):
#   info       `msa info` (what is built, what the probe sees)          -> info.txt
#   suite      the GPU suite, JSON lines via MSA_GPU_RESULTS            -> gpu-suite.log, gpu-results.jsonl
#   sanitizer  compute-sanitizer memcheck and racecheck on the small
#              case that runs every kernel                               -> sanitizer.log
#   torch      a PyTorch-written inputs file through `msa attention`
#              on cuda and on cpu, then `msa compare`                    -> torch.log
#   timings    `msa run` on real cases (times, useful TFLOP/s)           -> timings.log, timings.jsonl
#   real       the real-case sweep alone (MSA_REAL_CASES=a..b splits it;
#              MSA_REAL_TIMEOUT bounds it, default 400 s)                -> gpu-real.log
#   bench      `msa bench` (device-timed medians, useful TFLOP/s) on
#              real cases (MSA_BENCH_CASES, or the selection file
#              MSA_BENCH_SUITE) under MSA_BENCH_PATTERNS, stages
#              MSA_BENCH_STAGES, MSA_BENCH_ITERS calls, then the PyTorch
#              peers (dense FlashAttention/cuDNN, FlexAttention) in the
#              same run                                                  -> bench.log, bench.jsonl,
#                                                                           peers.log, peers.jsonl
# Suite args go to the `suite` stage (e.g. `--skip real_cases`). Exits non-zero when any stage
# failed.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ "$#" -lt 1 ]; then
    echo "usage: $0 OUTDIR [suite args...]" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
out="$(cd "$1" && pwd)"
shift
scratch="$(mktemp -d)"
status=0

stage() {
    local name="$1" start=$SECONDS rc
    shift
    echo "=== $name"
    "$@"
    rc=$?
    echo "--- $name: exit $rc, $((SECONDS - start)) s"
    [ "$rc" -eq 0 ] || status=1
}

info() { "$here/msa" info 2>&1 | tee "$out/info.txt"; }

suite() {
    MSA_GPU_RESULTS="$out" "$here/gpu-suite" --test-threads=1 "$@" 2>&1 | tee "$out/gpu-suite.log"
    return "${PIPESTATUS[0]}"
}

sanitizer() {
    local rc=0 tool
    for tool in memcheck racecheck; do
        echo "### compute-sanitizer --tool $tool" >>"$out/sanitizer.log"
        compute-sanitizer --tool "$tool" --error-exitcode 7 \
            "$here/gpu-suite" attention::sanitizer_small --exact --test-threads=1 >>"$out/sanitizer.log" 2>&1 || rc=1
        tail -n 3 "$out/sanitizer.log"
    done
    return "$rc"
}

torch_interop() {
    {
        python3 "$here/torch_inputs.py" "$scratch/in.safetensors" &&
            "$here/msa" attention --inputs "$scratch/in.safetensors" --outputs "$scratch/cuda.safetensors" --backend cuda &&
            "$here/msa" attention --inputs "$scratch/in.safetensors" --outputs "$scratch/cpu.safetensors" --backend cpu &&
            "$here/msa" compare "$scratch/cuda.safetensors" "$scratch/cpu.safetensors"
    } 2>&1 | tee "$out/torch.log"
    return "${PIPESTATUS[0]}"
}

timings() {
    "$here/msa" run --backend cuda --cases "${MSA_TIMING_CASES:-151:7,434:2,605:13,157:13}" \
        --pattern "${MSA_TIMING_PATTERN:-recent16}" --indexer --kl --check sample \
        --json "$out/timings.jsonl" --force 2>&1 | tee "$out/timings.log"
    return "${PIPESTATUS[0]}"
}

bench() {
    local rc
    local select=(--cases "${MSA_BENCH_CASES:-151:7,605:13,434:2}")
    [ -n "${MSA_BENCH_SUITE:-}" ] && select=(--suite "$MSA_BENCH_SUITE")
    "$here/msa" bench "${select[@]}" \
        --pattern "${MSA_BENCH_PATTERNS:-recent16,random,b0p99,spread}" \
        --stages "${MSA_BENCH_STAGES:-prepare,forward,backward,backward_det,indexer,selection_lse,kl}" \
        --iters "${MSA_BENCH_ITERS:-20}" --json "$out/bench.jsonl" --force 2>&1 | tee "$out/bench.log"
    rc=${PIPESTATUS[0]}
    python3 "$here/bench_peers.py" "$out/peers.jsonl" --layouts "$out/bench.jsonl" 2>&1 | tee "$out/peers.log"
    [ "$rc" -eq 0 ] && [ "${PIPESTATUS[0]}" -eq 0 ]
}

real_cases() {
    MSA_GPU_RESULTS="$out" timeout "${MSA_REAL_TIMEOUT:-400}" \
        "$here/gpu-suite" real_cases --test-threads=1 --nocapture 2>&1 | tee "$out/gpu-real.log"
    return "${PIPESTATUS[0]}"
}

for s in ${MSA_STAGES:-info suite sanitizer torch timings}; do
    case "$s" in
        info) stage info info ;;
        suite) stage suite suite "$@" ;;
        sanitizer) stage sanitizer sanitizer ;;
        torch) stage torch torch_interop ;;
        timings) stage timings timings ;;
        real) stage real real_cases ;;
        bench) stage bench bench ;;
        *) echo "run.sh: unknown stage $s" >&2; status=2 ;;
    esac
done
rm -rf "$scratch"
exit "$status"
