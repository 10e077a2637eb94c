# Run 83 (session 17): the forward's L2 prefetches against main f36175e (base): qpf
# (docs/next/fwd-qprefetch.patch: the builder starts each tile's Q towards L2 when it hands the
# tile over) and kvpf (qpf + fwd-kvprefetch.patch: also K and V of each tile's first two union
# blocks). M2 of both (every element against v1); the forward on recent16 and random, one round,
# 3 calls per median; then qpf's correctness jobs (the 33 edge layouts on the sm_90a set,
# racecheck/memcheck) through final-check.sh.
# Carried: .gpu-bundle (var.tar.xz with var/{base,qpf,kvpf}, each with its m2).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
for v in qpf kvpf; do (cd .gpu-bundle/var/$v && timeout 60 ./m2 3 > "$OUT/r/m2-$v.log" 2>&1; echo "m2 $v rc=$?"); grep -E "M2|PASS|FAIL" "$OUT/r/m2-$v.log" | tail -3; done
VAR_NAMES="base qpf kvpf" VAR_ROUNDS=1 VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_ITERS=3 VAR_LIMIT=60 VAR_M5=0 \
  timeout 200 bash scripts/device/variants-bench.sh
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
FINAL_SUITE=.gpu-bundle/var/qpf FINAL_SKIP_TIMING=1 FINAL_LIMIT=300 FINAL_JOBS="edge sanitize" bash scripts/device/final-check.sh
ls -la "$OUT"
