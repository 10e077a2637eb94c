#!/usr/bin/env bash
# Run 97 (session 20): where 434/r0's forward spends its time with two builders (ncu's full set
# with SASS sampling of forward_kernel<2>, one launch, unmodified clocks; 151/r15's one-builder
# kernel beside it), then the checks the merged two-builder dispatch (2a3f152) had not had:
# the 33 edge layouts on the sm_90a set, racecheck/memcheck, the real-case sweep (27-36).
# Carried: .gpu-bundle (main fabf2bc's `cargo xtask gpu-bundle`).
R=$PWD; mkdir -p "$OUT/p"
for c in 434:0 151:15; do n=${c/:/r}
  (cd .gpu-bundle && timeout 120 ncu --clock-control none --set full --import-source no -k regex:"forward_kernel" -c 1 \
     -o "$OUT/p/fwd$n" ./msa bench --cases "$c" --pattern recent16 --stages forward --warmup 0 --iters 1 > "$OUT/p/ncu$n.log" 2>&1; echo "ncu $c rc=$?")
  ncu --import "$OUT/p/fwd$n.ncu-rep" --page details > "$OUT/p/details$n.txt" 2>&1
  ncu --import "$OUT/p/fwd$n.ncu-rep" --page source --print-source sass --csv > "$OUT/p/sass$n.csv" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots|Registers Per|Achieved Occupancy" "$OUT/p/details$n.txt" | head -8
  rm -f "$OUT/p/fwd$n.ncu-rep"
done
(cd "$OUT" && tar czf p.tgz p && rm -rf p)
FINAL_SKIP_TIMING=1 FINAL_LIMIT=330 FINAL_REAL=27..36 FINAL_JOBS="edge sanitize real" bash scripts/device/final-check.sh
ls -la "$OUT"
