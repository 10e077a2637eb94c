#!/usr/bin/env bash
# msa-rs CI on a host without a GPU (2 cores, 90 min budget): formatting, lints, the README test
# command, the bindings check, a compile-only build of every kernel for every architecture, and
# lints + a link of the `msa` feature build (build.rs compiles the kernels with nvcc), the kernel
# layer's GPU-free tests, the dependency rule of the library crate `msa`, and msa-torch: its
# extension's lints and host tests, the wheel (`cargo xtask wheel`) and the CPU pytest suite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

ci_start=$SECONDS

# A CI machine's free disk varies (seen from 287 MB to 80 GB); one run failed writing the wheel's
# release build with the disk full. Line tables keep backtraces and cut the debug and test
# builds' size several-fold; every step reports the space left, so a full disk names its step.
export CARGO_PROFILE_DEV_DEBUG=line-tables-only
export CARGO_PROFILE_TEST_DEBUG=line-tables-only
export PIP_NO_CACHE_DIR=1

disk_left() {
    df -h --output=avail . | tail -n 1 | tr -d ' '
}

step() {
    local name="$1"
    shift
    local start=$SECONDS
    printf '\n=== %s\n+ %s\n' "$name" "$*"
    "$@"
    printf -- '--- %s: %d s (total %d s; %s of disk left, target %s)\n' "$name" $((SECONDS - start)) \
        $((SECONDS - ci_start)) "$(disk_left)" "$(du -sh "${CARGO_TARGET_DIR:-target}" 2>/dev/null | cut -f1)"
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# bindgen (xtask bindings) loads libclang at run time and needs clang's builtin headers.
have_libclang() {
    [ -n "${LIBCLANG_PATH:-}" ] && return 0
    compgen -G '/usr/lib/llvm-*/lib/libclang.so' >/dev/null ||
        compgen -G '/usr/lib/*/libclang.so' >/dev/null
}

setup() {
    if ! have_libclang; then
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-dev
    fi
    for component in rustfmt clippy; do
        if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
            rustup component add "$component"
        fi
    done
    cargo --version
    rustc --version
}

# `msa` is the crate a framework links: its direct normal dependencies stay within this set, and
# nothing of the harness or the CLI reaches it, with or without the CUDA features; with `kernels`
# alone (the raw layer a framework with its own cudarc links) no cudarc at all.
library_deps() {
    local allowed=" msa-plan msa-probe msa-kernels cudarc half thiserror once_cell "
    local banned='^(clap|safetensors|serde|serde_json|rayon|msa-ref|msa-workloads|msa-harness) '
    local features dep
    for features in "" "kernels" "msa"; do
        local args=(-p msa -e normal --prefix none --format '{p}')
        [ -n "$features" ] && args+=(--features "$features")
        for dep in $(cargo tree "${args[@]}" --depth 1 | tail -n +2 | cut -d' ' -f1); do
            if [[ "$allowed" != *" $dep "* ]]; then
                echo "msa${features:+ (--features $features)} depends on $dep"
                return 1
            fi
        done
        if cargo tree "${args[@]}" | grep -E "$banned"; then
            echo "msa${features:+ (--features $features)} pulls in the crates above"
            return 1
        fi
    done
    if cargo tree -p msa -e normal --features kernels --prefix none --format '{p}' | grep -E '^cudarc '; then
        echo "msa (--features kernels) depends on cudarc"
        return 1
    fi
    echo "msa: normal dependencies within the library set"
}

step "setup (libclang, rustfmt, clippy)" setup
step "format" cargo fmt --all -- --check
step "clippy (workspace, no CUDA)" cargo clippy --workspace --all-targets -- -D warnings
step "tests (README command)" cargo test --workspace
step "probe without a driver" cargo test -p msa-probe --features cuda
step "library dependencies" library_deps
step "bindings are current" cargo xtask bindings --check
# Installs the pinned toolchain into the per-user cache on first use, then compiles every
# kernels/src/**/*.cu per architecture: a kernel that stops compiling fails here.
step "kernels compile (nvcc, every arch)" cargo xtask build-kernels
step "clippy (--features msa)" \
    cargo clippy -p msa-kernels -p msa -p msa-harness -p msa-cli -p msa-tests --features msa \
    --all-targets -- -D warnings
# Clippy does not link: build and link every msa-feature test binary (the GPU suite, the
# harness's and the msa CLI's tests, the kernel layer's), so an undefined launcher symbol fails
# here, not on the GPU host. Its build.rs run takes every kernel object from the
# content-addressed object cache (target/msa-kernels-cache) that the clippy step filled.
step "link (--features msa)" \
    cargo test -p msa-kernels -p msa -p msa-harness -p msa-cli -p msa-tests --features msa --no-run
# The kernel layer's tests need no GPU (the linked architectures, CUDA's error strings from the
# static cudart): run them, not only link them.
step "kernel-layer tests (--features msa, no GPU)" cargo test -p msa-kernels --features msa
# The facade's carve and sizes tests read the kernels' workspace sizes, so they run only here.
step "facade host tests (--features msa, no GPU)" cargo test -p msa --lib --features msa

# msa-torch (crates/msa-torch): `cargo test --workspace` above built it without features (no
# Python, no nvcc); here the PyO3 module with the kernels (clippy does not link), the host tests
# of its integer-level calls (kernels linked, no GPU needed), the wheel, and the CPU suite of
# crates/msa-torch/tests against the installed wheel in a venv with torch (from PyPI, reused from
# the per-user cache; MSA_TORCH_VENV overrides). The GPU tests skip here (no GPU): run_gpu.sh runs
# them on a GPU host.
torch_venv() {
    local venv="${MSA_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/msa-rs/torch-venv}"
    if ! "$venv/bin/python" -c 'import torch, pytest' >/dev/null 2>&1; then
        python3 -m venv "$venv" >&2
        "$venv/bin/python" -m pip install --quiet "torch==2.11.0" pytest >&2
    fi
    echo "$venv"
}

msa_torch_pytest() {
    local venv wheel
    venv="$(torch_venv)"
    wheel="$(ls -t target/wheels/msa_torch-*.whl | head -n 1)"
    "$venv/bin/python" -m pip install --quiet --no-deps --force-reinstall "$wheel"
    (cd crates/msa-torch && "$venv/bin/python" -m pytest -q -p no:cacheprovider tests)
}

# The wheel carries the kernels and needs only libc, libm, libgcc_s and libstdc++ (the static
# cudart loads libcuda.so.1 at run time): no libcudart, no libtorch, no libpython.
wheel_links() {
    local wheel dir so
    wheel="$(ls -t target/wheels/msa_torch-*.whl | head -n 1)"
    dir="$(mktemp -d)"
    python3 -m zipfile -e "$wheel" "$dir"
    so="$dir/msa_torch/_C.abi3.so"
    readelf -d "$so" | grep NEEDED
    if readelf -d "$so" | grep NEEDED | grep -vE '\[(libc|libm|libdl|libpthread|libgcc_s|libstdc\+\+|librt|ld-linux-x86-64)\.so'; then
        echo "msa_torch/_C.abi3.so needs a library outside the allowed set"
        return 1
    fi
    readelf -SW "$so" | grep -q '\.nv_fatbin' || { echo "no .nv_fatbin: kernels missing"; return 1; }
    rm -rf "$dir"
    echo "$wheel: abi3, kernels embedded, runtime dependencies within the allowed set"
}

step "clippy (msa-torch, --features extension-module)" \
    cargo clippy -p msa-torch --features extension-module --all-targets -- -D warnings
step "msa-torch host tests (--features kernels)" cargo test -p msa-torch --features kernels
# A build directory of target/ that nothing later reads, removed to free its disk (the kernel
# objects stay cached in target/msa-kernels-cache).
free_build() {
    local dir="${CARGO_TARGET_DIR:-target}/$1"
    rm -rf "$dir"
    echo "removed $dir"
}
# The wheel is a release build: nothing after this point uses the debug and test builds.
step "free the debug build" free_build debug
step "msa-torch wheel" cargo xtask wheel
step "msa-torch wheel links" wheel_links
# The venv with torch (4.6 GB) comes next; the wheel's release build is no longer needed.
step "free the release build" free_build release
step "msa-torch CPU pytest" msa_torch_pytest

# The GPU peers' exact FlexAttention block mask (scripts/bench_peers.py) against MSA's selection
# and a dense masked SDPA, on the CPU with the same venv.
bench_peers_pytest() {
    local venv
    venv="$(torch_venv)"
    "$venv/bin/python" -m pytest -q -p no:cacheprovider scripts/test_bench_peers.py
}
step "bench peers' exact FlexAttention mask (CPU pytest)" bench_peers_pytest

printf '\nCI passed in %d s\n' $((SECONDS - ci_start))
