#!/usr/bin/env bash
# SASS of a kernel translation unit on a machine without a GPU: compiles it for sm_90a with the
# pinned nvcc (cargo xtask build-kernels) and disassembles it with cuobjdump and nvdisasm from
# PyPI (13.2.86, the oldest on PyPI; they read 13.0's cubins), installed once into the per-user
# cache. Prints registers/spills (ptxas -v) and per-kernel counts of HGMMA, local memory
# (LDL/STL), CCTL, MEMBAR and WARPGROUP.ARRIVE; the full listing goes to OUT (default /tmp).
#   scripts/sass.sh kernels/src/attention/backward_sm90.cu [OUT]
set -euo pipefail
src="$1"; out="${2:-/tmp}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tc="${MSA_TOOLCHAIN:-$HOME/.cache/msa-rs/toolchain-13.0.88}"
tools="${XDG_CACHE_HOME:-$HOME/.cache}/msa-rs/sass-tools-13.2.86"
if [ ! -x "$tools/nvidia/cu13/bin/nvdisasm" ]; then
    python3 -m pip install --quiet --no-deps --target "$tools" nvidia-cuda-cuobjdump==13.2.86 nvidia-cuda-nvdisasm==13.2.86
    chmod +x "$tools"/nvidia/cu13/bin/*
fi
name="$(basename "$src" .cu)"
"$tc/nvidia/cu13/bin/nvcc" -O3 -std=c++17 --expt-relaxed-constexpr -lineinfo -gencode=arch=compute_90a,code=sm_90a \
    -I "$root/kernels/include" -I "$root/kernels/src" -I "$root/kernels" -cubin -Xptxas=-v -o "$out/$name.cubin" "$src" \
    2>&1 | grep -E "Compiling entry|registers|spill|C75" || true
PATH="$tools/nvidia/cu13/bin:$PATH" cuobjdump -sass "$out/$name.cubin" > "$out/$name.sass"
python3 - "$out/$name.sass" <<'PY'
import re, sys
for f in open(sys.argv[1]).read().split("Function : ")[1:]:
    name = f.split("\n", 1)[0]
    counts = {k: len(re.findall(r"\b" + k + r"\b", f)) for k in ["HGMMA", "LDL", "STL", "CCTL", "MEMBAR", "WARPGROUP.ARRIVE"]}
    print(name[:140], counts)
PY
echo "SASS: $out/$name.sass"
