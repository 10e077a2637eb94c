#!/usr/bin/env bash
# Run 146 (session 30): b6448f3 merged gzb (group 0 zeroed by a kernel before the launch), not
# gzb0 as its notes said. z0: every group zeroed in the kernel (gzb0, the pre-launch kernel
# removed). zp3 / zp2: z0 with groups 1-3 zeroed at a bounded rate, their units spread over the
# first 3/4 (1/2) of the items handed out before each group's first item (the build records each
# group's first claim index). zpe: zp3 with the zeros stored under an L2 evict-first policy.
# M5 on each new build (accumulator poisoned; M5 also checks the group-first words against the
# host list); the backward on all 32 development rows: round 1 both modes in order, round 2 the
# default mode in reverse order (5 calls per median); the best and main on random and b0p99.
# Built here: bash scripts/build-variants.sh main=- z0=R/z0.patch zp3=R/z0.patch+R/zp3.patch
#   zp2=R/z0.patch+R/zp3.patch+R/zp2.patch zpe=R/z0.patch+R/zp3.patch+R/zpe.patch
#   (R = docs/gpu/2026-12-04-h200/run146). Carried: .gpu-bundle.
set -u; R="$PWD"; T0=$SECONDS
bash scripts/device/unpack-variants.sh
S="$OUT/s"; mkdir -p "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
V="main z0 zp3 zp2 zpe"
for v in z0 zp3 zp2 zpe; do
  (cd .gpu-bundle/var/$v && timeout 60 ./m5 3 > "$S/m5-$v.log" 2>&1; echo "m5 $v rc=$?")
  grep -E "differ|MISMATCH|M5 correctness|^[a-z0-9_x]+ +[0-9]+ " "$S/m5-$v.log"
done
bench() {  # build pattern stages tag
  (cd .gpu-bundle/var/$1 && timeout 150 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern "$2" \
    --stages "$3" --warmup 1 --iters 5 --json "$S/$1-$4.jsonl" > "$S/$1-$4.log" 2>&1; echo "$1 $4 rc=$? $((SECONDS - T0)) s")
  sed -n '/^summary/,/^prepare as/p' "$S/$1-$4.log" | grep -E "^  [a-z0-9]+ +(backward)"
}
for v in $V; do bench $v recent16 backward,backward_det r1; done
for v in $(echo $V | tr ' ' '\n' | tac); do bench $v recent16 backward r2; done
best=$(python3 - "$S" $V <<'PY'
import sys
s, vs = sys.argv[1], sys.argv[2:]
def agg(v):
    t = 0.0
    for r in (1, 2):
        for l in open(f"{s}/{v}-r{r}.log"):
            p = l.split()
            if len(p) == 5 and p[0] == "recent16" and p[1] == "backward":
                t += float(p[4])
    return t
for v in vs: print(f"{v}: {agg(v) / agg('main'):.4f}x main", file=sys.stderr)
print(max(vs[1:], key=agg))
PY
)
echo "best: $best"
if [ $((SECONDS - T0)) -lt 470 ]; then
  bench "$best" random,b0p99 backward p1
  bench main random,b0p99 backward p1
fi
tar czf "$OUT/s.tgz" -C "$OUT" s && rm -rf "$S"
