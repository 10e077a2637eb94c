#!/usr/bin/env bash
# Run 133 (session 27): run 132's traces put the whole setup difference in the gap between the
# setup's last operation (a copy-engine copy in every setup) and the validation kernel (3.0 us
# when the host is paced, 4.5 when it is ms ahead); the kernels take the same time. Here setups
# whose last operation is a compute kernel, as in a training step (docs/next/prep-setup-diag.patch,
# amended): indexer-last = clone, then the indexer forward; spacer-indexer-last = spacer first;
# kernel-last = spacer, clone, a one-word fill kernel; upload and clone as controls. 434/r0,
# recent16, prepare and forward, 30 calls per median, four rounds in alternating order, then each
# setup once under scripts/device/cupti_trace.c; then every development row, recent16 and spread,
# prepare and forward (5 calls per median) under spacer-indexer-last and kernel-last.
# Built here: bash scripts/build-variants.sh diag=docs/next/prep-setup-diag.patch;
# bash scripts/device/build-cupti-trace.sh .gpu-bundle/libcupti_trace.so. Carried: .gpu-bundle.
set -u; R="$PWD"
bash scripts/device/unpack-variants.sh
G="$OUT/g"; mkdir -p "$G"
setups="upload clone indexer-last spacer-indexer-last kernel-last"
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
        print(f"{s:>20} prepare {' '.join(f'{x:.2f}' for x in p)} mean {statistics.mean(p):.2f} us, "
              f"{100 * statistics.mean(p) / statistics.mean(f):.2f}% of the forward ({statistics.mean(f):.1f} us)")
PY
CU="$(python3 -c 'import site; print(site.getsitepackages()[0])')/nvidia/cu13/lib"
for s in $setups; do
  (cd .gpu-bundle/var/diag && LD_LIBRARY_PATH="$CU" CUDA_INJECTION64_PATH="$PWD/../../libcupti_trace.so" \
     CUPTI_TRACE_OUT="$OUT/trace-$s.csv" MSA_BENCH_PREPARE_SETUP=$s timeout 60 ./msa bench --cases 434:0 \
     --pattern recent16 --stages prepare --warmup 2 --iters 30 > "$G/trace-$s.log" 2>&1) || echo "trace $s failed"
done
for s in spacer-indexer-last kernel-last; do
  (cd .gpu-bundle/var/diag && MSA_BENCH_PREPARE_SETUP=$s timeout 150 ./msa bench --suite "$R/data/cases/dev_bench.json" \
    --pattern recent16,spread --stages prepare,forward --warmup 1 --iters 5 --json "$G/rows-$s.jsonl" \
    > "$G/rows-$s.log" 2>&1; echo "rows $s rc=$?")
  grep -E "as % of" "$G/rows-$s.log"
done
(cd "$OUT" && tar czf g.tgz g && rm -rf g && gzip trace-*.csv)
