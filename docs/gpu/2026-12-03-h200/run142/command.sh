#!/usr/bin/env bash
# Run 142 (session 28, the last 244 s of device time): the store form that keeps main's items
# (docs/next/bwd-store-v4.patch: each row's own prefix stores in the row's first item, the list
# reversed so a row's stores come before the items that wait for them, per-item waits on the
# rows of the blocks its add entries' queries own), and `rev` (docs/next/bwd-rev.patch: main with
# only the list reversed), against main. M5 on v4 (its dQ/dK/dV against v1; its items differ from
# M5's host rule by design), then the recent16 backward on all 32 rows, 3 calls per median, two
# rounds in reversed order.
# Built here: bash scripts/build-variants.sh main=- rev=docs/next/bwd-rev.patch \
#   v4=docs/next/bwd-store-v4.patch. Carried: .gpu-bundle.
set -u; R="$PWD"
bash scripts/device/unpack-variants.sh
S="$OUT/s"; mkdir -p "$S"
(cd .gpu-bundle/var/v4 && timeout 40 ./m5 2 > "$S/m5-v4.log" 2>&1; echo "m5 v4 rc=$?")
grep -E "store|MISMATCH|M5 correctness|^[a-z0-9_x]+ +[0-9]+ " "$S/m5-v4.log"
bench() {  # build tag
  (cd .gpu-bundle/var/$1 && timeout 40 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 \
    --stages backward --warmup 1 --iters 3 --json "$S/$1-$2.jsonl" > "$S/$1-$2.log" 2>&1; echo "$1 $2 rc=$?")
  sed -n '/^summary/,/^prepare as/p' "$S/$1-$2.log" | grep -E "^  [a-z0-9]+ +(backward)"
}
for v in main rev v4; do bench $v r1; done
for v in v4 rev main; do bench $v r2; done
tar czf "$OUT/s.tgz" -C "$OUT" s
