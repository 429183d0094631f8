#!/usr/bin/env bash
# On a GPU host, from the repository root: build the native engine, check it against the reference
# (pytest -m gpu), benchmark small/med/LARGE, and write benchmarks/results-<gpu>.md (+ JSON).
#   bash benchmarks/gpu_run.sh [OUT_DIR]        # default OUT_DIR: $OUT or benchmarks/out
# The GPU host's copy of the tree has no .git: pass the commit as PVM_COMMIT=$(git rev-parse --short HEAD).
# Environment: PVM_GPU_TESTS (a pytest -k filter), PVM_RACECHECK (n_seq cases of dev/cuda/racecheck.py, default
# all; "none" skips it), PVM_BENCH_STEPS (n_seq=1 steps, default 500),
# PVM_BENCH_SPECS (default small,med,LARGE), PVM_BENCH_BATCHES (n_seq list for the batch rows, frames on
# the device, default 2,4,8,16,64,256,1024; "none" skips them), PVM_SITE (a tar.xz of Python packages
# the host lacks, unpacked onto PYTHONPATH). Every row carries the roofline of its regime (memory or
# FP32 compute, Topology.roofline) and the measured ratio to it.
# Needs: Python with numpy, pybind11, scikit-build-core, cmake, typer, pytest; nvcc. No network.
set -uo pipefail
OUT_DIR=${1:-${OUT:-benchmarks/out}}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1
STEPS=${PVM_BENCH_STEPS:-500}
BATCHES=${PVM_BENCH_BATCHES:-2,4,8,16,64,256,1024}
SPECS=${PVM_BENCH_SPECS:-small,med,LARGE}
if [ -n "${PVM_SITE:-}" ]; then mkdir -p /tmp/site && tar xJf "$PVM_SITE" -C /tmp/site && export PYTHONPATH=/tmp/site; fi

echo "== GPU"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT_DIR/gpu.txt"
echo "== build (sm_${PVM_CUDA_ARCHS:-90a})"
start=$(date +%s)
CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${PVM_CUDA_ARCHS:-90a}" python3 -m pip install --no-build-isolation --no-deps -q . \
    > "$OUT_DIR/build.log" 2>&1 || { tail -30 "$OUT_DIR/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
cd /tmp && python3 -c "import pvm_dist._native as n, json; print(json.dumps(n.build_info()))" | tee "$OUT_DIR/build_info.json"; cd - > /dev/null

echo "== exactness and determinism on the GPU"
python3 -P -m pytest -q -m gpu -p no:cacheprovider -s tests/test_native_engine.py ${PVM_GPU_TESTS:+-k "$PVM_GPU_TESTS"} 2>&1 | tee "$OUT_DIR/gpu_tests.txt" | grep -E "vs |passed|failed|Error" | tail -40

if [ "${PVM_RACECHECK:-}" != "none" ]; then
    echo "== racecheck of the fused passes ${PVM_RACECHECK:-(every case)}"
    timeout 300 compute-sanitizer --tool racecheck python3 -P dev/cuda/racecheck.py ${PVM_RACECHECK:-} > "$OUT_DIR/racecheck.txt" 2>&1
    grep -E "SUMMARY" "$OUT_DIR/racecheck.txt" | tee -a "$OUT_DIR/gpu_tests.txt"
fi

echo "== benchmark"
pvm-dist bench --spec "$SPECS" --n-seq 1 --steps "$STEPS" --json > "$OUT_DIR/bench_nseq1.json" || exit 1
pvm-dist bench --spec "$SPECS" --n-seq 1 --steps "$STEPS" --frames device --json > "$OUT_DIR/bench_nseq1_device.json" || exit 1
if [ "$BATCHES" != "none" ]; then
    pvm-dist bench --spec "$SPECS" --n-seq "$BATCHES" --steps 50 --warmup 10 --frames device --json \
        > "$OUT_DIR/bench_batch.json" || exit 1
fi
python3 benchmarks/write_results.py "$OUT_DIR" | tee "$OUT_DIR/results.md"
