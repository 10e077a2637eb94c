# Run 86 (session 18): bwd-indelta (docs/next/bwd-indelta.patch: delta computed per tile in the
# backward's main kernel, no preprocess on the default sm_90a path) against main ac4e9c9 (base):
# M5 of both (every element against v1; indelta's main kernel now includes delta), then the
# backward on recent16 and random in two rounds in reverse order (3 calls per median); the
# deterministic mode (the same code in both) once, on base, for the det/default ratio.
# Carried: .gpu-bundle (var.tar.xz with var/{base,qwarp,builders,indelta}).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
for n in base indelta; do
  (cd .gpu-bundle/var/$n && timeout 60 ./m5 3 > "$OUT/r/m5-$n.log" 2>&1; echo "m5 $n rc=$?")
  grep -E "^[0-9a-z]|M5" "$OUT/r/m5-$n.log" | grep -v "^case" | cut -c1-110
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="base indelta" VAR_ROUNDS=2 VAR_STAGES=backward VAR_PATTERN=recent16,random VAR_ITERS=3 VAR_LIMIT=60 VAR_M5=0 \
  timeout 220 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|random|^clocks"
(cd .gpu-bundle/var/base && timeout 60 ./msa bench --suite "$R/data/cases/dev_bench.json" --pattern recent16,random \
   --stages backward_det --warmup 1 --iters 3 --json "$OUT/det-base.jsonl" > "$OUT/det-base.log" 2>&1; echo "det rc=$?")
grep -E "^  (recent16|random) +backward" "$OUT/det-base.log"
ls -la "$OUT"
