#!/usr/bin/env bash
# Where the sm_90a kernels' time goes, in one device call: per-kernel durations of every launch of
# prepare, forward, backward and the deterministic backward on a long row and a short-document
# row, then Nsight Compute's full set (source counters: stall reasons per SASS instruction) of
# the backward main kernel in both modes, of the forward kernel and of prepare's kernel
# (PROF_KERNELS="... prepare") on the long row.
#   PROF_ROWS=151:15,434:0 PROF_FULL_ROW=151:15 PROF_KERNELS="bwd bwd_det fwd" bash scripts/device/profile.sh
# Output in $OUT/prof.tgz: durations-*.log, *.ncu-rep and their text exports (details, source).
set -uo pipefail
R="$PWD"; F="$OUT/prof"; mkdir -p "$F"
rows="${PROF_ROWS:-151:15,434:0}"; full="${PROF_FULL_ROW:-151:15}"
cd "$R/.gpu-bundle" || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
for r in ${rows//,/ }; do
  timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum ./msa bench --cases "$r" --pattern recent16 \
    --stages prepare,forward,backward,backward_det --warmup 0 --iters 1 > "$F/durations-${r/:/r}.log" 2>&1
  echo "durations $r rc=$?"
done
prof() {  # name, kernel regex, stage
  timeout 200 ncu --set full --import-source no -k regex:"$2" -c 1 -o "$F/$1" ./msa bench --cases "$full" \
    --pattern recent16 --stages "$3" --warmup 0 --iters 1 > "$F/$1.log" 2>&1
  echo "ncu $1 rc=$?"
  ncu -i "$F/$1.ncu-rep" --page details > "$F/$1.details.txt" 2>&1
  ncu -i "$F/$1.ncu-rep" --page source --csv --print-source sass > "$F/$1.sass.csv" 2>&1 || true
  wc -c "$F/$1.sass.csv"
}
for k in ${PROF_KERNELS:-bwd bwd_det fwd}; do case "$k" in
  bwd) prof bwd 'backward_kernel' backward ;;
  bwd_det) prof bwd_det 'backward_kernel' backward_det ;;
  fwd) prof fwd 'forward_kernel' forward ;;
  prepare) prof prepare 'prepare_kernel' prepare ;;
esac; done
(cd "$OUT" && tar czf prof.tgz prof && rm -rf prof); ls -la "$OUT"
