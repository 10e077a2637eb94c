#!/usr/bin/env bash
# Deterministic sm_90a backward (issue #12) on the GPU, from the repository root with the bundle
# of `cargo xtask gpu-bundle` carried as .gpu-bundle/ (GPU-RUN.md):
#   scripts/det-gpu-run.sh OUTDIR [full]
# 1. GPU suite: attention::deterministic (bitwise repeats of the sm_90a deterministic mode on 3
#    dev ranks x recent16/b0p99/random, against the default backward and the sm_80 pair) and
#    graph:: (captured replays equal to eager, both deterministic paths bitwise).
# 2. msa bench: backward (sm_90a default), backward_det (sm_90a deterministic), backward_det_sm80
#    (the v1 pair), then the deterministic/default ratio per case (target <= 1.10).
# 3. With `full`: attention_matches on the sm_90a kernel set (every edge layout, the deterministic
#    variant against the CPU reference; ~4-5 min).
# Every step runs under a timeout: a deadlocked kernel shows as FAIL (timeout), not a hang.
set -uo pipefail
out="${1:?usage: $0 OUTDIR [full]}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
b=.gpu-bundle
status=0
step() {
    local name="$1" limit="$2" start=$SECONDS rc
    shift 2
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    grep -E "^test |test result|panicked|FAIL" "$out/$name.log" | head -40
    if [ "$rc" -eq 0 ]; then
        echo "PASS $name ($((SECONDS - start)) s)"
    else
        echo "FAIL $name (exit $rc$([ "$rc" -eq 124 ] && echo ', timeout'), $((SECONDS - start)) s; log $out/$name.log)"
        status=1
    fi
}

"$b/msa" info 2>&1 | grep -iE "gpu|sm|kernels" | head -5
step suite 150 env MSA_GPU_RESULTS="$out" "$b/gpu-suite" --test-threads=1 attention::deterministic graph::
step bench 120 "$b/msa" bench --cases 151:7,434:0,605:13 --pattern recent16,random \
    --stages backward,backward_det,backward_det_sm80 --iters 10 --json "$out/bench.jsonl" --force
grep -E "^case|backward" "$out/bench.log"
python3 - "$out/bench.jsonl" <<'EOF'
import json, sys
worst = 0.0
print(f"{'case':32} {'default ms':>10} {'det ms':>9} {'det/def':>8} {'v1 det ms':>10}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("record") != "case":
        continue
    ms = {s["stage"]: s["median_ms"] for s in r["stages"]}
    ratio = ms["backward_det"] / ms["backward"]
    worst = max(worst, ratio)
    print(f"{r['case']:32} {ms['backward']:10.3f} {ms['backward_det']:9.3f} {ratio:8.3f} "
          f"{ms.get('backward_det_sm80', float('nan')):10.3f}")
print(f"{'PASS' if worst <= 1.10 else 'FAIL'} det cost: worst det/default {worst:.3f} (target <= 1.10)")
EOF
if [ "${2:-}" = full ]; then
    step matches 420 env MSA_GPU_RESULTS="$out" MSA_KERNEL_SETS=sm90 "$b/gpu-suite" --test-threads=1 attention_matches
fi
exit "$status"
