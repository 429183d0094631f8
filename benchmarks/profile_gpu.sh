#!/usr/bin/env bash
# On a GPU host, from the repository root: build the native engine and profile one training step of
# small.json with Nsight Compute (hardware counters per kernel), at n_seq = 1 and n_seq = 256.
#   bash benchmarks/profile_gpu.sh [OUT_DIR]     # writes ncu-small-nseq{1,256}.csv and a summary
# Skip the build with PVM_SKIP_BUILD=1 (after gpu_run.sh in the same call). Clocks are left alone
# (--clock-control none), as the device notes ask.
set -uo pipefail
OUT_DIR=${1:-${OUT:-benchmarks/out}}
mkdir -p "$OUT_DIR"
if [ -z "${PVM_SKIP_BUILD:-}" ]; then
    CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=${PVM_CUDA_ARCHS:-90}" python3 -m pip install --no-build-isolation --no-deps -q . \
        > "$OUT_DIR/build.log" 2>&1 || { tail -30 "$OUT_DIR/build.log"; exit 1; }
fi
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
METRICS=gpu__time_duration.sum,dram__bytes.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,\
smsp__sass_thread_inst_executed_op_ffma_pred_on.sum,lts__t_bytes.sum.per_second,\
smsp__average_warp_latency_issue_stalled_long_scoreboard,smsp__average_warp_latency_issue_stalled_barrier,\
smsp__average_warp_latency_issue_stalled_mio_throttle,smsp__average_warp_latency_issue_stalled_short_scoreboard,\
smsp__average_warp_latency_issue_stalled_math_pipe_throttle,smsp__average_warp_latency_issue_stalled_lg_throttle,\
launch__registers_per_thread,launch__grid_size,launch__block_size
for n in 1 256; do
    # Warm up 30 steps untraced, then trace the kernels of two steps (one graph launch each).
    steps=$(( n == 1 ? 40 : 12 )); per_step=$(( n == 1 ? 9 : 12 ))  # kernels in one step's graph
    cd /tmp
    "$NCU" --clock-control none --metrics "$METRICS" --csv --page raw --print-units base --launch-skip $(( (steps - 4) * per_step )) \
        --launch-count $(( 3 * per_step )) python3 "$OLDPWD/benchmarks/profile_step.py" small "$n" "$steps" \
        > "$OUT_DIR/ncu-small-nseq$n.csv" 2> "$OUT_DIR/ncu-small-nseq$n.log"
    cd - > /dev/null
    echo "== small n_seq=$n: $(grep -c '"' "$OUT_DIR/ncu-small-nseq$n.csv") rows"
    python3 benchmarks/profile_summary.py "$OUT_DIR/ncu-small-nseq$n.csv" | tee "$OUT_DIR/ncu-small-nseq$n.md"
done
