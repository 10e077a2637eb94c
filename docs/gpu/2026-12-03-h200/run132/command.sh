#!/usr/bin/env bash
# Run 132 (session 27): why the bench's prepare figure depends on its setup (run 131: 7.90 us
# with the host upload before the device copy, 9.23 with the device clone alone). One build,
# main d16baae + docs/next/prep-setup-diag.patch (MSA_BENCH_PREPARE_SETUP picks the setup:
# upload = main's; clone = spacer then clone; clone-sync = host synchronize, spacer, clone;
# indexer = the indexer forward then clone, no spacer; indexer-spacer = spacer, indexer, clone).
# 434/r0, recent16, prepare and forward, 30 calls per median, four rounds in alternating order;
# then each setup once under scripts/device/cupti_trace.c (kernel, copy, memset and driver-call
# timestamps) to see where the time inside the events goes.
# Built here: bash scripts/build-variants.sh diag=docs/next/prep-setup-diag.patch;
# bash scripts/device/build-cupti-trace.sh .gpu-bundle/libcupti_trace.so. Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh
G="$OUT/g"; mkdir -p "$G"
setups="upload clone clone-sync indexer indexer-spacer"
rev="$(echo $setups | tr ' ' '\n' | tac | tr '\n' ' ')"
bench() { (cd .gpu-bundle/var/diag && MSA_BENCH_PREPARE_SETUP=$1 timeout 40 ./msa bench --cases 434:0 \
  --pattern recent16 --stages prepare,forward --warmup 2 --iters 30 --json "$2" > "$3" 2>&1) || echo "$1 failed"; }
for round in 1 2 3 4; do
  order=$setups; [ $((round % 2)) = 0 ] && order=$rev
  for s in $order; do bench "$s" "$G/$s-$round.jsonl" "$G/$s-$round.log"; done
done
python3 - "$G" $setups <<'PY'
import json, statistics, sys
g, setups = sys.argv[1], sys.argv[2:]
for s in setups:
    p, f = [], []
    for r in range(1, 5):
        try:
            for line in open(f"{g}/{s}-{r}.jsonl"):
                d = json.loads(line)
                if d.get("record") != "case":
                    continue
                st = {x["stage"]: x["median_ms"] for x in d["stages"]}
                p.append(st["prepare"] * 1e3); f.append(st["forward"] * 1e3)
        except FileNotFoundError:
            pass
    if p:
        print(f"{s:>15} prepare {' '.join(f'{x:.2f}' for x in p)} mean {statistics.mean(p):.2f} us, "
              f"{100 * statistics.mean(p) / statistics.mean(f):.2f}% of the forward ({statistics.mean(f):.1f} us)")
PY
CU="$(python3 -c 'import site; print(site.getsitepackages()[0])')/nvidia/cu13/lib"
ls "$CU"/libcupti* || CU="$(dirname "$(find / -name libcupti.so.13 2>/dev/null | head -1)")"
for s in $setups; do
  (cd .gpu-bundle/var/diag && LD_LIBRARY_PATH="$CU" CUDA_INJECTION64_PATH="$PWD/../../libcupti_trace.so" \
     CUPTI_TRACE_OUT="$OUT/trace-$s.csv" MSA_BENCH_PREPARE_SETUP=$s timeout 60 ./msa bench --cases 434:0 \
     --pattern recent16 --stages prepare --warmup 2 --iters 30 > "$G/trace-$s.log" 2>&1) || echo "trace $s failed"
  grep -E '^  prepare' "$G/trace-$s.log"; ls -la "$OUT/trace-$s.csv"
done
(cd "$OUT" && tar czf g.tgz g && rm -rf g && gzip trace-*.csv)
