"""Sweeps on an autoscaling cluster shaped like those under clusters/: a CPU-only head and GPU nodes that
start at zero. A sweep that asks for GPUs makes the autoscaler add GPU nodes through its pending workers,
each worker comes up as its node joins, and no trial runs on the head or on a CPU worker; with
``trials_per_gpu: 2`` two trials share one GPU at once."""

from __future__ import annotations

import time

import pytest
from fake_autoscaler import autoscaling_cluster
from sweep_helpers import RAY_ENV, mlflow_runs, trial_runs

pytest.importorskip("ray")
pytest.importorskip("mlflow")
pytestmark = pytest.mark.slow

#: GPU nodes of one logical GPU and two CPUs, none at first, at most two.
GPU_NODES = {"gpu": {"resources": {"CPU": 2, "GPU": 1}, "min_workers": 0, "max_workers": 2}}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    for key, value in RAY_ENV.items():
        mp.setenv(key, value)
    import ray

    with autoscaling_cluster(tmp_path_factory.mktemp("autoscaler"), head_cpus=1, node_types=GPU_NODES) as address:
        ray.init(address=address, logging_level="WARNING", log_to_driver=False)  # the driver's connect() reuses it
        try:
            yield address
        finally:
            ray.shutdown()
    mp.undo()


def sweep_of(seeds: list[int], **resources) -> object:
    from pvm_dist.sweep.plan import load_sweep

    return load_sweep({"name": "auto", "spec": "tiny", "steps": 200, "checkpoint_every": 100, "metrics_every": 50,
                       "n_seq": 1, "backend": "native", "data": "synthetic:balls", "vary": {"seed": seeds},
                       "resources": resources})


def options(tmp_path, address: str, **fields):
    from pvm_dist.sweep.driver import DriverOptions

    return DriverOptions(address=address, mlflow_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", root=tmp_path / "sweeps",
                         no_worker_timeout_s=240, **fields)


def test_gpu_sweep_waits_for_autoscaled_gpu_nodes_and_never_runs_on_the_head(cluster, tmp_path, monkeypatch):
    import ray

    from pvm_dist.sweep import driver
    from pvm_dist.sweep.driver import run_sweep

    monkeypatch.setattr(driver, "WAIT_NOTICE_S", 0.0)  # announce the wait however fast the fake autoscaler is

    assert "GPU" not in ray.cluster_resources()  # nothing to place a GPU worker on yet
    notices: list[str] = []
    out = run_sweep(sweep_of([1, 2, 3, 4], gpus_per_actor=1), options(tmp_path, cluster, on_notice=notices.append))
    head = ray.get_runtime_context().get_node_id()  # the test's driver runs on the head
    assert out.status == "FINISHED", out.reason
    assert any("waiting for a node with 1 GPU + 1 CPU" in n for n in notices), notices
    assert {t["status"] for t in out.trials} == {"FINISHED"}
    for t in out.trials:
        assert t["gpu"] not in (None, "cpu") and not head.startswith(t["node"]), t
    placed = [w for w in out.workers if w["where"] != "starting"]  # one GPU each, one GPU per node: two nodes
    assert len(placed) == 2 and all(w["where"].endswith("gpu 0") for w in placed), out.workers
    # Once the queue drained, the workers never placed and the first idle one were released.
    assert sum(w["retired"] for w in out.workers) >= len(out.workers) - 1, out.workers
    runs = trial_runs(mlflow_runs(tmp_path, "auto"))
    assert sorted(runs) == ["t000", "t001", "t002", "t003"]
    assert all(r.data.tags["gpu"] != "cpu" for r in runs.values())


def test_two_trials_share_one_gpu_at_once(cluster, tmp_path):
    import ray

    from pvm_dist.sweep.driver import run_sweep

    deadline = time.monotonic() + 90  # the previous sweep's nodes scale down when idle
    while ray.cluster_resources().get("GPU", 0) and time.monotonic() < deadline:
        time.sleep(1)
    seen: list[tuple[int, float]] = []  # (trials running, GPUs in the cluster) at each update

    def update(driver) -> None:
        seen.append((len(driver.live), ray.cluster_resources().get("GPU", 0.0)))

    out = run_sweep(sweep_of([1, 2], trials_per_gpu=2, cpus_per_actor=1), options(tmp_path, cluster, on_update=update))
    assert out.status == "FINISHED", out.reason
    assert (2, 1.0) in seen, seen  # both trials ran while the cluster had one GPU
    assert [t["gpu"] for t in out.trials] == ["0", "0"]
