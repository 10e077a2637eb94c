# Run 68 (session 14, the last device time): run 67 showed fwdu's forward on 750/r11 random with
# base's SM active cycles (2.95 M against 2.97 M) in 1.19x the duration: CTAs idle at the end, as
# its builder claims an item whenever a slot frees (up to 4 queued tiles + 2 in flight per CTA).
# "fwdj" claims only while fewer than 8 built union blocks wait for their K load; "fwdjr" is fwdj
# claiming from the end of the natural order. base, fwdj, fwdjr on random and recent16 (forward,
# 3 calls per median, one round), then both variants' attention::empty and graph:: tests.
# Carried: .gpu-bundle (main's bundle, var.tar.xz with var/{base,fwdj,fwdjr}).
VAR_NAMES="base fwdj fwdjr" VAR_ROUNDS=1 VAR_STAGES=forward VAR_PATTERN=random,recent16 VAR_M5=0 VAR_ITERS=3 \
  VAR_LIMIT=55 timeout 200 bash scripts/device/variants-bench.sh
for v in fwdj fwdjr; do
  (cd .gpu-bundle/var/$v && timeout 30 ./gpu-suite --test-threads=1 attention::empty graph:: > "$OUT/$v-suite.log" 2>&1; echo "$v rc=$?")
  grep -E "test result|FAILED|panicked" "$OUT/$v-suite.log" | head -4
done
