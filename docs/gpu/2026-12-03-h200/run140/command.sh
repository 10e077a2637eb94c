#!/usr/bin/env bash
# Run 140 (session 28): the store items, third form (docs/next/bwd-store.patch: gates per item
# from the bands of its first and last query, computed by the producer; store items lead their
# add items by 2 (head, band) segments, the first 11 segments' lead the list), and the same with
# a lead of 4 (l4: + docs/next/bwd-store-l4.patch), against main b2150ca. M5 on each; the backward
# on all 32 development rows (recent16, both modes, 5 calls per median) in two rounds of reversed
# order; then the faster store build on random and b0p99.
# Built here: bash scripts/build-variants.sh main=- store=docs/next/bwd-store.patch \
#   l4=docs/next/bwd-store.patch+docs/next/bwd-store-l4.patch. Carried: .gpu-bundle.
set -u; R="$PWD"
bash scripts/device/unpack-variants.sh
S="$OUT/s"; mkdir -p "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for v in main store l4; do
  (cd .gpu-bundle/var/$v && timeout 90 ./m5 3 > "$S/m5-$v.log" 2>&1; echo "m5 $v rc=$?")
  grep -E "differ|MISMATCH|M5 correctness|^[a-z0-9_x]+ +[0-9]+ " "$S/m5-$v.log"
done
bench() {  # build pattern stages tag
  (cd .gpu-bundle/var/$1 && timeout 150 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern "$2" \
    --stages "$3" --warmup 1 --iters 5 --json "$S/$1-$4.jsonl" > "$S/$1-$4.log" 2>&1; echo "$1 $4 rc=$?")
  sed -n '/^summary/,/^prepare as/p' "$S/$1-$4.log" | grep -E "^  [a-z0-9]+ +(backward)"
}
for v in main store l4; do bench $v recent16 backward,backward_det r1; done
for v in l4 store main; do bench $v recent16 backward,backward_det r2; done
best=$(python3 - "$S" <<'PY'
import json, sys
s = sys.argv[1]
def agg(v):
    t = 0.0
    for r in (1, 2):
        for l in open(f"{s}/{v}-r{r}.log"):
            p = l.split()
            if len(p) == 5 and p[0] == "recent16" and p[1] == "backward":
                t += float(p[4])
    return t
print(max(("store", "l4"), key=agg))
PY
)
echo "best: $best"
bench "$best" random,b0p99 backward,backward_det p1
bench main random,b0p99 backward,backward_det p1
tar czf "$OUT/s.tgz" -C "$OUT" s
