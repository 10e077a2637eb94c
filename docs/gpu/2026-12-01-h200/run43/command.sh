#!/usr/bin/env bash
# session 7, one call on run 42's build (.gpu-bundle): the spread pattern on the development
# benchmark (never timed there before; issues #11 and #12 name it beside recent16), and v1's
# forward beside the sm_90a forward on recent16, 3 iterations each.
set -uo pipefail
F="$OUT/s"; mkdir -p "$F"; cd .gpu-bundle || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for p in spread recent16; do
  st=prepare,forward,forward_sm80,backward,backward_det; [ "$p" = recent16 ] && st=forward,forward_sm80
  timeout 250 ./msa bench --suite ../data/cases/dev_bench.json --pattern "$p" --stages "$st" --warmup 1 --iters 3 \
    --json "$F/$p.jsonl" > "$F/$p.log" 2>&1; echo "$p rc=$?"
  sed -n '/^summary/,/^prepare as/p' "$F/$p.log" | head -12
done
(cd "$OUT" && tar czf s.tgz s && rm -rf s)
