# Run 84 (session 17): qwarp (docs/next/fwd-qwarp.patch: Q loaded by warp 2 of the producer,
# apart from the K/V loader) against main f36175e (base): M2 of qwarp (every element against v1);
# the forward on recent16 and random, one round, 3 calls per median; then, only if qwarp's
# recent16 aggregate is not below base's, its correctness jobs (the 33 edge layouts on the sm_90a
# set, racecheck/memcheck) through final-check.sh.
# Carried: .gpu-bundle (var.tar.xz with var/{base,qwarp}, qwarp with its m2).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
(cd .gpu-bundle/var/qwarp && timeout 60 ./m2 3 > "$OUT/r/m2-qwarp.log" 2>&1; echo "m2 qwarp rc=$?"); grep -E "M2|PASS|FAIL" "$OUT/r/m2-qwarp.log" | tail -3
VAR_NAMES="base qwarp" VAR_ROUNDS=1 VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_ITERS=3 VAR_LIMIT=60 VAR_M5=0 \
  timeout 150 bash scripts/device/variants-bench.sh | tee "$OUT/r/ab.log"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
a=$(tar xzOf "$OUT/var.tgz" var/bench-base-1.log | awk '/recent16 +forward/ {print $5}'); b=$(tar xzOf "$OUT/var.tgz" var/bench-qwarp-1.log | awk '/recent16 +forward/ {print $5}')
echo "recent16 forward: base $a, qwarp $b"
if awk -v a="$a" -v b="$b" 'BEGIN { exit !(b >= a * 0.998) }'; then
  FINAL_SUITE=.gpu-bundle/var/qwarp FINAL_SKIP_TIMING=1 FINAL_LIMIT=200 FINAL_JOBS="edge sanitize" bash scripts/device/final-check.sh
fi
ls -la "$OUT"
