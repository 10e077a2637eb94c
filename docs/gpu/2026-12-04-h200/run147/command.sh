#!/usr/bin/env bash
# Run 147 (session 30): the timings of main 33013a1 (z0 + the paced zeroing, merged from run 146).
# 1. Why final-check's bench read ~3% below the A/B benches on the same kernels (run 145: 450.0
#    against 462-465; the large rows 3-9% slower): the backward of four large rows under four
#    stage lists in separate processes (backward alone; after prepare, whose timing allocates a
#    512 MiB spacer; after forward; after both).
# 2. scripts/device/final-check.sh timings only: recent16 (prepare, forward, both backward modes)
#    with cuDNN's dense peers and FlexAttention exact on the first 8 rows; random, spread,
#    indexer (both backward modes).
# 3. ncu per launch of the delta preprocess and the epilogue on all 32 rows (#12's pre/post share,
#    computed here from this log and final-check's bench.jsonl by run147/share.py).
# Built here: bash scripts/build-variants.sh main=-; cargo xtask gpu-bundle. Carried: .gpu-bundle.
set -u; R="$PWD"; T0=$SECONDS
bash scripts/device/unpack-variants.sh
S="$OUT/s"; mkdir -p "$S"
M=.gpu-bundle/var/main
for st in backward prepare,backward forward,backward prepare,forward,backward; do
  (cd $M && timeout 40 ./msa bench --cases 1115:10,189:12,1132:1,866:13 --pattern recent16 --stages "$st" \
    --warmup 1 --iters 5 --json "$S/stages-$st.jsonl" > "$S/stages-$st.log" 2>&1; echo "stages $st rc=$? $((SECONDS - T0)) s")
  grep -E "^case.* on cuda|^  backward " "$S/stages-$st.log" | cut -c1-60
done
FINAL_BENCH=$M FINAL_PATTERNS=random,spread,indexer FINAL_PATTERN_STAGES=backward,backward_det \
  FINAL_PATTERN_LIMIT=170 FINAL_FLEX_EXACT=8 FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_JOBS=" " FINAL_LIMIT=60 \
  bash scripts/device/final-check.sh
echo "final-check done $((SECONDS - T0)) s"
(cd $M && timeout $((585 - (SECONDS - T0))) ncu --clock-control none -k regex:"preprocess|epilogue" \
  --metrics gpu__time_duration.sum ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 \
  --stages backward --warmup 0 --iters 1 > "$S/ncu.log" 2>&1; echo "ncu rc=$? $((SECONDS - T0)) s")
tar czf "$OUT/s.tgz" -C "$OUT" s && rm -rf "$S"
