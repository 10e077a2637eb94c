# Run 87 (session 18): the forward's second builder gated to help only where the first falls
# behind (bhelp = qwarp + fwd-builders.patch + fwd-builders-help.patch) and, for the cause of run
# 85's loss on long rows, builders with the second builder off (b1 = ... + fwd-builders-one.patch),
# against qwarp: M2 of bhelp and b1 (a deadlock shows as a timeout), then the forward on recent16
# and random in two rounds in reverse order (3 calls per median).
# Carried: .gpu-bundle (var.tar.xz with var/{qwarp,bhelp,b1}, each with its m2).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
names="qwarp"
for n in bhelp b1; do
  (cd .gpu-bundle/var/$n && timeout 60 ./m2 3 > "$OUT/r/m2-$n.log" 2>&1); rc=$?; echo "m2 $n rc=$rc"
  grep -E "M2|PASS|FAIL" "$OUT/r/m2-$n.log" | tail -2
  [ $rc = 0 ] && names="$names $n"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="$names" VAR_ROUNDS=2 VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_ITERS=3 VAR_LIMIT=60 VAR_M5=0 \
  timeout 250 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|random|^clocks"
ls -la "$OUT"
