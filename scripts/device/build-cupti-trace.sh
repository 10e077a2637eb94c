#!/usr/bin/env bash
# Build scripts/device/cupti_trace.c against the CUDA 13 CUPTI of the torch venv (the lent
# machines' torch has the same libcupti.so.13): bash scripts/device/build-cupti-trace.sh OUT.so
set -euo pipefail
nv=${CUPTI_NVIDIA_DIR:-$HOME/.cache/msa-rs/torch-venv/lib/python3.11/site-packages/nvidia/cu13}
# crt/ comes with the nvcc wheel that `cargo xtask build-kernels` installs.
tc=${CUPTI_TOOLCHAIN_INCLUDE:-$(ls -d "$HOME"/.cache/msa-rs/toolchain-*/nvidia/cu13/include | tail -1)}
gcc -O2 -shared -fPIC -Wall -Wextra -Wno-unused-parameter -I"$nv/include" -I"$tc" \
  "$(dirname "$0")/cupti_trace.c" -o "$1" "$nv/lib/libcupti.so.13" -Wl,-rpath,'$ORIGIN'
