# Run 67 (session 14, the remaining device time): the forward kernel of base and fwdu on 750/r11
# random under ncu (duration, SM/tensor/DRAM throughput, L2 hit rate, per launch), to say where
# fwdu's mid-row loss comes from; then main's remaining correctness jobs concurrently (edge on the
# 33 layouts, detrows, racecheck/memcheck).
# Carried: .gpu-bundle (main's bundle, var.tar.xz with var/{base,fwdu,fwdr}).
R=$PWD; T0=$SECONDS; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/n"
M=gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,dram__bytes_read.sum,sm__cycles_active.avg
for v in base fwdu fwdr; do
  (cd .gpu-bundle/var/$v && timeout 45 ncu --clock-control none -k regex:"forward_kernel|tile_" --metrics $M \
     ./msa bench --cases 750:11,1148:3 --pattern random --stages forward --warmup 0 --iters 1 > "$OUT/n/$v.log" 2>&1; echo "ncu $v rc=$?")
  grep -E "forward_kernel|tile_|duration|throughput|hit_rate|bytes_read|cycles_active" "$OUT/n/$v.log" | grep -v "^==" | head -40
done
L=$((585 - (SECONDS - T0))); echo "=== main's jobs, $L s"
FINAL_SKIP_TIMING=1 FINAL_JOBS="edge detrows sanitize" FINAL_LIMIT=$L bash scripts/device/final-check.sh
cd "$OUT" && tar czf n.tgz n && rm -rf n
