#!/usr/bin/env bash
# Run 113 (session 23): what one index load per claim costs the two-builder kernel (idx,
# docs/next/fwd-idx.patch, a diagnostic: each counter claim adds a volatile load of
# cu_seqlens_q[c < 0], i.e. 0, dependent on the claim), the price of the next form (an order
# array the counter walks); rel as run 112. base = main 7aaadf4 (kernels as 80f6014). 434/r0's
# forward, four rounds in alternating order. Built here: bash scripts/build-variants.sh base=- \
#   idx=docs/next/fwd-idx.patch rel=docs/next/fwd-cheaplast.patch+docs/next/fwd-cheap-one.patch+docs/next/fwd-cheap-rel.patch.
# Carried: .gpu-bundle.
ROW_NAMES="base idx rel" timeout 150 bash scripts/device/row-ab.sh
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
