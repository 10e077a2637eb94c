#!/usr/bin/env bash
# Run 124 (session 26): the validation's reduction as a programmatic dependent (docs/next/prep-pdl.patch:
# a plain validate_kernel writing its slots, then a one-CTA validate_reduce_kernel launched with
# launch_smem_dependent; no cooperative launch, no grid barrier) and the one-call P conversion
# (docs/next/fwd-top.patch) against main a207398: 434/r0's prepare and forward, recent16, 30 calls
# per median, four rounds in alternating order (run 123: main's prepare 8.99 us, 4.93% of the forward).
# Then, in parallel: suite2 on the kept prepare build (pdl if its prepare is 0.3 us under main's,
# else main; its graph captures the validation and compares its words with prepare's, 56f5651, not
# yet run on a GPU); for pdl also the prepare tests and racecheck/memcheck; for top, if its forward
# reaches 1.003x main's, M2 and the 33 edge layouts (both modes, three shards).
# Built here: bash scripts/build-variants.sh main=- pdl=docs/next/prep-pdl.patch top=docs/next/fwd-top.patch;
# M2 as var/top/m2. Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh && cp -n .gpu-bundle/var/main/msa .gpu-bundle/var/main/gpu-suite .gpu-bundle/
ROW_NAMES="main pdl top" ROW_PICK="pdl" ROW_PICK_BY=prepare ROW_STAGES=prepare,forward ROW_PATTERN=recent16 \
  timeout 120 bash scripts/device/row-ab.sh
SEL=$(cat "$OUT/g/pick" 2>/dev/null); echo "SEL=$SEL"
TOP=$(python3 - "$OUT/g" <<'PY'
import json, statistics, sys
def fwd(v):
    out = []
    for r in range(1, 9):
        try:
            out += [s["median_ms"] for l in open(f"{sys.argv[1]}/{v}-{r}.jsonl") for d in [json.loads(l)]
                    if d.get("record") == "case" for s in d["stages"] if s["stage"] == "forward"]
        except FileNotFoundError:
            pass
    return statistics.mean(out)
r = fwd("main") / fwd("top")
print("top" if r >= 1.003 else "", file=sys.stdout); print(f"top forward x main {r:.4f}", file=sys.stderr)
PY
); echo "TOP=$TOP"
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
V=${SEL:-main}; S="$OUT/s"; mkdir -p "$S"
job() { local n="$1" v="$2"; shift 2; mkdir -p "$S/$n"; (cd .gpu-bundle/var/$v && MSA_GPU_RESULTS="$S/$n" timeout 280 "$@" > "$S/$n/log" 2>&1; echo "rc=$?" >> "$S/$n/log") & }
job suite2 $V ./gpu-suite --test-threads=1 graph:: attention::deterministic --skip deterministic_backward_is_bitwise_on_every_bench_row
[ -n "$SEL" ] && job prepare $SEL ./gpu-suite --test-threads=1 prepare::
[ -n "$SEL" ] && job sanitize $SEL bash -c "compute-sanitizer --tool racecheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3; compute-sanitizer --tool memcheck --error-exitcode 7 ./gpu-suite attention::sanitizer_small --exact 2>&1 | tail -3"
if [ -n "$TOP" ]; then
  job m2 top ./m2 3
  for s in 0..11 11..22 22..33; do job "edge${s%..*}" top env MSA_KERNEL_SETS=sm90 MSA_EDGE_GROUPS="$s" ./gpu-suite attention_matches --nocapture; done
fi
wait
for d in "$S"/*/; do echo "=== $(basename "$d"): $(tail -n 1 "$d/log")"; grep -E "test result|FAILED|panicked|SUMMARY|M2" "$d/log" | tail -4; done
(cd "$OUT" && tar czf s.tgz s && rm -rf s)
ls -la "$OUT"
