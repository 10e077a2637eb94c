# The device call that measures blate (built in session 18, not run: the session's device time ran
# out): main + fwd-builders.patch + fwd-builders-help.patch + fwd-builders-adapt.patch +
# fwd-builders-late.patch against main: M2 of blate, then the forward on recent16 and random in
# two rounds in reverse order (3 calls per median). Build first, here:
#   bash scripts/build-variants.sh base=- blate=docs/next/fwd-builders.patch+docs/next/fwd-builders-help.patch+docs/next/fwd-builders-adapt.patch+docs/next/fwd-builders-late.patch
#   then M2 of blate into target/gpu-var/var/blate/m2 (run 84's command.sh) and re-pack var.tar.xz.
# Carried: .gpu-bundle (var.tar.xz with var/{base,blate}).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
names="base"
(cd .gpu-bundle/var/blate && timeout 60 ./m2 3 > "$OUT/r/m2-blate.log" 2>&1); rc=$?; echo "m2 blate rc=$rc"
grep -E "M2|PASS|FAIL" "$OUT/r/m2-blate.log" | tail -2
[ $rc = 0 ] && names="$names blate"
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="$names" VAR_ROUNDS=2 VAR_STAGES=forward VAR_PATTERN=recent16,random VAR_ITERS=3 VAR_LIMIT=60 VAR_M5=0 \
  timeout 170 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|random|^clocks"
ls -la "$OUT"
