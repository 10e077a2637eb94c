# Run 77 (session 16): prepare's phase split for N = 1..5 (run 76 could time only N = 4, 5: a
# partial run left the error word unwritten and the bench's checked setup call refused it). The
# pphase build (docs/next/prepare-phases.patch + prepare-phases-valid.patch, measurement only:
# MSA_PREPARE_STOP=N runs the first N phases of prepare_kernel, 1 zero, 2 select (the validation),
# 3 level, 4 offsets, 5 scatter, and for N < 4 writes "no fault") times the unchecked prepare on
# the 32 development rows (5 calls per median).
# Carried: .gpu-bundle (var.tar.xz with var/pphase).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/p"
for n in 1 2 3 4 5; do
  (cd .gpu-bundle/var/pphase && MSA_PREPARE_STOP=$n timeout 60 ./msa bench --suite "$R/data/cases/dev_bench.json" \
     --pattern recent16 --stages prepare --warmup 1 --iters 5 --json "$OUT/p/stop$n.jsonl" > "$OUT/p/stop$n.log" 2>&1
   echo "stop $n rc=$?"); sed -n '/^summary/,$p' "$OUT/p/stop$n.log" | grep -E "prepare" | head -3
done
(cd "$OUT" && tar czf p.tgz p && rm -rf p)
