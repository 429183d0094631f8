#!/usr/bin/env bash
# Learning curves of the opt-in precisions beside FP32's (issue 12 item 3): one spec and n_seq on synthetic balls,
# the same seed and frames for fp32, tf32 and bf16 (no MLflow, no readout, so it runs on a bare GPU host too).
# Prints the layer-0 two-step prediction error of each along the way, and each run's training speed.
#   bash benchmarks/precision_curves.sh SPEC STEPS N_SEQ [OUT_DIR]
set -uo pipefail
SPEC=${1:-small}; STEPS=${2:-50000}; N_SEQ=${3:-256}; OUT_DIR=${4:-${OUT:-benchmarks/out}}
mkdir -p "$OUT_DIR"
for P in fp32 tf32 bf16; do
    run="$OUT_DIR/precision_${SPEC}_${N_SEQ}_$P"
    pvm-dist train --spec "$SPEC" --data synthetic:balls --steps "$STEPS" --n-seq "$N_SEQ" -O "precision=$P" --no-track \
        --readout-from 1000000000 --metrics-every $(( STEPS / 20 )) --picture-every 0 --run-dir "$run" -q --json \
        > "$run.json" || exit 1
done
python3 - "$OUT_DIR" "$SPEC" "$N_SEQ" <<'PY'
import json, sys
out, spec, n_seq = sys.argv[1:]
curves = {}
for p in ("fp32", "tf32", "bf16"):
    curves[p] = [json.loads(line) for line in open(f"{out}/precision_{spec}_{n_seq}_{p}/metrics.jsonl")]
print(f"== {spec}, n_seq {n_seq}, synthetic balls: layer-0 two-step RMSE (px) by precision; copy-last-frame px")
print("| step | fp32 | tf32 | bf16 | copy-last-frame |")
print("|---|---:|---:|---:|---:|")
for rows in zip(*curves.values()):
    f, t, b = rows
    print(f"| {f['step']:,} | {f.get('l0_two_step_px', float('nan')):.2f} | {t.get('l0_two_step_px', float('nan')):.2f} "
          f"| {b.get('l0_two_step_px', float('nan')):.2f} | {f.get('baseline_two_step_px', float('nan')):.2f} |")
print("steps/s over the run (last interval): " + ", ".join(f"{p} {c[-1]['steps_per_s']:,.0f}" for p, c in curves.items()))
PY
