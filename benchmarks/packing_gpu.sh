#!/usr/bin/env bash
# On a one-GPU host, from the repository root: build the native engine with CUDA, refuse to go on unless the
# build sees the GPU (an earlier packing run measured a CPU-only build), then run benchmarks/packing.py: the
# packing table (tiny and small at trials_per_gpu k = 1, 2, 4, 8) and the LARGE checkpoint run.
#   PVM_SITE=.gpuhost/site.tar.xz bash benchmarks/packing_gpu.sh [OUT_DIR]   # default OUT_DIR: $OUT or benchmarks/out
# Environment: PVM_PACK_STEPS (packing.py --steps, default tiny=40000,small=20000), PVM_LARGE_STEPS (default
# 15000), PVM_LARGE_EVERY (checkpoint interval, default 5000), PVM_SITE (Ray and MLflow for a bare host).
set -uo pipefail
OUT_DIR=${1:-${OUT:-benchmarks/out}}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
if [ -n "${PVM_SITE:-}" ]; then mkdir -p /tmp/site && tar xJf "$PVM_SITE" -C /tmp/site && export PYTHONPATH=/tmp/site; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT_DIR/gpu.txt"
start=$(date +%s)
CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${PVM_CUDA_ARCHS:-90}" PVM_DIST_CUDA=ON \
    python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT_DIR/build.log" 2>&1 \
    || { tail -30 "$OUT_DIR/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
(cd /tmp && python3 -c "
import json, sys, pvm_dist._native as n
info = n.build_info()
print(json.dumps(info))
sys.exit(0 if info['cuda_compiled'] and info['devices'] else 'the build does not see a GPU: ' + str(info.get('cuda_error')))
") | tee "$OUT_DIR/build_info.json" || exit 1
python3 benchmarks/packing.py "$OUT_DIR" --steps "${PVM_PACK_STEPS:-tiny=40000,small=20000}" \
    --large "${PVM_LARGE_STEPS:-15000}" --large-every "${PVM_LARGE_EVERY:-5000}" 2>&1 | tee "$OUT_DIR/packing.log" | grep -v '^{'
exit "${PIPESTATUS[0]}"
