#!/usr/bin/env bash
# Run 111 (session 23): run 110 found cheaplast's tile test (a chain of dependent loads on the
# claim path) costing 6% and the deferral itself gaining ~2%. one (+fwd-cheap-one.patch: the test
# in one round trip: both queries' fragments and the last query's selection loaded together) and
# one4 (one with 4 x gridDim set aside, +fwd-defer-w4.patch). base = main 80f6014. 434/r0's
# forward, four rounds in alternating order; if one or one4 reaches 1.01x base, its M2 and suite2,
# the 33 edge layouts, racecheck/memcheck and real cases 27-29 with its gpu-suite.
# Built here: bash scripts/build-variants.sh base=- cheap=docs/next/fwd-cheaplast.patch \
#   one=docs/next/fwd-cheaplast.patch+docs/next/fwd-cheap-one.patch \
#   one4=docs/next/fwd-cheaplast.patch+docs/next/fwd-cheap-one.patch+docs/next/fwd-defer-w4.patch;
#   M2 as var/{one,one4}/m2. Carried: .gpu-bundle (main's msa and gpu-suite are base's).
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/base/msa .gpu-bundle/var/base/gpu-suite .gpu-bundle/
ROW_NAMES="base cheap one one4" timeout 200 bash scripts/device/row-ab.sh
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
best = max((v for v in ("one", "one4") if v not in dead), key=mean, default="")
print(best if best and mean(best) >= 1.01 * mean("base") else "")
PY
)
echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
[ -n "$SEL" ] || exit 0
mkdir -p "$OUT/m"
(cd .gpu-bundle/var/$SEL && timeout 60 ./m2 3 > "$OUT/m/m2-$SEL.log" 2>&1; echo "m2 $SEL rc=$?"); grep -E "M2" "$OUT/m/m2-$SEL.log" | tail -2
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/$SEL FINAL_LIMIT=${RUN111_LIMIT:-280} FINAL_REAL=27..29 \
  FINAL_JOBS="suite2 edge sanitize real" bash scripts/device/final-check.sh
ls -la "$OUT"
