#!/usr/bin/env bash
# Builds the variants that scripts/device/variants-bench.sh compares, here (no GPU needed): for
# each NAME=PATCHES argument, a worktree ../wt-NAME at HEAD with the patch files applied in order
# (`git am`; PATCHES joined by '+', or '-' for HEAD itself), its `msa` CLI and GPU suite (cargo
# xtask gpu-bundle) and M5 (kernels/microbench/build.sh), stripped, into var/NAME/ of
# .gpu-bundle/var.tar.xz (xz: four variants stay under the 64 MiB a device call carries;
# variants-bench.sh unpacks it).
# Kernel objects come from one shared cache (MSA_KERNELS_BUILD_DIR, default ../kcache), so an
# unchanged translation unit compiles once for all variants, and the variants share one cargo
# target directory (VARIANTS_TARGET_DIR, default ../variants-target), so dependencies compile once.
#   bash scripts/build-variants.sh base=- claim=docs/next/bwd-claim.patch \
#        incast=docs/next/bwd-claim.patch+docs/next/dq-incast.patch
# The binaries find data/ through the path they were built at (CARGO_MANIFEST_DIR), which does
# not exist on the GPU machine: var/links.sh (written here; variants-bench.sh runs it) makes
# those paths point at the device checkout's data/.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export MSA_KERNELS_BUILD_DIR="${MSA_KERNELS_BUILD_DIR:-$(dirname "$root")/kcache}"
target="${VARIANTS_TARGET_DIR:-$(dirname "$root")/variants-target}"
[ $# -gt 0 ] || { sed -n '2,12p' "$0"; exit 2; }
stage="$root/target/gpu-var"
rm -rf "$stage"
mkdir -p "$stage/var" .gpu-bundle
links="$stage/var/links.sh"
cat > "$links" <<'EOF'
#!/usr/bin/env bash
# Written by scripts/build-variants.sh: each variant's build path, pointed at this checkout's data/.
set -e
R="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
EOF
for arg in "$@"; do
    name="${arg%%=*}"
    patches="${arg#*=}"
    [ "$name" != "$arg" ] && [ -n "$name" ] || { echo "build-variants: expected NAME=PATCHES, got '$arg'" >&2; exit 2; }
    wt="$(dirname "$root")/wt-$name"
    echo "== $name: $wt ($patches)"
    if [ -e "$wt" ]; then
        # Only a detached worktree of an earlier run goes; one with a branch is someone's work.
        if git -C "$wt" symbolic-ref -q HEAD >/dev/null; then
            echo "build-variants: $wt has a branch checked out; move it or pick another name" >&2
            exit 2
        fi
        git worktree remove --force "$wt"
    fi
    git worktree add --detach "$wt" HEAD >/dev/null
    if [ "$patches" != "-" ]; then
        IFS='+' read -ra list <<< "$patches"
        for p in "${list[@]}"; do
            git -C "$wt" am -3 --quiet "$root/$p"
        done
    fi
    git -C "$wt" log --oneline -1
    out="$stage/var/$name"
    mkdir -p "$out"
    (cd "$wt" && CARGO_TARGET_DIR="$target" cargo xtask gpu-bundle --out "$wt/.gpu-bundle" 2>&1 | tail -n 2)
    cp "$wt/.gpu-bundle/msa" "$wt/.gpu-bundle/gpu-suite" "$out/"
    if MICROBENCH_ONLY=m5_backward_sm90 bash "$wt/kernels/microbench/build.sh" "$wt/.microbench" \
        > "$wt/.microbench.log" 2>&1; then
        cp "$wt/.microbench/m5_backward_sm90" "$out/m5"
        strip "$out/m5"
    else
        echo "build-variants: M5 did not build for $name (see $wt/.microbench.log)" >&2
    fi
    printf 'mkdir -p %q/crates/msa-workloads %q/crates/msa-harness\nln -sfn "$R/data" %q/data\n' \
        "$wt" "$wt" "$wt" >> "$links"
done
tar cJf .gpu-bundle/var.tar.xz -C "$stage" var
du -sh .gpu-bundle .gpu-bundle/var.tar.xz
echo "build-variants: var/{$(ls "$stage/var" | grep -v links.sh | paste -sd, -)} in .gpu-bundle/var.tar.xz"
