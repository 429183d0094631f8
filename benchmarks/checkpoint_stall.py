#!/usr/bin/env python3
"""What a LARGE checkpoint costs the training, as the sweep worker takes it (issue 13, item 5).

Trains LARGE on one GPU through a :class:`~pvm_dist.run.session.Session` (n_seq 1, synthetic balls, no readout),
first 20,000 steps so that every layer learns, then 10,000 steps at a time in turn: with no checkpoint; with the
state handed over later every 2,500 steps (``Session.state_later`` and ``ray.put`` on a thread, as the worker
does); and with the state taken at once (``Session.state`` and ``ray.put`` on the training thread, as before).
Prints steps/s and the training thread's median stall per checkpoint. Needs a CUDA build and CuPy.

    python3 benchmarks/checkpoint_stall.py
"""

import time
from concurrent import futures

import numpy as np
import ray

from pvm_dist.model.spec import load_spec
from pvm_dist.run.config import RunConfig
from pvm_dist.run.session import Session

EVERY, STEPS, CHUNK = 2500, 10000, 500


def measure(session: Session, pool: futures.Executor, mode: str) -> None:
    pending, stalls = None, []
    t0 = time.perf_counter()
    for _ in range(STEPS // EVERY):
        for _ in range(EVERY // CHUNK):
            session.advance(CHUNK)
        t = time.perf_counter()
        if pending is not None:
            pending.result()
        if mode == "sync":
            ray.put(session.state().to_dict())
        elif mode == "later":
            later = session.state_later()
            pending = pool.submit(lambda: ray.put(later().to_dict()))
        stalls.append(time.perf_counter() - t)
    if pending is not None:
        pending.result()
    rate = STEPS / (time.perf_counter() - t0)
    print(f"{mode:5s}: {rate:7,.0f} steps/s over {STEPS:,} steps; training thread stalled "
          f"{1e3 * np.median(stalls):.1f} ms per checkpoint (median)", flush=True)


def main() -> None:
    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, logging_level="ERROR")
    config = RunConfig(spec=load_spec("LARGE"), steps=10**6, backend="native", device="cuda", readout=False,
                       animation_frames=0, heldout_steps=0, track=False, metrics_every=CHUNK)
    session = Session(config)
    session.advance(20000)  # past the schedule's ramp: every layer learns
    session.take_metrics()
    with futures.ThreadPoolExecutor(1) as pool:
        for mode in ("none", "later", "none", "later", "sync", "none"):
            measure(session, pool, mode)


if __name__ == "__main__":
    main()
