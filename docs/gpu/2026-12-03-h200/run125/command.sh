#!/usr/bin/env bash
# Run 125 (session 26): where the validation's ~8.9 us go, by diagnostic builds timed beside main
# a207398 (timed only; their words are wrong): q1 (docs/next/diag-q1.patch: one level of per-query
# loads instead of query_fragment -> the fragment's cu_seqlens -> cu_seqlens_k[first]), nf (no
# fragment loads), nt (no fragment or top-k loads) and em (the cooperative launch with no work).
# 434/r0's prepare and forward, recent16, 30 calls per median, four rounds in alternating order.
# Built here: bash scripts/build-variants.sh main=- q1=docs/next/diag-q1.patch nf=docs/next/diag-nf.patch \
#   nt=docs/next/diag-nt.patch em=docs/next/diag-em.patch. Carried: .gpu-bundle.
set -u
bash scripts/device/unpack-variants.sh
ROW_NAMES="main q1 nf nt em" ROW_STAGES=prepare,forward ROW_PATTERN=recent16 timeout 200 bash scripts/device/row-ab.sh
(cd "$OUT" && tar czf g.tgz g && rm -rf g)
