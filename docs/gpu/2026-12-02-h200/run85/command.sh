# Run 85 (session 18): the forward's fwd-qwarp.patch and fwd-builders.patch (on top of qwarp)
# against main ac4e9c9 (base): M2 of qwarp and builders (every element against v1; a deadlock
# shows as a timeout), then the forward on recent16 and random in two rounds in reverse order
# (3 calls per median). A variant whose M2 fails is left out of the bench.
# Carried: .gpu-bundle (var.tar.xz with var/{base,qwarp,builders,indelta}, m2 in qwarp and builders).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
names="base"
for n in qwarp builders; do
  (cd .gpu-bundle/var/$n && timeout 60 ./m2 3 > "$OUT/r/m2-$n.log" 2>&1); rc=$?; echo "m2 $n rc=$rc"
  grep -E "M2|PASS|FAIL" "$OUT/r/m2-$n.log" | tail -2
  [ $rc = 0 ] && names="$names $n"
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="$names" VAR_ROUNDS=2 VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_ITERS=3 VAR_LIMIT=60 VAR_M5=0 \
  timeout 250 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|random|^clocks"
ls -la "$OUT"
