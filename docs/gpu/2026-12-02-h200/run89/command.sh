# Run 89 (session 18): first, for the next design, ncu's full set with SASS-level sampling of the
# sm_90a forward on 938/r6 random (run 88's worst row for a second builder) for qwarp (= main) and
# badapt, one launch each at unmodified clocks; then the final check of main 0a9e786 (qwarp
# merged): suite1, suite2, the 33 edge layouts on the sm_90a set, racecheck/memcheck, msa-torch
# and the real-case sweep (cases 27-39), concurrently.
# Carried: .gpu-bundle (main's, and var.tar.xz with var/{qwarp,badapt}), target/wheels.
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/p"
for v in qwarp badapt; do
  (cd .gpu-bundle/var/$v && timeout 60 ncu --clock-control none --set full --import-source no -k regex:"forward" -c 1 \
     -o "$OUT/p/fwd-$v" ./msa bench --cases 938:6 --pattern random --stages forward --warmup 0 --iters 1 > "$OUT/p/ncu-$v.log" 2>&1; echo "ncu $v rc=$?")
  ncu --import "$OUT/p/fwd-$v.ncu-rep" --page details > "$OUT/p/details-$v.txt" 2>&1
  ncu --import "$OUT/p/fwd-$v.ncu-rep" --page source --print-source sass --csv > "$OUT/p/sass-$v.csv" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Issue Slots|Achieved Occupancy" "$OUT/p/details-$v.txt" | head -5
  rm -f "$OUT/p/fwd-$v.ncu-rep"
done
(cd "$OUT" && tar czf p.tgz p && rm -rf p)
FINAL_SKIP_TIMING=1 FINAL_LIMIT=360 FINAL_REAL=27..39 FINAL_JOBS="suite1 suite2 edge sanitize torch real" \
  bash scripts/device/final-check.sh
ls -la "$OUT"
