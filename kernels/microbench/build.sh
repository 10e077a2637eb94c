#!/usr/bin/env bash
# Builds the microbenchmarks (sm_90a only) into OUT (default .microbench/) with the pinned nvcc
# that `cargo xtask build-kernels` installs; each program prints its own table.
#   kernels/microbench/build.sh [OUT]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-$root/.microbench}"
tc="${MSA_TOOLCHAIN:-$HOME/.cache/msa-rs/toolchain-13.0.88}"
nvcc="${NVCC:-$tc/nvidia/cu13/bin/nvcc}"
mkdir -p "$out"
flags=(-O3 -std=c++17 --expt-relaxed-constexpr -lineinfo -gencode=arch=compute_90a,code=sm_90a
       -I "$root/kernels/include" -I "$root/kernels/src" -I "$root/kernels" -isystem "$tc/nvidia/cu13/include"
       -L "$tc/nvidia/cu13/lib" -cudart static -Xptxas=-v)
# MICROBENCH_ONLY="m5_backward_sm90 ..." builds only those.
build() {
    local name="$1"
    shift
    if [ -n "${MICROBENCH_ONLY:-}" ] && [[ " $MICROBENCH_ONLY " != *" $name "* ]]; then
        return 0
    fi
    echo "== $name"
    "$nvcc" "${flags[@]}" -o "$out/$name" "$@" 2>"$out/$name.ptxas.txt" || { cat "$out/$name.ptxas.txt"; return 1; }
    grep -E "registers|spill|stack" "$out/$name.ptxas.txt" | grep -B0 -A0 -E "Used|spill" | head -20 || true
}

build m1_tma_l2 "$here/m1_tma_l2.cu"
build m4_bulk_reduce "$here/m4_bulk_reduce.cu"
build m6_release "$here/m6_release.cu"
build m7_prepost "$here/m7_prepost.cu"
build m8_compressible "$here/m8_compressible.cu"
build m9_last_cast "$here/m9_last_cast.cu"
build m2_forward_sm90 "$here/m2_forward_sm90.cu" "$root/kernels/src/attention/forward.cu"
v1="$root/kernels/src/attention"
build m5_backward_sm90 "$here/m5_backward_sm90.cu" "$v1/forward.cu" "$v1/backward_dq.cu" "$v1/backward_dkv.cu" \
    "$v1/backward_preprocess.cu" "$v1/backward_postprocess.cu"
