# Run 76 (session 16): (1) how prepare's time splits between its phases (#11's prepare share):
# the pphase build (docs/next/prepare-phases.patch, measurement only: MSA_PREPARE_STOP=N runs the
# first N of prepare_kernel's phases: 1 zero, 2 select (validation), 3 level, 4 offsets, 5 scatter)
# times the unchecked prepare on the 32 development rows for N = 1..5 (5 calls per median);
# (2) main (b641e8e) with every peer in one call: msa bench on the development suite (recent16:
# prepare, forward, backward, deterministic backward; 5 calls per median), cuDNN dense causal,
# the dense varlen peer, FlexAttention with MSA's exact semantics on all 32 rows.
# Carried: .gpu-bundle (main's bundle; var.tar.xz with var/pphase).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/p"
for n in 1 2 3 4 5; do
  (cd .gpu-bundle/var/pphase && MSA_PREPARE_STOP=$n timeout 60 ./msa bench --suite "$R/data/cases/dev_bench.json" \
     --pattern recent16 --stages prepare --warmup 1 --iters 5 --json "$OUT/p/stop$n.jsonl" > "$OUT/p/stop$n.log" 2>&1
   echo "stop $n rc=$?"); sed -n '/^summary/,$p' "$OUT/p/stop$n.log" | grep -E "prepare" | head -3
done
(cd "$OUT" && tar czf p.tgz p && rm -rf p)
FINAL_FLEX_EXACT=-1 FINAL_OVERHEAD=0 FINAL_NCU=0 FINAL_JOBS=none FINAL_LIMIT=470 bash scripts/device/final-check.sh
