# Run 56 (session 11): the backward's band run order (bwd-qorder) and the |dO| norm (det-dnorm)
# against main, recent16 and spread, two rounds; M5 on bwd-qorder; the qord build's pre_post and
# deterministic tests. Carried: .gpu-bundle (main's; var.tar.xz = var/{base,dnorm,qord}).
R=$PWD; B=$R/.gpu-bundle; tar xJf $B/var.tar.xz -C $B; for W in wt-dnorm wt-qord; do mkdir -p /work/$W/crates/msa-workloads /work/$W/crates/msa-harness; ln -sfn $R/data /work/$W/data; done
VAR_NAMES="base dnorm qord" VAR_STAGES=backward,backward_det VAR_PATTERN=recent16,spread VAR_ITERS=3 VAR_M5_ITERS=2 VAR_LIMIT=110 timeout 470 bash scripts/device/variants-bench.sh
cd $B/var/qord && timeout 85 ./gpu-suite --test-threads=1 pre_post:: attention::deterministic --skip deterministic_backward_is_bitwise_on_every_bench_row > $OUT/suite.log 2>&1; echo "suite rc=$?"; grep -E "^test |test result" $OUT/suite.log | tail -20
