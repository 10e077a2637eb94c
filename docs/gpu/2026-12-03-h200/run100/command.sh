#!/usr/bin/env bash
# Run 100 (session 21): (1) msa-torch's bitwise tests with all's wheel against all's own msa (run 99
# compared all's wheel with main's CLI: 6 expected failures on O's last bits, a harness fault
# fixed in final-check.sh); (2) M2 of tree (all + docs/next/fwd-tree.patch: the softmax's row
# maxima and sums as balanced trees) and nopp (all + docs/next/fwd-nopp.patch: no pingpong turns
# in forward_kernel<2>); (3) the forward on recent16, 32 rows, all / tree / nopp, two rounds in
# reverse order.
# Built here: bash scripts/build-variants.sh all=E+G+L tree=E+G+L+docs/next/fwd-tree.patch \
#   nopp=E+G+L+docs/next/fwd-nopp.patch (E, G, L: docs/next/fwd-epi.patch, fwd-epi-g.patch,
#   fwd-epi-log.patch); M2 of each into var/NAME/m2. Carried: .gpu-bundle, target/wheels (all's).
R=$PWD; bash scripts/device/unpack-variants.sh; mkdir -p "$OUT/r"
MSA_BUNDLE=$R/.gpu-bundle/var/all MSA_TORCH_SITE=/tmp/site-t MSA_TORCH_PROFILE=0 timeout 200 \
  bash crates/msa-torch/tests/run_gpu.sh -k bitwise > "$OUT/r/torch-bitwise.log" 2>&1; echo "torch bitwise rc=$?"
grep -E "MSA_BIN|passed|failed|PASS" "$OUT/r/torch-bitwise.log" | tail -6
for v in tree nopp; do
  (cd .gpu-bundle/var/$v && timeout 60 ./m2 3 > "$OUT/r/m2-$v.log" 2>&1; echo "m2 $v rc=$?"); grep -E "M2" "$OUT/r/m2-$v.log" | tail -2
  grep -E "^[0-9a-z_]+ +[0-9]+ " "$OUT/r/m2-$v.log" | head -8
done
(cd "$OUT" && tar czf r.tgz r && rm -rf r)
VAR_NAMES="all tree nopp" VAR_ROUNDS=2 VAR_STAGES=forward VAR_PATTERN=recent16 VAR_ITERS=5 VAR_LIMIT=60 VAR_M5=0 \
  timeout 240 bash scripts/device/variants-bench.sh | grep -E "rc=|recent16|^clocks"
ls -la "$OUT"
