#!/usr/bin/env bash
# On a multi-GPU host, from the repository root: build the native engine, then run the benchmark sweep
# (experiments/gpu_small_4trials.yaml, 4 trials of small.json) once on one GPU worker and once on one
# worker per GPU, with MLflow on SQLite; write benchmarks/out/sweep-results.md (+ the JSON outcomes).
#   bash benchmarks/sweep_gpu.sh [OUT_DIR]          # default OUT_DIR: $OUT or benchmarks/out
# Ray and MLflow: where the host lacks them, unpack the bundle built by ../shared/tools/gpu_host_bundle.py:
#   mkdir -p /tmp/site && tar xJf .gpuhost/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
# Sweep folders and the MLflow store go to /tmp (checkpoints of small are 140 MB each); only the
# journals, outcomes and results come back in OUT_DIR. PVM_COMMIT names the commit in the results.
set -uo pipefail
OUT_DIR=${1:-${OUT:-benchmarks/out}}
SWEEP=${PVM_SWEEP_FILE:-experiments/gpu_small_4trials.yaml}
WORK=${PVM_SWEEP_WORK:-/tmp/pvm-sweep-bench}
mkdir -p "$OUT_DIR" "$WORK"
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT_DIR/gpus.txt"
if ! python3 -c "import pvm_dist._native" 2>/dev/null; then
    CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${PVM_CUDA_ARCHS:-90}" python3 -m pip install --no-build-isolation --no-deps -q . \
        > "$OUT_DIR/build.log" 2>&1 || { tail -30 "$OUT_DIR/build.log"; exit 1; }
fi
n_gpus=$(nvidia-smi -L | wc -l)
for workers in 1 "$n_gpus"; do
    echo "== sweep with $workers GPU worker(s)"
    root="$WORK/sweeps-$workers"
    rm -rf "$root" "$WORK/mlflow-$workers.db" "$WORK/mlartifacts"
    (cd "$WORK" && pvm-dist sweep run "$OLDPWD/$SWEEP" --max-concurrent "$workers" --root "$root" \
        --mlflow "sqlite:///$WORK/mlflow-$workers.db" --json) > "$OUT_DIR/sweep-$workers.json" 2> "$OUT_DIR/sweep-$workers.err"
    rc=$?
    tail -3 "$OUT_DIR/sweep-$workers.err"
    cp "$root"/*/journal.jsonl "$OUT_DIR/journal-$workers.jsonl" 2>/dev/null
    [ $rc -eq 0 ] || { echo "sweep failed (exit $rc)"; exit $rc; }
done
python3 benchmarks/write_sweep_results.py "$OUT_DIR" 1 "$n_gpus" | tee "$OUT_DIR/sweep-results.md"
