"""What a sweep's end tells the user: exit codes and failure reasons, ``sweep resume --retry-failed``, and the
worker pool that grows to the trials that can run and releases idle workers. The CLI runs in this process
with the scripted executor of tests/scripted_executor.py standing in for Ray (the whole-cluster cases are in
tests/test_sweep_cluster.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from scripted_executor import make_driver

from pvm_dist.cli.main import main
from pvm_dist.sweep import driver as driver_module
from pvm_dist.sweep import pool
from pvm_dist.sweep.plan import Resources, load_sweep

pytest.importorskip("mlflow")

real_opener = driver_module.run_opener  # before the scripted fixture swaps it


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``pvm-dist ARGS`` in this process: (exit code, stdout, stderr)."""
    old = sys.argv
    sys.argv = ["pvm-dist", *args]
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return code, out.out, out.err


def sweep_args(tmp_path: Path, seeds: list[int], mlflow_uri: str) -> list[str]:
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "s", "spec": "tiny", "steps": 600, "checkpoint_every": 200,
                                 "metrics_every": 100, "vary": {"seed": seeds}, "max_failures": 5}))
    return [str(f), "--root", str(tmp_path / "sweeps"), "--mlflow", mlflow_uri, "--experiment", tmp_path.name, "-q"]


@pytest.mark.parametrize(("failing", "code", "said"), [
    (set(), 0, None),
    ({2}, 3, "1 of 2 trials failed"),
    ({1, 2}, 4, "every trial failed"),
])
def test_exit_code_says_whether_trials_failed_and_the_summary_says_why(tmp_path, capsys, scripted, mlflow_uri,
                                                                       failing, code, said):
    scripted.fail = staticmethod(lambda trial: trial.seed in failing)
    rc, out, err = cli(capsys, "sweep", "run", *sweep_args(tmp_path, [1, 2], mlflow_uri))
    assert rc == code, err
    if said is None:
        assert "FAILED" not in out + err
        # Where to look: the experiment's runs and the best trial's charts, in the MLflow UI's model-training view.
        from mlflow import MlflowClient

        eid = MlflowClient(mlflow_uri).get_experiment_by_name(tmp_path.name).experiment_id
        assert f"  runs   http://127.0.0.1:5000/#/experiments/{eid}/runs?workflowType=machine_learning" in out
        assert f"/#/experiments/{eid}/runs/" in out.split("  charts ")[1] and "/model-metrics?workflowType" in out
        return
    assert said in err and "--retry-failed" in err
    for seed in failing:
        assert f"t00{seed - 1} FAILED at step 0: DataError: no such file" in out + err


def test_retry_failed_reruns_a_failed_trial_in_its_own_run_once_the_cause_is_fixed(tmp_path, capsys, scripted,
                                                                                    mlflow_uri):
    data = tmp_path / "frames.bin"  # the trial with seed 2 needs it; it appears after the first run
    scripted.fail = staticmethod(lambda trial: trial.seed == 2 and not data.exists())
    args = sweep_args(tmp_path, [1, 2], mlflow_uri)
    assert cli(capsys, "sweep", "run", *args)[0] == 3
    sweep_id = next((tmp_path / "sweeps").iterdir()).name
    root = ["--root", str(tmp_path / "sweeps"), "-q"]
    rc, _, err = cli(capsys, "sweep", "resume", sweep_id, *root)
    assert rc == 2 and "1 failed: rerun them with --retry-failed" in err
    data.write_bytes(b"ready")
    rc, out, err = cli(capsys, "sweep", "resume", sweep_id, "--retry-failed", *root)
    assert rc == 0, err
    from pvm_dist.sweep.journal import SweepFolder

    folder = SweepFolder.open(tmp_path / "sweeps", sweep_id)
    state = folder.state()
    assert {t: s.status for t, s in state.trials.items()} == {"t000": "FINISHED", "t001": "FINISHED"}
    runs = [e for e in folder.events() if e["event"] == "trial_run" and e["trial"] == "t001"]
    assert len(runs) == 1  # one MLflow run for the trial, reopened by the retry
    import mlflow

    run = mlflow.MlflowClient(mlflow_uri).get_run(runs[0]["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["sweep_status"] == "FINISHED"
    assert run.data.metrics["ratio_two_step"] == 2.0  # trained after the retry


def test_the_pool_grows_to_the_trials_that_can_run_and_releases_idle_workers(tmp_path, scripted, mlflow_uri):
    seen: list[int] = []
    d = make_driver(tmp_path, mlflow_uri, vary={"seed": [1, 2, 3]}, max_concurrent=2,
                    on_update=lambda drv: seen.append(len(drv.executor.alive())))
    assert d.run().status == "FINISHED"
    ex = scripted.last
    assert max(seen) == 2 and len(ex.workers) == 2  # max_concurrent workers, none started beyond
    assert ex.retired  # the queue drained while a trial still ran: its idle neighbour was released


def test_pool_demand_gpu_asked_never_falls_back_to_cpu():
    asked = Resources(gpus_per_actor=0.5)
    assert pool.decide(asked, {"CPU": 8.0}, local=False) == pool.Demand(0.5, 1.0, None, asked=True)
    assert pool.decide(asked, {"CPU": 8.0}, local=False).describe() == "0.5 GPU (2 trials per GPU) + 1 CPU"
    with pytest.raises(ValueError, match="asks for 0.5 GPU per trial .* this machine's Ray has 0 GPU"):
        pool.decide(asked, {"CPU": 8.0}, local=True)
    assert pool.decide(Resources(), {"CPU": 8.0, "GPU": 2.0}, local=True).gpus == 1.0
    cpu = pool.decide(Resources(cpus_per_actor=2.0), {"CPU": 8.0}, local=True)
    assert (cpu.gpus, cpu.limit) == (0.0, 4)
    assert pool.wanted(cpu, None, pending=9, running=1) == 4 and pool.wanted(cpu, 2, 9, 1) == 2
    assert pool.wanted(pool.decide(asked, {}, local=False), None, pending=3, running=1) == 4
    assert load_sweep({"spec": "tiny", "steps": 10, "resources": {"trials_per_gpu": 4}}).resources.gpus_per_actor == 0.25


def test_a_trial_larger_than_its_share_of_the_gpu_is_refused_before_it_starts():
    from pvm_dist.model.spec import load_spec
    from pvm_dist.model.topology import build_topology

    small = pool.trial_device_bytes(build_topology(load_spec("small")), n_seq=1)
    large = pool.trial_device_bytes(build_topology(load_spec("LARGE")), n_seq=1)
    assert small < large and large > 8 * build_topology(load_spec("LARGE")).n_weights
    h200 = 141 * 10**9
    assert pool.memory_problem(small, h200, 1 / 8) is None
    problem = pool.memory_problem(large, 2 * 2**30, 1 / 4)
    assert problem.startswith("the trial needs about") and "its share of the GPU is 0.50 GiB (0.25 of 2.0 GiB)" in problem


def test_checkpoints_are_kept_once_on_disk_and_a_slow_store_does_not_block_the_loop(tmp_path, scripted, mlflow_uri,
                                                                                    monkeypatch):
    """The writer thread takes 0.6 s a checkpoint, the tracking store 0.4 s a metrics call and 0.5 s to open a
    trial's run (a slow disk, a slow server): the loop's longest stretch of work stays far below any of them, and
    superseded states are dropped."""
    import time

    from pvm_dist.run import state as run_state
    from pvm_dist.sweep import checkpoints as store_module
    from pvm_dist.tracking.mlflow_sink import MlflowSink
    from pvm_dist.tracking.tracker import Tracker

    real_save, real_log, real_start = run_state.save, MlflowSink.log_metrics, Tracker.start.__func__

    def slow_save(*args, **kwargs):
        time.sleep(0.6)
        return real_save(*args, **kwargs)

    def slow_log(self, batch):
        time.sleep(0.4)
        return real_log(self, batch)

    def slow_start(cls, *args, **kwargs):
        if kwargs.get("parent_run_id"):  # a trial's run, not the sweep's own
            time.sleep(0.5)
        return real_start(cls, *args, **kwargs)

    monkeypatch.setattr(store_module.run_state, "save", slow_save)
    monkeypatch.setattr(MlflowSink, "log_metrics", slow_log)
    monkeypatch.setattr(Tracker, "start", classmethod(slow_start))
    monkeypatch.setattr(driver_module, "run_opener", real_opener)  # the driver's own thread, not the inline one
    d = make_driver(tmp_path, mlflow_uri, vary={"seed": [1, 2]}, steps=600, checkpoint_every=100, keep_checkpoints=2)
    out = d.run()
    assert out.status == "FINISHED" and out.longest_block_s < 0.3, out.longest_block_s  # a 2-core CI box, busy
    assert out.longest_run_open_s >= 0.5  # the slow opening happened, off the loop
    assert out.checkpoints_dropped > 0  # states arriving faster than the disk takes them: the older ones dropped
    artifacts = Path(mlflow_uri.removeprefix("sqlite:///")).parent / "mlartifacts" / d.experiment  # MLflow's store
    files = [*tmp_path.rglob("*.pvmckpt"), *artifacts.rglob("*.pvmckpt")]
    inodes = {p.stat().st_ino for p in files}
    for trial in ("t000", "t001"):
        folder = d.folder.trial_dir(trial)
        steps = sorted(p.name for p in (folder / "checkpoints").iterdir())
        assert steps[-1] == "step_000000600.pvmckpt" and len(steps) <= 3  # last 2 and the best
        assert checkpoint_step(folder / "checkpoint.pvmckpt") == 600  # what a resume reads: the final state
        assert (folder / "checkpoint.pvmckpt").samefile(folder / "checkpoints" / steps[-1])
        assert (folder / "best.pvmckpt").samefile(folder / "checkpoints" / steps[0])  # constant metric: the first
    # Every .pvmckpt anywhere is one of the sweep's files: MLflow's local artifact store holds each trial's
    # final checkpoint as a link to it, not a copy.
    assert inodes == {p.stat().st_ino for p in files if d.folder.path in p.parents}
    published = [p for p in files if d.folder.path not in p.parents]
    assert len(published) == 2 and all(p.parent.name == "checkpoints" and artifacts in p.parents for p in published)
    assert d.state.trials["t000"].checkpoint_step == 600 and d.state.trials["t000"].best_metric == 1.0


def checkpoint_step(path: Path) -> int:
    from pvm_dist.io import checkpoint

    return checkpoint.load(path).step


def test_the_disk_a_large_run_takes_is_said_before_it_starts(tmp_path):
    from pvm_dist.model.spec import load_spec
    from pvm_dist.run import state as run_state
    from pvm_dist.run.config import RunConfig

    small = RunConfig(spec=load_spec("small"), n_seq=1, readout=False)
    assert abs(run_state.checkpoint_bytes(small) - 144_749_880) < 0.03 * 144_749_880  # a real small checkpoint
    assert run_state.disk_note(RunConfig(spec=load_spec("tiny")), 3, 4, "x") is None
    note = run_state.disk_note(small, 3, 8, "pvm-sweeps/s")
    assert note == "checkpoints will take up to 3.5 GB under pvm-sweeps/s (8 runs × 3 kept × 145 MB)"


def test_gpu_workers_report_utilisation_memory_and_power_under_mlflow_system_names(monkeypatch):
    """NVML faked (this machine has no GPU): the names MLflow's System Metrics tab reads, one set per GPU."""
    import types

    from pvm_dist.sweep.gpu_metrics import gpu_sampler

    calls: list[int] = []
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: calls.append(i) or i,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=40 + h),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=512 * 2**20, total=2048 * 2**20),
        nvmlDeviceGetPowerUsage=lambda h: 350_000,
        nvmlDeviceGetEnforcedPowerLimit=lambda h: 700_000)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert gpu_sampler([]) is None  # a CPU worker
    sample = gpu_sampler(["3"])
    assert calls == [3] and sample() == {
        "system/gpu_3_utilization_percentage": 43.0, "system/gpu_3_memory_usage_megabytes": 512.0,
        "system/gpu_3_memory_usage_percentage": 25.0, "system/gpu_3_power_usage_watts": 350.0,
        "system/gpu_3_power_usage_percentage": 50.0}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: no figures, no error
    assert gpu_sampler(["0"]) is None


@pytest.mark.parametrize("readout,said", [({}, True), ({"readout": False}, False)])
def test_a_gpu_sweep_says_the_host_readout_will_hold_its_trials_back(tmp_path, scripted, mlflow_uri, monkeypatch,
                                                                   readout, said):
    """The readout trains on the host at every step: on GPU workers that, not the engine, sets a trial's
    speed (tiny ~550 steps/s on an H200), so a GPU sweep with it on says so before its trials start."""
    import dataclasses

    monkeypatch.setattr(scripted, "cluster_resources", lambda self: {"CPU": 2.0, "GPU": 1.0})
    d = make_driver(tmp_path, mlflow_uri, vary={"seed": [1]}, **readout)
    notices: list[str] = []
    d.opts = dataclasses.replace(d.opts, on_notice=notices.append)
    assert d.run().status == "FINISHED"
    assert d.demand.gpus == 1.0
    hits = [n for n in notices if "readout on the host" in n]
    assert len(hits) == (1 if said else 0)
    if said:
        assert hits[0].startswith("each trial trains the readout on the host at every step from step 0")
        assert "readout: false in a sweep file" in hits[0]


def test_a_run_config_names_the_readout_cost_only_while_the_readout_trains():
    from pvm_dist.model.spec import load_spec
    from pvm_dist.run.config import RunConfig

    tiny = load_spec("tiny")
    assert "from step 500" in RunConfig(spec=tiny, steps=1000, readout_from=500).readout_note()
    assert RunConfig(spec=tiny, steps=1000, readout_from=1000).readout_note() is None
    assert RunConfig(spec=tiny, steps=1000, readout=False).readout_note() is None


def test_a_state_handed_over_later_is_fetched_by_the_writer_and_a_lost_one_is_reported(tmp_path):
    """The checkpoint writer calls what fetches a deferred state (on its thread, not the loop's); a state lost on
    its way (its worker died before the fetch) is a failed checkpoint with its reason, and the trial's earlier
    checkpoint stays what a resume reads."""
    import threading

    import numpy as np

    from pvm_dist.model.spec import load_spec
    from pvm_dist.run import state as run_state
    from pvm_dist.run.config import RunConfig
    from pvm_dist.run.state import RunState
    from pvm_dist.sweep.checkpoints import LATEST, CheckpointStore

    config = RunConfig(spec=load_spec("tiny"))
    fetched_on: list[str] = []

    def state(step: int) -> RunState:
        fetched_on.append(threading.current_thread().name)
        return RunState({"step": step, "weights": np.full(4, step, np.float32)}, {}, config)

    def lost() -> RunState:
        raise ConnectionError("owner of the object died\nmore lines")

    store = CheckpointStore(lambda t: tmp_path / t, keep_last=2, better=lambda a, b: a < b)
    store.submit("t000", 100, lambda: state(100), {}, 1.0)
    store.wait("t000")
    store.submit("t000", 200, lost, {}, 0.5)
    store.close()
    first, second = store.take_written()
    assert (first.step, first.error) == (100, None) and fetched_on == ["pvm-checkpoints"]
    assert second.step == 200 and second.error == "not received: ConnectionError: owner of the object died"
    kept, _ = run_state.load(tmp_path / "t000" / LATEST)
    assert kept.step == 100 and kept.engine["weights"].tolist() == [100.0] * 4
