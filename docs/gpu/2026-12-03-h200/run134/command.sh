#!/usr/bin/env bash
# Run 134 (session 27): the prepare stage as what it adds to the forward after it (main e8aad1f:
# paired calls, prepare then forward against the forward alone, both behind the spacer with the
# selection rewritten on the device; the stage's times are the differences). Against it, pdl
# (docs/next/pdl-order.patch): order_kernel launched as a programmatic dependent (griddepcontrol.wait
# first), and the validation's reduction triggering its dependent at its start, so the forward's
# first launch overlaps the reduction. 434/r0 recent16, four rounds; then every development row,
# recent16 and spread, prepare and forward, 15 calls per median, main (and pdl if it wins by
# 0.3 us); if pdl wins, its correctness jobs (suite2 with graph capture, the 33 edge layouts,
# racecheck/memcheck, the prepare tests).
# Built here: bash scripts/build-variants.sh main=- pdl=docs/next/pdl-order.patch. Carried: .gpu-bundle.
set -u; R="$PWD"
bash scripts/device/unpack-variants.sh
ROW_NAMES="main pdl" ROW_STAGES=prepare,forward ROW_PATTERN=recent16 ROW_PICK="pdl" ROW_PICK_BY=prepare \
  timeout 120 bash scripts/device/row-ab.sh
pick="$(cat "$OUT/g/pick" 2>/dev/null)"; echo "pick: '$pick'"
G="$OUT/g"
for v in main $pick; do
  (cd .gpu-bundle/var/$v && timeout 170 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16,spread \
    --stages prepare,forward --warmup 2 --iters 15 --json "$G/rows-$v.jsonl" > "$G/rows-$v.log" 2>&1; echo "rows $v rc=$?")
  sed -n '/as % of/,/^$/p' "$G/rows-$v.log" | sort -k2 -n -r | head -6
  grep -E "^  (recent16|spread) +forward" "$G/rows-$v.log"
done
if [ "$pick" = pdl ]; then
  P="$OUT/p"; mkdir -p "$P"
  (cd .gpu-bundle/var/pdl && MSA_GPU_RESULTS="$P" timeout 250 ./gpu-suite --test-threads=1 prepare:: > "$P/log" 2>&1; echo "rc=$?" >> "$P/log") &
  FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/pdl FINAL_LIMIT=280 FINAL_JOBS="suite2 edge sanitize" \
    bash scripts/device/final-check.sh
  wait; echo "=== prepare:: $(tail -n 1 "$P/log")"; grep -E "test result|FAILED|panicked" "$P/log" | tail -4
  (cd "$OUT" && tar czf p.tgz p && rm -rf p)
fi
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
