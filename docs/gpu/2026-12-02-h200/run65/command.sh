# Run 65 (session 14): why fwd-inunion v2 ("fwdu") lost 8-14% on the random pattern's mid rows in
# run 64 while every other row gained: "fwdr" is fwdu claiming its items from the end of the
# natural order (the last claims then fall on the pack's first tiles instead of its last, longest
# ones). base (main), fwdu and fwdr timed on random and recent16 (forward, 3 calls per median), two
# rounds in reverse order; then fwdr's M2-free correctness spot check (empty selections, graphs).
# Carried: .gpu-bundle (main's bundle, var.tar.xz with var/{base,fwdu,fwdr}).
R=$PWD; bash scripts/device/unpack-variants.sh
VAR_NAMES="base fwdu fwdr" VAR_STAGES=forward VAR_PATTERN=random,recent16 VAR_M5=0 VAR_ITERS=3 VAR_LIMIT=55 \
  timeout 380 bash scripts/device/variants-bench.sh
(cd .gpu-bundle/var/fwdr && timeout 60 ./gpu-suite --test-threads=1 attention::empty graph:: > "$OUT/fwdr-suite.log" 2>&1; echo "rc=$?")
grep -E "test result|FAILED|panicked" "$OUT/fwdr-suite.log" | head
