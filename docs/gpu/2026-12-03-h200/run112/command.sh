#!/usr/bin/env bash
# Run 112 (session 23): run 111's one-round-trip test gained nothing, so the loss is elsewhere on
# the claim path: rel (+fwd-cheap-rel.patch) makes a plain claim's count (claim[3]) relaxed and
# keeps the release (a GPU-scope fence) only after a listing. base = main 80f6014; one as run 111.
# 434/r0's forward, four rounds in alternating order. Built here: bash scripts/build-variants.sh
#   base=- one=docs/next/fwd-cheaplast.patch+docs/next/fwd-cheap-one.patch \
#   rel=docs/next/fwd-cheaplast.patch+docs/next/fwd-cheap-one.patch+docs/next/fwd-cheap-rel.patch.
# Carried: .gpu-bundle.
ROW_NAMES="base one rel" timeout 150 bash scripts/device/row-ab.sh
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
