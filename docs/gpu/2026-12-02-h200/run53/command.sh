#!/usr/bin/env bash
# session 10, one call: builds timed against main at 5bb776b ("base"; kernels of 205210a) in the
# same call, two rounds in reverse order: prep-sort (scatter's sorted top-k walk) on prepare;
# bwd-launch (dK/dV finisher + dQ cast in one launch) and det-fixed (the deterministic mode's dQ
# rounded to a per-row power-of-two grid, no dQ order) on both backward modes. ncu of
# prep-sort's prepare kernels and det-fixed's grid/order kernels on 151:7. Then correctness on
# "combo" (main + the three merged, its own gpu-suite): suite1, suite2 (graph, deterministic,
# outlier keys), detrows (the deterministic backward bitwise-repeated on all 32 development rows,
# recent16 and random), attention_matches (three shards), racecheck/memcheck.
set -uo pipefail
R="$PWD"; T0=$SECONDS; B="$R/.gpu-bundle"
tar xJf "$B/var.tar.xz" -C "$B"
for w in wt-prep wt-bwdB wt-detfix wt-combo; do
  mkdir -p /work/$w/crates/msa-workloads /work/$w/crates/msa-harness && ln -sfn "$R/data" /work/$w/data
done
VAR_NAMES="base prep-sort" VAR_STAGES=prepare VAR_M5=0 VAR_LIMIT=40 bash scripts/device/variants-bench.sh
mv "$OUT/var.tgz" "$OUT/var-prep.tgz"; echo "prepare A/B done at $((SECONDS - T0)) s"
VAR_NAMES="base bwd-launch det-fixed" VAR_STAGES=backward,backward_det VAR_M5=0 VAR_LIMIT=60 \
  bash scripts/device/variants-bench.sh
echo "backward A/B done at $((SECONDS - T0)) s"
mkdir -p "$OUT/ncu"
(cd "$B/var/prep-sort" && timeout 40 ncu --clock-control none \
   -k regex:"select_kernel|level_kernel|offsets_kernel|scatter_kernel|tile_order_kernel" \
   --metrics gpu__time_duration.sum,launch__grid_size ./msa bench --cases 151:7 --pattern recent16 \
   --stages prepare --warmup 0 --iters 1 > "$OUT/ncu/prep-sort.log" 2>&1; echo "ncu rc=$?")
grep -E "_kernel|gpu__time" "$OUT/ncu/prep-sort.log" | head -12
(cd "$B/var/det-fixed" && timeout 40 ncu --clock-control none \
   -k regex:"backward_kv_bound|backward_dq_step|backward_order|backward_items|backward_kernel|dq_fragment_cast" \
   --metrics gpu__time_duration.sum,launch__grid_size ./msa bench --cases 151:7 --pattern recent16 \
   --stages backward_det --warmup 0 --iters 1 > "$OUT/ncu/det-fixed.log" 2>&1; echo "ncu rc=$?")
grep -E "_kernel|gpu__time" "$OUT/ncu/det-fixed.log" | head -16
L=$((575 - (SECONDS - T0))); echo "correctness on combo, $L s"
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/combo FINAL_JOBS="suite1 suite2 detrows edge sanitize" \
  FINAL_LIMIT=$((L - 10)) bash scripts/device/final-check.sh
echo "all done at $((SECONDS - T0)) s"
(cd "$OUT" && tar czf ncu.tgz ncu && rm -rf ncu)
