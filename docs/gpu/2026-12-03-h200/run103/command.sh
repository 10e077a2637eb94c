#!/usr/bin/env bash
# Run 103 (session 21): msa-torch on main 80fde56 (the epilogue patches and the claim gate at 4)
# in the device time left: the bitwise tests against main's own msa and the example training step
# on c434r2 (the two-builder kernel) and c151r7. Built here: cargo xtask gpu-bundle, cargo xtask
# wheel. Carried: .gpu-bundle, target/wheels.
R=$PWD; mkdir -p "$OUT/t"
MSA_TORCH_SITE=/tmp/site-t MSA_TORCH_PROFILE=0 timeout 100 bash crates/msa-torch/tests/run_gpu.sh -k bitwise \
  > "$OUT/t/torch-bitwise.log" 2>&1; echo "torch bitwise rc=$?"
grep -E "MSA_BIN|passed|failed|PASS" "$OUT/t/torch-bitwise.log" | tail -4
for r in c434r2 c151r7; do PYTHONPATH=/tmp/site-t timeout 40 python3 crates/msa-torch/examples/train_step.py --rank $r \
  > "$OUT/t/train-$r.log" 2>&1; echo "train_step $r rc=$?"; tail -2 "$OUT/t/train-$r.log"; done
(cd "$OUT" && tar czf t.tgz t && rm -rf t)
