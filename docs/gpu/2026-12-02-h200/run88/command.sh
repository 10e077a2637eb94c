# Run 88 (session 18): the forward's second builder helping only on tiles of few blocks (badapt =
# qwarp + fwd-builders.patch + fwd-builders-help.patch + fwd-builders-adapt.patch) against qwarp:
# M2 of badapt (a deadlock shows as a timeout), then the forward on recent16 and random in two
# rounds in reverse order (3 calls per median).
# Carried: .gpu-bundle (var.tar.xz with var/{qwarp,badapt}, each with its m2).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
names="qwarp"
(cd .gpu-bundle/var/badapt && timeout 60 ./m2 3 > "$OUT/r/m2-badapt.log" 2>&1); rc=$?; echo "m2 badapt rc=$rc"
grep -E "M2|PASS|FAIL" "$OUT/r/m2-badapt.log" | tail -2
[ $rc = 0 ] && names="$names badapt"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="$names" VAR_ROUNDS=2 VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_ITERS=3 VAR_LIMIT=60 VAR_M5=0 \
  timeout 200 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|random|^clocks"
ls -la "$OUT"
