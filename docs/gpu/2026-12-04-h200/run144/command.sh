#!/usr/bin/env bash
# Run 144 (session 29): run 143's in-kernel dQ zeroing with bulk stores (cp.async.bulk of a zeroed
# 8 KiB shared buffer, one thread of warp 1) instead of the spare warps' own stores, which share
# the load/store pipe with the consumers' shared-memory stores. gzb: group 0 zeroed before the
# launch; gzb0: every group in the kernel. M5 on each (accumulator poisoned); the backward on all
# 32 development rows (recent16, both modes, 5 calls per median), two rounds in reversed order;
# the best and main on random and b0p99; #12's pre/post share of the best (ncu); then, if the
# best beats main on recent16, the correctness jobs on its gpu-suite.
# Built here: bash scripts/build-variants.sh main=- gzb=run143/gz.patch+run144/gzb.patch
#   gzb0=run143/gz.patch+run144/gzb.patch+run144/gzb0.patch. Carried: .gpu-bundle.
set -u; R="$PWD"; D="$R/docs/gpu/2026-12-04-h200"; T0=$SECONDS
bash scripts/device/unpack-variants.sh
S="$OUT/s"; mkdir -p "$S"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
V="main gzb gzb0"
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
read -r best gain < <(python3 - "$S" <<'PY'
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
b = max(("gzb", "gzb0"), key=agg)
print(b, agg(b) / agg("main"))
PY
)
echo "best: $best ($gain x main)"
bench "$best" random,b0p99 backward,backward_det p1
bench main random,b0p99 backward,backward_det p1
timeout 40 python3 scripts/device/memset_rate.py > "$S/memset.log" 2>&1; echo "memset rc=$?"
(cd .gpu-bundle/var/$best && timeout 100 ncu --clock-control none -k regex:"preprocess|epilogue|zero_dq" \
  --metrics gpu__time_duration.sum ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16 \
  --stages backward --warmup 0 --iters 1 > "$S/ncu-$best.log" 2>&1; echo "ncu $best rc=$?")
python3 "$D/run143/share.py" "$S" "$best" | tail -3
tar czf "$OUT/s.tgz" -C "$OUT" s && rm -rf "$S"
if python3 -c "import sys; sys.exit(0 if float('$gain') >= 1.003 else 1)"; then
  FINAL_SKIP_TIMING=1 FINAL_JOBS="suite2 detrows edge sanitize" FINAL_SUITE=.gpu-bundle/var/$best \
    FINAL_LIMIT=$((570 - (SECONDS - T0))) bash scripts/device/final-check.sh 2>&1 | tail -40
fi
