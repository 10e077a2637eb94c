# Run 62 (session 13): attention_matches on edge groups 22..33 (over its 290 s bound again in
# run 61 with five jobs sharing the GPU) in three shards, alone, same bundle as run 61.
# From the repository root; carried: .gpu-bundle.
mkdir -p $OUT/j; cd .gpu-bundle; for s in 22..26 26..30 30..33; do (MSA_GPU_RESULTS=$OUT/j MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS=$s timeout 270 ./gpu-suite attention_matches --nocapture > $OUT/j/edge${s%..*}.log 2>&1; echo "edge $s rc=$?" >> $OUT/j/edge${s%..*}.log) & done; wait; for f in $OUT/j/*.log; do echo "== $f"; grep -E "test result|FAILED|panicked|rc=" $f | tail -4; done; cd $OUT && tar czf j2.tgz j && rm -rf j
