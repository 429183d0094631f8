"""``pvm-dist eval``: a trained model's prediction error (and readout IoU) on held-out data.

The checkpoint's weights go into a frozen engine with fresh rings (so ``n_seq`` may differ from
training); the engine runs forward over the data without learning, and its errors are compared with
the copy-last-frame baseline on the same frames. A readout stored in the checkpoint is scored on
labelled data by IoU and hit rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pvm_dist.io import checkpoint
from pvm_dist.data import make_source
from pvm_dist.engine import build_engine
from pvm_dist.run.metrics import CopyLastFrameBaseline, summarize
from pvm_dist.model.readout import chance_scores
from pvm_dist.model.spec import load_spec
from pvm_dist.run.train import READOUT_PREFIX


def evaluate(path: Path, data: str, steps: int = 300, n_seq: int = 1, data_path: str | None = None,
             backend: str = "auto", device: str | None = None, seed: int = 1, warmup: int | None = None) -> dict[str, Any]:
    """Run ``steps`` frozen steps of the checkpoint's model on ``data``; return named metrics.

    The first ``warmup`` steps (default 2·L: fresh rings start all ones and layer ℓ sees the frame ℓ
    steps late) run but are not scored.
    """
    ck = checkpoint.load(path)
    spec = load_spec(ck.spec, name=ck.meta.get("spec_name", "spec"))
    engine = build_engine(spec, backend=backend, n_seq=n_seq, seed=ck.seed or 0, device=device)
    state = engine.state()
    state["weights"] = ck.state["weights"]
    engine.load_state(state)
    engine.freeze()
    source = make_source(data, spec.image_shape, n_seq, seed, data_path=data_path)
    readout_state = {k: v for k, v in ck.state.items() if k.startswith(READOUT_PREFIX)}
    readout = None
    if readout_state and source.labels(0) is not None:
        from pvm_dist.model.readout import Readout

        readout = Readout(engine.topo, seed=0, momentum=spec["momentum"])
        readout.load_state(readout_state)
    baseline = CopyLastFrameBaseline()
    ious, hits, masks = [], [], []
    warmup = 2 * spec.n_layers if warmup is None else warmup
    for s in range(warmup + steps):
        frames = source.frames(s)
        baseline.update(frames)
        engine.step(frames)
        if s + 1 == warmup:
            engine.metrics(), baseline.take()  # discard the transient
        if readout is not None and s >= warmup:
            from pvm_dist.model.readout import hit_rate, iou

            heat = readout.forward(engine.hidden())
            labels = source.labels(s)
            masks.append(labels)
            for q in range(n_seq):
                ious.append(iou(heat[q], labels[q]))
                h = hit_rate(heat[q : q + 1], labels[q : q + 1])
                if np.isfinite(h):
                    hits.append(h)
    out: dict[str, Any] = summarize(engine.metrics(), baseline.take())
    if ious:
        out["readout_iou"] = float(np.mean(ious))
    if hits:
        out["readout_hit_rate"] = float(np.mean(hits))
    if masks:
        out.update(chance_scores(np.concatenate(masks)))
    return {"checkpoint": str(path), "trained_steps": ck.step, "spec": spec.name, "data": data, "steps": steps,
            "warmup": warmup,
            "n_seq": n_seq, "backend": engine.backend, "metrics": out, "mlflow_run_id": ck.meta.get("run_id"),
            "mlflow_uri": ck.meta.get("mlflow_uri")}
