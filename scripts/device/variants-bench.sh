#!/usr/bin/env bash
# Builds compared in one device call, on a quiet GPU: for each variant directory under
# .gpu-bundle/var/ (its own `msa` and, optionally, `m5` = kernels/microbench's m5_backward_sm90),
# M5 (every element against v1, timed) and the development benchmark (recent16, 32 rows,
# medians), variant after variant; with VAR_ROUNDS=2 (the default) a second round in the reverse
# order, so that a drift of the GPU's clocks shows as a difference between the rounds.
#   VAR_NAMES="base A B" VAR_STAGES=backward,backward_det bash scripts/device/variants-bench.sh
# (VAR_M5=0 skips M5; VAR_PATTERN=recent16,spread times those patterns, VAR_ITERS the calls per
# median, 5 by default.)
# Each bench runs under scripts/device/clocks.sh (clocks and power logged beside it).
# Logs and JSON in $OUT/var.tgz (scripts/ab-compare.py OLD NEW prints per-row ratios).
# Variants packed by scripts/build-variants.sh (.gpu-bundle/var.tar.xz) are unpacked first.
set -uo pipefail
R="$PWD"; F="$OUT/var"; mkdir -p "$F"
bash scripts/device/unpack-variants.sh || exit 1
names="${VAR_NAMES:-base A B}"; stages="${VAR_STAGES:-backward,backward_det}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for v in $names; do
  [ "${VAR_M5:-1}" = 1 ] && [ -x "$R/.gpu-bundle/var/$v/m5" ] || continue
  (cd "$R/.gpu-bundle/var/$v" && timeout 120 ./m5 "${VAR_M5_ITERS:-10}" > "$F/m5-$v.log" 2>&1; echo "m5 $v rc=$?")
  grep -E "^(case|[0-9a-z])|M5" "$F/m5-$v.log" | tail -8
done
orders=("$names")
[ "${VAR_ROUNDS:-2}" = 2 ] && orders+=("$(echo $names | tr ' ' '\n' | tac | tr '\n' ' ')")
round=0
for order in "${orders[@]}"; do
  round=$((round + 1))
  for v in $order; do
    (cd "$R/.gpu-bundle/var/$v" && bash "$R/scripts/device/clocks.sh" "$F/clocks-$v-$round.csv" \
       timeout "${VAR_LIMIT:-150}" ./msa bench --suite "$R/data/cases/dev_bench.json" \
       --pattern "${VAR_PATTERN:-recent16}" --stages "$stages" --warmup 1 --iters "${VAR_ITERS:-5}" \
       --json "$F/bench-$v-$round.jsonl" \
       > "$F/bench-$v-$round.log" 2>&1; echo "bench $v round $round rc=$?")
    sed -n '/^summary/,/^prepare as/p' "$F/bench-$v-$round.log" | grep -v "^clocks:" | head -24
    grep -h "^clocks:" "$F/bench-$v-$round.log"
  done
done
(cd "$OUT" && tar czf var.tgz var && rm -rf var)
