#!/usr/bin/env bash
# Run 108 (session 23): fwd-start (the first tile's Q load at entry; fragment_coord one dependent
# load shorter, for every kernel family) and fwd-cheaplast (the two-builder kernel sets aside up to
# kDeferWaves x gridDim first-block tiles and claims them last), alone and together (both), and
# both with kDeferWaves 1 and 4 (w1, w4). base = main 80f6014. 434/r0's forward (recent16,
# random), 30 calls per median, four rounds in alternating order (row-ab.sh). The fastest of
# both/w1/w4 on recent16 (SEL) then gets M2 and the final check's correctness jobs with its own
# gpu-suite, msa and wheel; the 32 rows forward and backward follow in run 109.
# Built here: bash scripts/build-variants.sh base=- start=docs/next/fwd-start.patch \
#   cheap=docs/next/fwd-cheaplast.patch both=docs/next/fwd-start.patch+docs/next/fwd-cheaplast.patch \
#   w1=<both's two>+docs/next/fwd-defer-w1.patch w4=<both's two>+docs/next/fwd-defer-w4.patch;
#   M2 as var/{both,w1,w4}/m2; wheels (cargo xtask wheel in ../wt-NAME) in target/wheels (both),
#   target/wheels-w1, target/wheels-w4. Carried: .gpu-bundle (without main's msa and gpu-suite,
#   for the 64 MiB: base's are the same build), target/wheels*.
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/base/msa .gpu-bundle/var/base/gpu-suite .gpu-bundle/
ROW_NAMES="base start cheap both w1 w4" timeout 240 bash scripts/device/row-ab.sh
SEL=$(python3 - "$OUT/g" <<'PY'
import re, statistics, sys
g = sys.argv[1]; dead = open(f"{g}/dead").read().split()
def mean(v):
    xs = []
    for r in range(1, 5):
        try: t = [l for l in open(f"{g}/{v}-{r}.log") if re.match(r"^  forward +[0-9.]", l)]
        except FileNotFoundError: continue
        if t: xs.append(float(t[0].split()[4]))
    return statistics.mean(xs) if xs else 0.0
base = mean("base"); best = max((v for v in ("both", "w1", "w4") if v not in dead), key=mean, default="")
print(best if best and mean(best) >= 1.003 * base else "")
PY
)
echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
[ -n "$SEL" ] || exit 0
mkdir -p "$OUT/m"
(cd .gpu-bundle/var/$SEL && timeout 60 ./m2 3 > "$OUT/m/m2-$SEL.log" 2>&1; echo "m2 $SEL rc=$?"); grep -E "M2" "$OUT/m/m2-$SEL.log" | tail -2
if [ "$SEL" != both ]; then rm -f target/wheels/*.whl; cp target/wheels-$SEL/*.whl target/wheels/; fi
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/$SEL FINAL_LIMIT=${RUN108_LIMIT:-290} FINAL_REAL=27..29 \
  FINAL_JOBS="suite1 suite2 edge sanitize torch real" bash scripts/device/final-check.sh
ls -la "$OUT"
