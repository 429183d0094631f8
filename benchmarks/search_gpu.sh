#!/usr/bin/env bash
# On a one-GPU host, from the repository root: build the native engine with CUDA, check it reports CUDA, then run
# the random / TPE / PBT comparison of the small model (benchmarks/search_compare.py --preset small-gpu).
#   bash benchmarks/search_gpu.sh [OUT_DIR] [extra search_compare.py arguments]   # OUT_DIR default: $OUT
# Ray, MLflow and Optuna: where the host lacks them, unpack the bundle of ../shared/tools/gpu_host_bundle.py to
# /tmp/site and put wheels of optuna and colorlog in .whl/ (both are installed there and put on PYTHONPATH).
# PVM_SEARCH_SECONDS bounds the comparison (default 240): the JSON is written after each search, so a cut run
# keeps what it made.
set -uo pipefail
OUT_DIR=${1:-${OUT:-benchmarks/out}}
shift || true
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
if [ -f ../site.tar.xz ] && [ ! -d /tmp/site/ray ]; then mkdir -p /tmp/site && tar -xJf ../site.tar.xz -C /tmp/site; fi
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
start=$(date +%s)
CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${PVM_CUDA_ARCHS:-90}" PVM_DIST_CUDA=ON \
    python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT_DIR/build.log" 2>&1 \
    || { tail -30 "$OUT_DIR/build.log"; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
(cd /tmp && python3 -c "
from pvm_dist.engine.native import build_info
info = build_info()
print({k: info.get(k) for k in ('cuda_compiled', 'devices', 'cuda_error')})
raise SystemExit(0 if info.get('cuda_compiled') and info.get('devices') else 'the native engine does not see CUDA')
") || exit 1
python3 -c "import ray, mlflow, optuna; print('ray', ray.__version__, 'mlflow', mlflow.__version__, 'optuna', optuna.__version__)" \
    || exit 1
work=/tmp/pvm-search-work
rm -rf "$work" && mkdir -p "$work"
timeout "${PVM_SEARCH_SECONDS:-240}" python3 benchmarks/search_compare.py --preset small-gpu --work "$work" \
    --out "$OUT_DIR/results-search-h200.md" "$@" 2>&1 | tee "$OUT_DIR/search.log"
rc=$?
# The sweeps' journals and logs, whether or not the comparison ended in time.
(cd "$work" && tar -czf "$OUT_DIR/sweeps.tgz" --exclude='*.pvmckpt' --exclude='mlartifacts' --exclude='*.db' \
    --exclude='*.png' . 2>/dev/null)
exit $rc
