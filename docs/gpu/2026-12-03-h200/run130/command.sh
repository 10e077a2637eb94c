#!/usr/bin/env bash
# Run 130 (session 26, review): main ccdb3a3 (the validation's reduction launched through
# dispatch_arch; the bench's selection cloned on the device; graph.rs's validation compare by
# tensor name). 434/r0's prepare and forward (recent16, 30 calls per median, one round), then the
# prepare tests and suite2 concurrently.
# Built here: bash scripts/build-variants.sh main=-. Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh
ROW_NAMES="main" ROW_ROUNDS=1 ROW_STAGES=prepare,forward ROW_PATTERN=recent16 timeout 60 bash scripts/device/row-ab.sh
S="$OUT/s"; mkdir -p "$S"
job() { local n="$1"; shift; mkdir -p "$S/$n"; (cd .gpu-bundle/var/main && MSA_GPU_RESULTS="$S/$n" timeout 200 "$@" > "$S/$n/log" 2>&1; echo "rc=$?" >> "$S/$n/log") & }
job prepare ./gpu-suite --test-threads=1 prepare::
job suite2 ./gpu-suite --test-threads=1 graph:: attention::deterministic --skip deterministic_backward_is_bitwise_on_every_bench_row
wait
for d in "$S"/*/; do echo "=== $(basename "$d"): $(tail -n 1 "$d/log")"; grep -E "test result|FAILED|panicked" "$d/log" | tail -3; done
(cd "$OUT" && tar czf g.tgz g s && rm -rf g s)
