#!/usr/bin/env bash
# Device call 3: where prepare's time goes (ncu, per kernel) and the msa-torch failures of call 2.
set -uo pipefail
R="$PWD"; I="$R/gpu-int"
mkdir -p /work && for w in main wt-prep; do [ -e /work/$w ] || ln -s "$R" /work/$w; done
mkdir -p "$OUT/r"
for c in 151:7 434:0; do
  echo "=== ncu prepare $c"
  timeout 120 ncu --clock-control none -k regex:"select_kernel|level_kernel|offsets_kernel|scatter_kernel|layout|prepare" --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,dram__bytes.sum \
    "$I/prep/.gpu-bundle/msa" bench --cases $c --pattern recent16 --stages prepare --warmup 0 --iters 1 > "$OUT/r/ncu-$c.log" 2>&1
  echo rc=$?; grep -E "^\s+[a-z_]+.*\(|gpu__time_duration|launch__grid_size|launch__block_size|dram__bytes" "$OUT/r/ncu-$c.log" | head -80
done
echo "=== torch2 failures"
cd "$I/torch2" && MSA_BIN="$I/mainbin/msa" MSA_TORCH_SITE=/tmp/site-t3 MSA_TORCH_PROFILE=0 timeout 200 bash crates/msa-torch/tests/run_gpu.sh \
  -k "test_forward_backward_match_the_reference or test_recent16_pattern or test_real_rank" --tb=short > "$OUT/r/torch2.log" 2>&1
echo rc=$?; grep -E "^E |FAILED|passed|failed|Error|assert" "$OUT/r/torch2.log" | head -60
cd "$OUT" && tar czf r.tgz r && rm -rf r
