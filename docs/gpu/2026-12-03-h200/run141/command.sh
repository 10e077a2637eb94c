#!/usr/bin/env bash
# Run 141 (session 28): where the store form (run 140's `store`) loses ~4% of the main kernel on
# long rows. (1) `cut` (+ docs/next/bwd-store-cut.patch): the store form's items (each row's own
# prefix an item of its own) but every item adds into the zeroed accumulator, no stores, no gates:
# the recent16 backward of main, store and cut on all 32 rows, two rounds in reversed order (the
# item cut alone against the stores). (2) ncu on 151/r15 (recent16, one backward call, unmodified
# clocks) for main and store: every launch's duration, then the main kernel's DRAM bytes, L2 hit
# rate, L2 reduction and write sectors, SM and tensor-pipe activity.
# Built here: bash scripts/build-variants.sh main=- store=docs/next/bwd-store.patch \
#   cut=docs/next/bwd-store.patch+docs/next/bwd-store-cut.patch. Carried: .gpu-bundle.
set -u; R="$PWD"
bash scripts/device/unpack-variants.sh
S="$OUT/s"; mkdir -p "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
bench() {  # build tag
  (cd .gpu-bundle/var/$1 && timeout 120 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 \
    --stages backward --warmup 1 --iters 5 --json "$S/$1-$2.jsonl" > "$S/$1-$2.log" 2>&1; echo "$1 $2 rc=$?")
  sed -n '/^summary/,/^prepare as/p' "$S/$1-$2.log" | grep -E "^  [a-z0-9]+ +(backward)"
}
for v in main store cut; do bench $v r1; done
for v in cut store main; do bench $v r2; done
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_op_red.sum,lts__t_sectors_op_write.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed
for v in main store; do
  (cd .gpu-bundle/var/$v && timeout 60 ncu --clock-control none -k regex:"backward|preprocess|zero" \
     --metrics gpu__time_duration.sum ./msa bench --cases 151:15 --pattern recent16 --stages backward \
     --warmup 0 --iters 1 > "$S/dur-$v.log" 2>&1; echo "dur $v rc=$?")
  grep -E "_kernel|gpu__time" "$S/dur-$v.log" | sed 's/(CUtensorMap.*//; s/(const.*//' | head -24
  (cd .gpu-bundle/var/$v && timeout 90 ncu --clock-control none -k regex:"backward_kernel" --metrics "$M" \
     ./msa bench --cases 151:15 --pattern recent16 --stages backward --warmup 0 --iters 1 > "$S/main-$v.log" 2>&1; echo "metrics $v rc=$?")
  grep -E "dram__|lts__|sm__|gpu__" "$S/main-$v.log" | head -20
done
tar czf "$OUT/s.tgz" -C "$OUT" s
