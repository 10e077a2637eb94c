#!/usr/bin/env bash
# Run 149 (session 30): the two edge shards run 148's bound stopped (attention_matches on the
# 33 edge layouts, sm_90a set, groups 11..22 and 22..33), alone on main 33013a1's gpu-suite.
# Carried: .gpu-bundle (run 148's).
bash scripts/device/unpack-variants.sh > /dev/null
cd .gpu-bundle/var/main
for s in 11..22 22..33; do
  (env MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS="$s" timeout 270 ./gpu-suite attention_matches --nocapture \
    > /tmp/edge${s%..*}.log 2>&1; echo "edge $s rc=$?" >> /tmp/edge${s%..*}.log) &
done
wait
mkdir -p "$OUT/e" && cp /tmp/edge*.log "$OUT/e/"
