#!/usr/bin/env bash
# Run 127 (session 26): the prepare stage's setup. The spacer (a 512 MiB memset before each timed
# call) evicts L2, so the validation has read a selection from DRAM; in a training step the
# indexer writes the selection just before it. warm (docs/next/bench-warm.patch: the setup copies
# the selection again on the device after the spacer) and wpdl (warm + docs/next/prep-pdl.patch)
# against main a207398: 434/r0's prepare and forward, recent16, 30 calls per median, four rounds
# in alternating order; then every development row's prepare and forward, recent16 and spread, on
# main and on warm (5 calls per median), so the share is known on every row both ways.
# Built here: bash scripts/build-variants.sh main=- warm=docs/next/bench-warm.patch \
#   wpdl=docs/next/bench-warm.patch+docs/next/prep-pdl.patch. Carried: .gpu-bundle.
set -u; R="$PWD"
bash scripts/device/unpack-variants.sh
ROW_NAMES="main warm wpdl" ROW_STAGES=prepare,forward ROW_PATTERN=recent16 timeout 150 bash scripts/device/row-ab.sh
A="$OUT/a"; mkdir -p "$A"
for v in main warm; do
  (cd .gpu-bundle/var/$v && timeout 150 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16,spread \
    --stages prepare,forward --warmup 1 --iters 5 --json "$A/$v-1.jsonl" > "$A/$v-1.log" 2>&1; echo "$v rc=$?")
done
python3 - "$A" <<'PY'
import json, statistics, sys
a = sys.argv[1]
def rows(v):
    out = {}
    for r in (1,):
        for l in open(f"{a}/{v}-{r}.jsonl"):
            d = json.loads(l)
            if d.get("record") != "case":
                continue
            st = {s["stage"]: s["median_ms"] for s in d["stages"]}
            out.setdefault(d.get("case", d.get("name")), []).append((st["prepare"] * 1e3, st["forward"] * 1e3))
    return out
m, w = rows("main"), rows("warm")
worst = {"main": 0, "warm": 0}
for k in m:
    pm = statistics.mean(x for x, _ in m[k]); fm = statistics.mean(y for _, y in m[k])
    pw = statistics.mean(x for x, _ in w[k]); fw = statistics.mean(y for _, y in w[k])
    worst["main"] = max(worst["main"], pm / fm); worst["warm"] = max(worst["warm"], pw / fw)
    print(f"{k:>12} prepare main {pm:6.2f} us ({100 * pm / fm:4.2f}%)  warm {pw:6.2f} us ({100 * pw / fw:4.2f}%)")
print(f"largest share: main {100 * worst['main']:.2f}%, warm {100 * worst['warm']:.2f}%")
PY
for v in main warm; do echo "== $v"; sed -n "/^summary/,\$p" "$A/$v-1.log" | head -24; done
(cd "$OUT" && tar czf g.tgz g a && rm -rf g a)
