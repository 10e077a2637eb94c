#!/usr/bin/env bash
# Unpacks the variants scripts/build-variants.sh packed (.gpu-bundle/var.tar.xz) into
# .gpu-bundle/var/ and links their build paths to this checkout's data/; once per machine.
set -euo pipefail
if [ -f .gpu-bundle/var.tar.xz ] && [ ! -d .gpu-bundle/var ]; then
    tar xJf .gpu-bundle/var.tar.xz -C .gpu-bundle
    bash .gpu-bundle/var/links.sh
fi
