#!/usr/bin/env bash
# Learning curves: train a spec on synthetic balls and on a video, print error vs the copy-last-frame
# baseline along the way (no MLflow, no readout, so it runs on a bare GPU host too).
#   bash benchmarks/learning_curves.sh SPEC STEPS VIDEO [OUT_DIR]
set -uo pipefail
SPEC=${1:-small}; STEPS=${2:-100000}; VIDEO=${3:-../shared/data/bigbuckbunny.mp4}; OUT_DIR=${4:-${OUT:-benchmarks/out}}
mkdir -p "$OUT_DIR"
for DATA in synthetic:balls "$VIDEO"; do
    tag=$(basename "$DATA" | tr ':.' '__')
    pvm-dist train --spec "$SPEC" --data "$DATA" --steps "$STEPS" --no-track --readout-from 1000000000 \
        --metrics-every $(( STEPS / 20 )) --picture-every 0 --run-dir "$OUT_DIR/curve_${SPEC}_${tag}" -q --json \
        > "$OUT_DIR/curve_${SPEC}_${tag}.json" || exit 1
    echo "== $SPEC on $DATA: step, layer-0 two-step RMSE px, copy-last-frame px, MSE ratio, steps/s"
    python3 - "$OUT_DIR/curve_${SPEC}_${tag}/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    print(f"{m['step']:>9,} {m.get('l0_two_step_px', float('nan')):8.2f} {m.get('baseline_two_step_px', float('nan')):8.2f} "
          f"{m.get('ratio_two_step', float('nan')):7.3f} {m['steps_per_s']:9,.0f}")
PY
done
