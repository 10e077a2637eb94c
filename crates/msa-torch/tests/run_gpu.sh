#!/usr/bin/env bash
# The msa-torch suite on a GPU host (the lead's H200: driver 580, Python 3.12, torch with CUDA,
# pytest; no network): installs the wheel built by `cargo xtask wheel` into a private site
# directory (no dependencies, no index: torch comes from the host) and runs every test, the GPU
# ones required (MSA_TORCH_REQUIRE_GPU=1: a test that cannot reach the GPU fails, it is never
# skipped). Finishes in well under 3 minutes on an H200.
#
#   bash crates/msa-torch/tests/run_gpu.sh [WHEEL] [PYTEST ARGS...]
#
# WHEEL defaults to the newest target/wheels/msa_torch-*.whl; MSA_TORCH_SITE (default /tmp/site)
# is where it is installed. MSA_BIN (default: the bundle's msa, $MSA_BUNDLE or .gpu-bundle/ of
# this checkout, from `cargo xtask gpu-bundle`) is the Rust CLI the bitwise tests run; the run
# fails without it. After the tests, host_overhead.py prints where the host time of a
# forward and a backward goes (MSA_TORCH_PROFILE=0 skips it). Success ends with pytest's
# "N passed" line, the breakdown and "run_gpu.sh: PASS".
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
crate="$(cd "$here/.." && pwd)"
root="$(cd "$crate/../.." && pwd)"

wheel=""
if [ $# -gt 0 ] && [[ "$1" == *.whl ]]; then
    wheel="$1"
    shift
fi
if [ -z "$wheel" ]; then
    wheel="$(ls -t "$root"/target/wheels/msa_torch-*.whl 2>/dev/null | head -n 1 || true)"
fi
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
    echo "run_gpu.sh: no wheel (build one with \`cargo xtask wheel\`, or pass its path)" >&2
    exit 2
fi
site="${MSA_TORCH_SITE:-/tmp/site}"
bundle="${MSA_BUNDLE:-$root/.gpu-bundle}"
if [ -z "${MSA_BIN:-}" ] && [ -x "$bundle/msa" ]; then
    export MSA_BIN="$bundle/msa"
fi

echo "== wheel: $wheel"
rm -rf "$site"/msa_torch "$site"/msa_torch-*.dist-info
python3 -m pip install --no-deps --no-index --target "$site" "$wheel"

echo "== host"
echo "MSA_BIN=${MSA_BIN:-<unset: the bitwise tests will fail>}"
nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader || true
PYTHONPATH="$site" python3 - <<'PY'
import sys, torch, msa_torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda})")
print(f"msa_torch {msa_torch.__version__} from {msa_torch.__file__}")
print(f"built archs {msa_torch.built_archs()}; unavailable_reason: {msa_torch.unavailable_reason()}")
PY

echo "== pytest"
cd "$crate"
start=$SECONDS
MSA_TORCH_REQUIRE_GPU=1 PYTHONPATH="$site" python3 -m pytest -q -rfEsxP -p no:cacheprovider \
    --durations=8 tests "$@"
if [ "${MSA_TORCH_PROFILE:-1}" != 0 ]; then
    echo "== host overhead breakdown (tests/host_overhead.py)"
    PYTHONPATH="$site" python3 tests/host_overhead.py
fi
echo "run_gpu.sh: PASS ($((SECONDS - start)) s)"
