# Run 73 (session 15, the last device time): why the in-kernel dQ zeroing (docs/next/bwd-dqz.patch,
# v2) slows the main kernel. M5 of main ("base"), v3a (v2 with evict-first streaming zero
# stores, __stcs) and v3b (v3a with one zeroing warp per CTA instead of three: a third of the rate).
# Carried: .gpu-bundle (main's bundle, m5-dqz3a, m5-dqz3b, var.tar.xz with var/base/m5).
bash scripts/device/unpack-variants.sh
for m in var/base/m5 m5-dqz3a m5-dqz3b; do n=$(echo $m | tr / -); (cd .gpu-bundle && timeout 60 ./$m 2 > $OUT/$n.log 2>&1; echo "$m rc=$?"; grep -E "^[0-9a-z_]+ +[0-9]|M5" $OUT/$n.log); done
