#!/usr/bin/env bash
# Run 131 (session 26, review): run 130 timed 434/r0's prepare at 9.28 us on main ccdb3a3, whose
# bench clones the selection on the device after the spacer (run 127-128's form uploads it, then
# overwrites it by a device copy: 7.82-8.35 us). main (the clone form) against upload
# (docs/next/bench-upload.patch: run 127's form back), 434/r0's prepare and forward, recent16, 30
# calls per median, four rounds in alternating order.
# Built here: bash scripts/build-variants.sh main=- clone=docs/next/bench-upload.patch, var/clone
# renamed var/upload. Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh
ROW_NAMES="main upload" ROW_STAGES=prepare,forward ROW_PATTERN=recent16 timeout 100 bash scripts/device/row-ab.sh
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
