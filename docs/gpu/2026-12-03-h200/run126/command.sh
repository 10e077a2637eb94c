#!/usr/bin/env bash
# Run 126 (session 26): the validation a thread per query over its 4 heads' rows (run 125 put the
# top-k loads at ~1.8 us and the work and reduction after the loads at ~3 us of main's 8.95;
# docs/next/prep-q4.patch: one fragment lookup, 16 vector loads in flight, one int4 of
# split_counts, T / 256 CTAs under the same cooperative launch), its 128-thread form (q4s) and its
# reduction as a programmatic dependent (q4p), against main a207398: 434/r0's prepare and forward,
# recent16, 30 calls per median, four rounds in alternating order. The fastest prepare if 0.3 us
# under main's: the prepare tests, suite2, the 33 edge layouts, real cases 27-29 and
# racecheck/memcheck with its gpu-suite (else suite2 alone on main).
# Built here: bash scripts/build-variants.sh main=- q4=docs/next/prep-q4.patch \
#   q4s=docs/next/prep-q4.patch+docs/next/prep-q4s.patch q4p=docs/next/prep-q4.patch+docs/next/prep-q4p.patch
# Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
ROW_NAMES="main q4 q4s q4p" ROW_PICK="q4 q4s q4p" ROW_PICK_BY=prepare ROW_STAGES=prepare,forward ROW_PATTERN=recent16 \
  timeout 150 bash scripts/device/row-ab.sh
SEL=$(cat "$OUT/g/pick" 2>/dev/null); echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
[ -n "$SEL" ] || exit 0
FINAL_SKIP_TIMING=1 FINAL_SUITE=.gpu-bundle/var/$SEL FINAL_LIMIT=300 FINAL_REAL=27..30 \
  FINAL_JOBS="suite2 edge sanitize real" bash scripts/device/final-check.sh &
S="$OUT/p"; mkdir -p "$S"
(cd .gpu-bundle/var/$SEL && MSA_GPU_RESULTS="$S" timeout 300 ./gpu-suite --test-threads=1 prepare:: > "$S/log" 2>&1; echo "rc=$?" >> "$S/log")
echo "=== prepare: $(tail -n 1 "$S/log")"; grep -E "test result|FAILED|panicked" "$S/log" | tail -4
wait
(cd "$OUT" && tar czf p.tgz p && rm -rf p)
ls -la "$OUT"
