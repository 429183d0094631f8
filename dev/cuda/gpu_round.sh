#!/usr/bin/env bash
# One round of kernel work on a GPU host, from the repository root: build the engine (in the
# background) while the workbench checks and times the kernels, then bench small at the n_seq list,
# racecheck the fused passes, and run a subset of the GPU tests. Everything lands in $OUT.
#   PVM_SEQS=2,4,16 PVM_TESTS='tiny or bit_identical' bash dev/cuda/gpu_round.sh
# PVM_SITE: a tar.xz of Python packages the host lacks (unpacked onto PYTHONPATH).
set -o pipefail
OUT=${OUT:-/tmp/pvm-round}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -n "${PVM_SITE:-}" ]; then mkdir -p /tmp/site && tar xJf "$PVM_SITE" -C /tmp/site && export PYTHONPATH=/tmp/site; fi
(CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90" python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/build.log" 2>&1
 echo "build rc $?" >> "$OUT/build.log") &
bash dev/cuda/run_all.sh > "$OUT/workbench.txt" 2>&1; grep -E "^==|n_seq|us,|FAIL|passed|error" "$OUT/workbench.txt"
wait; tail -2 "$OUT/build.log"
pvm-dist bench --spec small --steps 200 --warmup 20 --frames device --json --n-seq "${PVM_SEQS:-2,4,16}" \
    > "$OUT/bench.json" 2> "$OUT/bench.err" || tail -3 "$OUT/bench.err"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(r["n_seq"], round(r["frames_per_s"]), round(r["ratio_to_floor"], 3),
          {k: round(v * 1000, 1) for k, v in r["phases_ms"].items()})
PY
timeout 150 compute-sanitizer --tool racecheck python3 -P dev/cuda/racecheck.py > "$OUT/racecheck.txt" 2>&1
echo "racecheck rc $?: $(grep -E 'SUMMARY' "$OUT/racecheck.txt")"
if [ -n "${PVM_TESTS:-}" ]; then
    timeout "${PVM_TESTS_TIMEOUT:-200}" python3 -P -m pytest -q -m gpu -p no:cacheprovider -s tests/test_native_engine.py \
        -k "$PVM_TESTS" 2>&1 | grep -E "vs |passed|failed|Error|assert" > "$OUT/tests.txt"
    grep -E "failed|passed|Error" "$OUT/tests.txt" | tail -5
fi
if [ -n "${PVM_NCU:-}" ]; then  # PVM_NCU="16": Nsight Compute on a workbench pass at that n_seq (PVM_NCU_KERNEL: weight_pass_mma or w0_span_pass)
    ncu --clock-control none --set full -k regex:${PVM_NCU_KERNEL:-weight_pass_mma} -c 1 /tmp/pvm-dev-cuda/weight_pass_mma $PVM_NCU \
        > "$OUT/ncu.txt" 2>&1; grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Bank|Stall|stall|One or More|Warp Cycles|Issued|L1/TEX Hit|L2 Hit|Executed Ipc" "$OUT/ncu.txt" | head -40
fi
