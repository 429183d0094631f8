#!/usr/bin/env bash
# Build and run every workbench kernel in dev/cuda (each checks itself against its CPU reference and
# prints its timings); exits non-zero if a build or a check fails.
#   bash dev/cuda/run_all.sh [arch]      (default arch: 90a, which the wgmma shapes need)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${TMPDIR:-/tmp}/pvm-dev-cuda
mkdir -p "$bin"
status=0
for src in "$here"/*.cu; do
    name=$(basename "$src" .cu)
    [ "$name" = product_kernels ] && continue  # no program: a cubin to read (README.md)
    echo "== $name"
    nvcc -std=c++17 -O3 -arch=sm_${1:-90a} -fmad=false -I"$here/../../native/include" -o "$bin/$name" "$src" || { status=1; continue; }
    "$bin/$name" || status=1
done
exit $status
