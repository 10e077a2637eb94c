# Run 69 (session 14, the last ~100 s of device time, after a first attempt that found no unpacked
# variants): attention_matches on the 33 edge layouts (sm_90a set, six shards, 75 s bound) with
# the gated build "fwdj" of run 68.
# Carried: .gpu-bundle (main's bundle, var.tar.xz with var/{base,fwdj,fwdjr}).
bash scripts/device/unpack-variants.sh && cd .gpu-bundle/var/fwdj && mkdir -p $OUT/e && for s in 0..6 6..12 12..18 18..24 24..29 29..33; do (MSA_GPU_RESULTS=$OUT/e MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS=$s timeout 75 ./gpu-suite attention_matches --nocapture > $OUT/e/edge${s%..*}.log 2>&1; echo "edge $s rc=$?" >> $OUT/e/edge${s%..*}.log) & done; wait; for f in $OUT/e/edge*.log; do grep -E "test result|FAILED|panicked|rc=" $f | tail -2; done
