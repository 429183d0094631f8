"""The worker pool's policy: what a worker claims and how many the sweep wants now. No Ray, no I/O.

A sweep that asks for GPUs (``resources.gpus_per_actor`` or ``trials_per_gpu``) only ever gets GPU
workers: it wants one worker per trial that could run now, ``min(max_concurrent, pending + running)``,
whatever the cluster holds at the moment. Workers the cluster cannot place yet stay pending in Ray,
and pending actors are the demand that Ray's autoscaler answers with new GPU nodes; each worker comes
up as a node joins. When the queue drains, idle workers are released so their nodes can scale down.

A sweep that says nothing about GPUs uses GPU workers when the cluster has GPUs as it starts, else
CPU workers (one per ``cpus_per_actor`` CPUs of the cluster, or ``cpu_workers``), and says so up front.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pvm_dist.model.topology import Topology
from pvm_dist.sweep.plan import Resources

__all__ = ["Demand", "decide", "memory_problem", "trial_device_bytes", "wanted"]

#: A process's CUDA context and the engine's workspace, beside the model's own arrays (measured: ~0.3-0.5 GB).
CONTEXT_BYTES = 512 * 2**20


@dataclasses.dataclass(frozen=True)
class Demand:
    """What each worker claims and at most how many workers the pool holds (None: as many as trials need)."""

    gpus: float  # per worker; 0: CPU workers
    cpus: float
    limit: int | None
    asked: bool  # the sweep file asked for GPUs

    def describe(self) -> str:
        """What one worker waits for, in words (the first-worker wait and its timeout say it)."""
        if not self.gpus:
            return f"{self.cpus:g} CPU"
        share = f"{self.gpus:g} GPU" + (f" ({round(1 / self.gpus)} trials per GPU)" if self.gpus < 1 else "")
        return f"{share} + {self.cpus:g} CPU"


def decide(resources: Resources, cluster: Mapping[str, float], local: bool) -> Demand:
    """The pool's demand on a cluster holding ``cluster`` resources now; ``local``: a Ray this process
    started (nothing will ever join it). Raises ValueError when GPUs are asked for and can never come."""
    gpus_now = float(cluster.get("GPU", 0.0))
    if resources.wants_gpu:
        gpus = float(resources.gpus_per_actor or 1.0)
        if local and gpus_now < gpus:
            raise ValueError(f"the sweep asks for {gpus:g} GPU per trial (resources) but this machine's Ray has "
                             f"{gpus_now:g} GPU; run it on a cluster with GPU nodes (--address), or drop "
                             f"resources.gpus_per_actor / trials_per_gpu to train on CPU workers")
        return Demand(gpus, resources.cpus_per_actor, None, asked=True)
    if gpus_now >= 1.0:
        return Demand(1.0, resources.cpus_per_actor, None, asked=False)
    cpu_slots = max(1, int(float(cluster.get("CPU", 1.0)) // resources.cpus_per_actor))
    return Demand(0.0, resources.cpus_per_actor, resources.cpu_workers or cpu_slots, asked=False)


def wanted(demand: Demand, cap: int | None, pending: int, running: int) -> int:
    """How many workers the sweep wants now: one per trial that could run, within the caps."""
    n = pending + running
    for limit in (cap, demand.limit):
        if limit is not None:
            n = min(n, limit)
    return n


def trial_device_bytes(topology: Topology, n_seq: int) -> int:
    """Device memory one trial takes: weights and momentum (fp32), n_seq sequences' activations, the context."""
    return 8 * topology.n_weights + n_seq * topology.activation_bytes_per_step + CONTEXT_BYTES


def memory_problem(need: int, device_total: int, share: float) -> str | None:
    """Why a trial needing ``need`` bytes cannot start on its ``share`` of a device of ``device_total`` bytes
    (several trials per GPU each get 1/k of it), or None when it fits."""
    have = int(device_total * min(share, 1.0))
    if need <= have:
        return None
    return (f"the trial needs about {need / 2**30:.2f} GiB of device memory but its share of the GPU is "
            f"{have / 2**30:.2f} GiB ({share:g} of {device_total / 2**30:.1f} GiB); lower resources.trials_per_gpu "
            f"or n_seq")
