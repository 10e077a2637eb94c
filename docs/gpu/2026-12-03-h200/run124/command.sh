#!/usr/bin/env bash
# Run 124 (prepared in session 25, not yet run): the validation's reduction as a programmatic
# dependent (docs/next/prep-pdl.patch: a plain validate_kernel writing its slots, then a one-CTA
# validate_reduce_kernel launched with launch_smem_dependent; no cooperative launch, no grid
# barrier) against main, 434/r0's prepare and forward, 30 calls per median, four rounds in
# alternating order (run 123: main 8.99 us, 4.93% of the forward; 9.47 us, 5.2% on run 122's
# machine). suite2 on the kept build (pdl if its prepare is 0.3 us under main's, else main): its graph
# captures the validation and compares its words with prepare's (56f5651, not yet run on a GPU);
# for pdl also the prepare tests and racecheck/memcheck with its gpu-suite.
# Built here: bash scripts/build-variants.sh main=- pdl=docs/next/prep-pdl.patch. Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
ROW_NAMES="main pdl" ROW_PICK="pdl" ROW_PICK_BY=prepare ROW_STAGES=prepare,forward ROW_PATTERN=recent16 \
  timeout 90 bash scripts/device/row-ab.sh
SEL=$(cat "$OUT/g/pick" 2>/dev/null); echo "SEL=$SEL"; (cd "$OUT" && tar czf g.tgz g && rm -rf g)
V=${SEL:-main}; S="$OUT/s"; mkdir -p "$S"
job() { local n="$1"; shift; mkdir -p "$S/$n"; (cd .gpu-bundle/var/$V && MSA_GPU_RESULTS="$S/$n" timeout 240 "$@" > "$S/$n/log" 2>&1; echo "rc=$?" >> "$S/$n/log") & }
job suite2 ./gpu-suite --test-threads=1 graph:: attention::deterministic --skip deterministic_backward_is_bitwise_on_every_bench_row
[ -n "$SEL" ] && job prepare ./gpu-suite --test-threads=1 prepare::
[ -n "$SEL" ] && job sanitize bash -c "compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3; compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3"
wait
for d in "$S"/*/; do echo "=== $(basename "$d"): $(tail -n 1 "$d/log")"; grep -E "test result|FAILED|panicked|SUMMARY" "$d/log" | tail -4; done
(cd "$OUT" && tar czf s.tgz s && rm -rf s)
ls -la "$OUT"
