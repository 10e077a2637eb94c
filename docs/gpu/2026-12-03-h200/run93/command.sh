# Run 93 (session 19): where run 92's half-block form loses 7%. o1 = fwd-half.patch + o1-only.patch
# (half's builder flags and its K wait before the issue turn, full blocks only: one form);
# o2 = fwd-half.patch + o2-only.patch (half's four forms, flags forced off: always the full form).
# Forward, recent16, two rounds in reverse order (3 calls per median); then ncu's full set with
# SASS sampling of the forward on 151/r15 recent16 for base and o2, one launch each.
# Built here: bash scripts/build-variants.sh base=- o1=docs/next/fwd-half.patch+docs/next/o1-only.patch o2=docs/next/fwd-half.patch+docs/next/o2-only.patch
# Carried: .gpu-bundle (var.tar.xz with var/{base,o1,o2}).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/p"
VAR_NAMES="base o1 o2" VAR_ROUNDS=2 VAR_STAGES=forward VAR_PATTERN=recent16 VAR_ITERS=3 VAR_LIMIT=40 VAR_M5=0 \
  timeout 200 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|^clocks"
for v in base o2; do
  (cd .gpu-bundle/var/$v && timeout 60 ncu --clock-control none --set full --import-source no -k regex:"forward" -c 1 \
     -o "$OUT/p/fwd-$v" ./msa bench --cases 151:15 --pattern recent16 --stages forward --warmup 0 --iters 1 > "$OUT/p/ncu-$v.log" 2>&1; echo "ncu $v rc=$?")
  ncu --import "$OUT/p/fwd-$v.ncu-rep" --page details > "$OUT/p/details-$v.txt" 2>&1
  ncu --import "$OUT/p/fwd-$v.ncu-rep" --page source --print-source sass --csv > "$OUT/p/sass-$v.csv" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Issue Slots|Achieved Occupancy|Instruction Cache|No Instruction" "$OUT/p/details-$v.txt" | head -8
  rm -f "$OUT/p/fwd-$v.ncu-rep"
done
(cd "$OUT" && tar czf p.tgz p && rm -rf p)
ls -la "$OUT"
