#!/usr/bin/env bash
# Run 122 (session 25): main 7e86344 (the softmax forms, run 121's hq) against hq3
# (docs/next/fwd-halfsm-q3.patch: a fourth form, 64 < n_visible <= 96, the full form then masking
# only chunks 12-15) on 434/r0's forward, four rounds in alternating order. Then, on the build kept
# (hq3 if it reaches 1.005x main, else main), #11's evidence in one call: the development benchmark
# (recent16, all stages), cuDNN and the dense varlen peer, FlexAttention with MSA's exact semantics
# on all 32 rows, spread / random / b0p99 / indexer with v1's forward beside it; msa-torch on its
# wheel with train_step.py; for hq3 also M2, suite2, the 33 edge layouts, racecheck/memcheck and
# real cases 27-29.
# Built here: bash scripts/build-variants.sh main=- hq3=docs/next/fwd-halfsm-q3.patch; M2 as
# var/hq3/m2; `cargo xtask wheel` in each worktree: main's in target/wheels, hq3's in
# target/wheels-hq3. Carried: .gpu-bundle, target/wheels, target/wheels-hq3.
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
ROW_NAMES="main hq3" ROW_PICK="hq3" ROW_MIN=1.005 timeout 90 bash scripts/device/row-ab.sh
SEL=$(cat "$OUT/g/pick" 2>/dev/null); echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
JOBS="torch"
if [ -n "$SEL" ]; then
  mkdir -p "$OUT/m"
  (cd .gpu-bundle/var/$SEL && timeout 60 ./m2 3 > "$OUT/m/m2-$SEL.log" 2>&1; echo "m2 $SEL rc=$?"); grep -E "M2" "$OUT/m/m2-$SEL.log" | tail -2
  rm -f target/wheels/*.whl && cp target/wheels-$SEL/*.whl target/wheels/
  JOBS="suite2 edge sanitize real torch"
fi
V=${SEL:-main}
FINAL_BENCH=.gpu-bundle/var/$V FINAL_SUITE=.gpu-bundle/var/$V FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_REAL=27..29 \
  FINAL_FLEX_EXACT=-1 FINAL_PATTERNS=spread,random,b0p99,indexer FINAL_PATTERN_STAGES=forward,forward_sm80 \
  FINAL_LIMIT=${RUN122_LIMIT:-480} FINAL_JOBS="$JOBS" bash scripts/device/final-check.sh
ls -la "$OUT"
