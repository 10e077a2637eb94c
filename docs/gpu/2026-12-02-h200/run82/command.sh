# Run 82 (session 17): where 434/r0's forward spends its time (#11: 246-250 TFLOP/s, target 300),
# for the next session's design: ncu's full set with SASS-level sampling of the sm_90a forward
# kernel on 434/r0 and, for contrast, on 151/r15 (one launch each, unmodified clocks), exported
# as the details page and the SASS source page (stall reasons per instruction, CSV).
# Carried: .gpu-bundle.
R=$PWD; mkdir -p "$OUT/p"
for c in 434:0 151:15; do n=${c/:/r}
  (cd .gpu-bundle && timeout 150 ncu --clock-control none --set full --import-source no -k regex:"fwd90|forward" -c 1 \
     -o "$OUT/p/fwd$n" ./msa bench --cases "$c" --pattern recent16 --stages forward --warmup 0 --iters 1 > "$OUT/p/ncu$n.log" 2>&1; echo "ncu $c rc=$?")
  ncu --import "$OUT/p/fwd$n.ncu-rep" --page details > "$OUT/p/details$n.txt" 2>&1
  ncu --import "$OUT/p/fwd$n.ncu-rep" --page source --print-source sass --csv > "$OUT/p/sass$n.csv" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots|Registers Per|Achieved Occupancy" "$OUT/p/details$n.txt" | head -8
  wc -c "$OUT/p/sass$n.csv"
done
(cd "$OUT" && tar czf p.tgz p && rm -rf p)
