#!/usr/bin/env bash
# session 8, the last call (~230 s of device time left): attention_matches shards 11..22 and
# 22..33 on the sm_90a set for branch bwd-final (run 47's AB in the default mode, SASS-identical;
# the deterministic kernel SASS-identical to main's). Run 47 finished shard 0..11 on AB; these two
# timed out there under eleven concurrent jobs, with no failure reported.
set -uo pipefail
T0=$SECONDS; F="$OUT/t"; mkdir -p "$F"; cd .gpu-bundle || exit 1
for s in 11..22 22..33; do
  ( env MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS="$s" timeout 215 ./gpu-suite attention_matches --nocapture > "$F/edge${s%..*}.log" 2>&1
    echo "rc=$?" >> "$F/edge${s%..*}.log" ) &
done
wait
for j in edge11 edge22; do echo "== $j: $(tail -n 1 "$F/$j.log")"; grep -E "test result|panicked" "$F/$j.log" | tail -2; done
echo "done at $((SECONDS - T0)) s"
