#!/usr/bin/env bash
# Run 98 (session 20): the forward's epilogue made shorter (run 97: on 434/r0 the per-tile code,
# 365 instructions a warp, takes 22% of the consumers' samples). epi (docs/next/fwd-epi.patch):
# O into the staging buffer by 8 stmatrix x4 per warp instead of 32 4-byte stores and their
# swizzled addresses, 1/l by MUFU (__fdividef: no division slow path); log: LSE's log by MUFU
# (__logf, docs/next/fwd-epi-log.patch); epig: epi and the builders hand each tile's group
# and first query over in its slot (no division per tile in the consumers, docs/next/fwd-epi-g.patch);
# all: epi, g and log. M2 of epi, epig, all (every element against v1 on six layouts), the forward
# (recent16, 32 rows) of base, epi, epig, all in two rounds in reverse order, then the 33 edge
# layouts on the sm_90a set, racecheck/memcheck and suite2 with all's gpu-suite (it holds every
# change). RUN98_SKIP_FINAL=1 stops after the bench (as run 98 ran); RUN98_FINAL_LIMIT bounds the rest.
# Built here: bash scripts/build-variants.sh base=- epi=docs/next/fwd-epi.patch \
#   epig=docs/next/fwd-epi.patch+docs/next/fwd-epi-g.patch \
#   all=docs/next/fwd-epi.patch+docs/next/fwd-epi-g.patch+docs/next/fwd-epi-log.patch; M2 of each into var/NAME/m2.
# Then msa-torch (all's wheel, `cargo xtask wheel` in its worktree) and the real cases 27-36 with it.
# Carried: .gpu-bundle (main's bundle and var.tar.xz), target/wheels.
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
for v in epi epig all; do
  (cd .gpu-bundle/var/$v && timeout 60 ./m2 3 > "$OUT/r/m2-$v.log" 2>&1; echo "m2 $v rc=$?"); grep -E "M2" "$OUT/r/m2-$v.log" | tail -2
  grep -E "^[0-9a-z_]+ +[0-9]+ " "$OUT/r/m2-$v.log" | head -8
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="base epi epig all" VAR_ROUNDS=2 VAR_STAGES=forward VAR_PATTERN=recent16 VAR_ITERS=5 VAR_LIMIT=60 VAR_M5=0 \
  timeout 330 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|^clocks"
FINAL_SKIP_TIMING=1 FINAL_LIMIT=${RUN98_FINAL_LIMIT:-240} FINAL_REAL=27..36 FINAL_SUITE=.gpu-bundle/var/all FINAL_JOBS="suite2 edge sanitize torch real" bash scripts/device/final-check.sh
ls -la "$OUT"
