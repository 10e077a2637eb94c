#!/usr/bin/env bash
# Run 143 (session 29): the dQ accumulator zeroed inside the main kernel, group by group, while
# the consumers work on the groups before (the item list is group-major). gz: group 0 by
# backward_zero_dq_kernel before the launch, groups 1-3 by the producer warpgroup's three spare
# warps from the kernel's start; gz0: every group in the kernel (group 0's first reduce-adds wait);
# gzp: gz with group g's zeros paced to start once the CTA works on group g - 1. M5 on each (its
# accumulator poisoned before the checked call); the backward on all 32 development rows
# (recent16, both modes, 5 calls per median), two rounds in reversed order; the best build and main
# on random and b0p99; then #12's pre/post share on the best build (ncu per launch: delta,
# group 0's zeroing, epilogue) beside main's (ncu: delta, epilogue; the memset by CUDA events).
# Built here: bash scripts/build-variants.sh main=- gz=gz.patch gz0=gz.patch+gz0.patch
#   gzp=gz.patch+gzp.patch (the patches in docs/gpu/2026-12-04-h200/run143/). Carried: .gpu-bundle.
set -u; R="$PWD"
bash scripts/device/unpack-variants.sh
S="$OUT/s"; mkdir -p "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
V="main gz gz0 gzp"
for v in $V; do
  (cd .gpu-bundle/var/$v && timeout 60 ./m5 3 > "$S/m5-$v.log" 2>&1; echo "m5 $v rc=$?")
  grep -E "differ|MISMATCH|M5 correctness|^[a-z0-9_x]+ +[0-9]+ " "$S/m5-$v.log"
done
bench() {  # build pattern stages tag
  (cd .gpu-bundle/var/$1 && timeout 150 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern "$2" \
    --stages "$3" --warmup 1 --iters 5 --json "$S/$1-$4.jsonl" > "$S/$1-$4.log" 2>&1; echo "$1 $4 rc=$?")
  sed -n '/^summary/,/^prepare as/p' "$S/$1-$4.log" | grep -E "^  [a-z0-9]+ +(backward)"
}
for v in $V; do bench $v recent16 backward,backward_det r1; done
for v in $(echo $V | tr ' ' '\n' | tac); do bench $v recent16 backward,backward_det r2; done
best=$(python3 - "$S" <<'PY'
import sys
s = sys.argv[1]
def agg(v):
    t = 0.0
    for r in (1, 2):
        for l in open(f"{s}/{v}-r{r}.log"):
            p = l.split()
            if len(p) == 5 and p[0] == "recent16" and p[1] == "backward":
                t += float(p[4])
    return t
print(max(("gz", "gz0", "gzp"), key=agg))
PY
)
echo "best: $best"
bench "$best" random,b0p99 backward,backward_det p1
bench main random,b0p99 backward,backward_det p1
timeout 40 python3 scripts/device/memset_rate.py > "$S/memset.log" 2>&1; echo "memset rc=$?"
for v in main "$best"; do
  (cd .gpu-bundle/var/$v && timeout 100 ncu --clock-control none -k regex:"preprocess|epilogue|zero_dq" \
    --metrics gpu__time_duration.sum ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 \
    --stages backward --warmup 0 --iters 1 > "$S/ncu-$v.log" 2>&1; echo "ncu $v rc=$?")
done
python3 "$R/docs/gpu/2026-12-04-h200/run143/share.py" "$S" main "$best"
tar czf "$OUT/s.tgz" -C "$OUT" s
