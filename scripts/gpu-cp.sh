#!/usr/bin/env bash
# Context parallelism on one GPU (docs/cp.md): `msa run --cp N` on whole 196,608-token packs,
# every rank's outputs and gradients assembled and checked against the single call over the
# pack on the same GPU with the strict tolerances; stage times beside communication times.
#
#   bash scripts/gpu-cp.sh [MSA] [OUTDIR]      # MSA defaults to .gpu-bundle/msa, OUTDIR to cp-out
#
# Runs: the sequential transport on a cut pack (24,576 tokens), then on whole packs (every rank in turn on device 0, the all-gather by device
# copies, the reduce-scatter as an f32 host sum) with N = 2 and N = 16, then the NCCL transport
# with world size 1. NCCL comes from PyTorch's nvidia-nccl wheel unless MSA_NCCL_LIB names it.
# Prints `PASS name` / `FAIL name` per run; exits non-zero when any run failed.
set -uo pipefail
msa="${1:-.gpu-bundle/msa}"
out="${2:-cp-out}"
mkdir -p "$out" || exit 2
status=0

one() {
    local name="$1" start=$SECONDS rc
    shift
    echo "=== $name: msa run $*"
    "$msa" run --backend cuda --indexer --kl --tolerances strict \
        --json "$out/$name.jsonl" --force "$@" 2>&1 | tee "$out/$name.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
        echo "PASS $name ($((SECONDS - start)) s)"
    else
        echo "FAIL $name (exit $rc, $((SECONDS - start)) s)"
        status=1
    fi
}

# First the pack cut to 24,576 tokens (two ranks of 12,288 queries, the size of a CP16 rank): the
# whole-pack single call below is 16 times that, a size no other GPU run takes.
one seq2-24k --case 434 --cp 2 --pack-tokens 24576 --cp-transport sequential
one seq2 --case 434 --cp 2 --cp-transport sequential
one seq16 --case 434 --cp 16 --cp-transport sequential
one seq2-605-random --case 605 --pattern random --cp 2 --cp-transport sequential

if [ -z "${MSA_NCCL_LIB:-}" ]; then
    MSA_NCCL_LIB="$(python3 - <<'PY'
import glob, site, sys
dirs = site.getsitepackages() + [site.getusersitepackages()] + sys.path
hits = [h for d in dirs for h in sorted(glob.glob(d + "/nvidia/nccl/lib/libnccl.so*"))]
print(hits[0] if hits else "")
PY
)"
    export MSA_NCCL_LIB
fi
echo "MSA_NCCL_LIB=${MSA_NCCL_LIB:-<not found>}"
one nccl1 --case 434 --cp 1 --cp-transport nccl
exit $status
