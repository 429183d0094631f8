"""The sweep journal under damage (issue 16, item 10): every bad line is skipped with a warning naming it,
a torn last line does not swallow the next event, a lost journal is an error, and the store a sweep tracks
to is known from its creation on."""

from __future__ import annotations

import json
import logging

import pytest
from sweep_helpers import run, sweep_file

from pvm_dist.sweep.journal import FINISHED, PENDING, RUNNING, SweepFolder, SweepNotFound

TRIALS = [{"trial_id": t} for t in ("t0", "t1")]

#: Damages to one line between two good events: (what it is, the bytes written, the warning's words).
CORRUPTIONS = [
    ("schema-invalid", b'{"time": 1, "event": "trial_ended", "trial": "t0"}\n', "without a valid 'status'"),
    ("not an object", b"[1, 2, 3]\n", "not a JSON object"),
    ("no kind", b'{"time": 1, "trial": "t0"}\n', "no event kind"),
    ("non-UTF-8", b'{"time": 1, "event": "progress", "trial": "t0", "step": 5\xff}\n', "not UTF-8"),
    ("garbage", b"\x00\x01 not json\n", "not JSON"),
    ("wrong type", b'{"time": 1, "event": "checkpoint", "trial": "t0", "step": "ten"}\n', "valid 'step'"),
    ("unhashable trial", b'{"time": 1, "event": "progress", "trial": ["t0"], "step": 3}\n', "valid 'trial'"),
]


def _folder(root) -> SweepFolder:
    folder = SweepFolder.create(root, "s", {"name": "s"}, TRIALS, {"mlflow_uri": "sqlite:///x.db",
                                                                       "experiment": "e"})
    folder.append("sweep_started", parent_run_id="p", mlflow_uri="sqlite:///x.db", experiment="e")
    folder.append("trial_started", trial="t0", step=0)
    return folder


@pytest.mark.parametrize("what,line,words", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_a_damaged_line_is_skipped_with_a_warning_naming_it(tmp_path, caplog, what, line, words):
    folder = _folder(tmp_path)
    with open(folder.journal_file, "ab") as f:
        f.write(line)
    folder.append("checkpoint", trial="t0", step=100)
    folder.append("trial_ended", trial="t1", status=FINISHED, step=400)
    with caplog.at_level(logging.WARNING, logger="pvm_dist.sweep.journal"):
        st = folder.state()
    assert (st.trials["t0"].status, st.trials["t0"].checkpoint_step) == (RUNNING, 100)
    assert st.trials["t1"].status == FINISHED
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "line 3 skipped" in warned[0] and words in warned[0], warned


def test_a_torn_last_line_does_not_swallow_the_next_event(tmp_path, caplog):
    folder = _folder(tmp_path)
    with open(folder.journal_file, "ab") as f:
        f.write(b'{"time": 1, "event": "trial_ended", "trial": "t0", "sta')  # the driver killed mid-write
    folder.append("trial_ended", trial="t1", status=FINISHED, step=400)  # the resumed driver's first event
    with caplog.at_level(logging.WARNING, logger="pvm_dist.sweep.journal"):
        st = folder.state()
    assert st.trials["t1"].status == FINISHED
    assert st.trials["t0"].status == RUNNING
    assert ["line 3 skipped" in r.getMessage() for r in caplog.records] == [True]


def test_a_lost_journal_is_an_error_not_a_fresh_start(tmp_path):
    folder = _folder(tmp_path / "sweeps")
    folder.journal_file.unlink()
    with pytest.raises(SweepNotFound, match="lost its journal"):
        SweepFolder.open(tmp_path / "sweeps", "s")
    res = run(tmp_path, "status", "s")  # the CLI (--root tmp/sweeps): one line, exit 2
    assert res.returncode == 2 and "lost its journal" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.parametrize("content,words", [
    (b'{"sweep_id": "s", "sweep": {"na', "not valid JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[]", "not a sweep definition"),
    (b'{"sweep": {}, "trials": [{"id": "t0"}]}', "not a sweep definition"),
], ids=["torn", "binary", "a list", "trials without ids"])
def test_a_damaged_definition_is_an_error_naming_the_file(tmp_path, content, words):
    folder = _folder(tmp_path / "sweeps")
    folder.sweep_file.write_bytes(content)
    with pytest.raises(SweepNotFound, match=words):
        SweepFolder.open(tmp_path / "sweeps", "s")
    for command in (("status", "s"), ("resume", "s")):  # the CLI (--root tmp/sweeps): one line, exit 2
        res = run(tmp_path, *command)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert "sweep.json is damaged" in res.stderr and words in res.stderr


def test_a_sweep_another_driver_runs_is_not_resumed_beside_it(tmp_path):
    """Resumed while its driver ran, a sweep's trials were trained twice into the same checkpoints and runs."""
    from pvm_dist.tracking.owner import LOCK_FILE, take

    folder = _folder(tmp_path / "sweeps")
    held = take(folder.path / LOCK_FILE)  # as the running driver holds it
    try:
        res = run(tmp_path, "resume", "s")
    finally:
        held.release()
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "sweep s is being run by another driver" in res.stderr
    assert [e["event"] for e in folder.events()] == ["sweep_started", "trial_started"]  # nothing appended


def test_the_store_is_known_from_creation_before_any_event(tmp_path):
    """A driver killed before ``sweep_started``: the resume must log where the sweep was told to, not to
    ./mlflow.db."""
    folder = SweepFolder.create(tmp_path, "s", {"name": "s"}, TRIALS,
                                {"mlflow_uri": "http://127.0.0.1:9/x", "experiment": "exp"})
    st = SweepFolder.open(tmp_path, "s").state()
    assert (st.mlflow_uri, st.experiment) == ("http://127.0.0.1:9/x", "exp")
    assert st.trials["t0"].status == PENDING
    assert json.loads(folder.sweep_file.read_text())["tracking"]["mlflow_uri"] == "http://127.0.0.1:9/x"


def test_sweep_json_of_a_new_sweep_records_its_store(tmp_path):
    """Through the driver's entry point, without Ray: the folder is created with the store it will use."""
    from pvm_dist.sweep import driver
    from pvm_dist.sweep.plan import load_sweep

    made = {}

    class Stop(Exception):
        pass

    def fake_driver(folder, *args):
        made["folder"] = folder
        raise Stop

    sweep = load_sweep(sweep_file(tmp_path, "rec"))
    opts = driver.DriverOptions(mlflow_uri="sqlite:///somewhere.db", root=tmp_path / "sweeps")
    mp = pytest.MonkeyPatch()
    mp.setattr(driver, "connect", lambda address: None)
    mp.setattr(driver, "cluster_resources", lambda: {"CPU": 2.0})
    mp.setattr(driver, "Driver", fake_driver)
    try:
        with pytest.raises(Stop):
            driver.run_sweep(sweep, opts)
    finally:
        mp.undo()
    tracking = made["folder"].definition()["tracking"]
    assert tracking == {"mlflow_uri": "sqlite:///somewhere.db", "experiment": "rec"}


def test_steps_reported_before_a_restart_are_remembered(tmp_path):
    """A trial lost at step 150 continues from its checkpoint at 100: the journal still knows what steps up
    to 150 reported, and when, so the restarted trial's run gets them again as they were first logged (MLflow
    stores an identical point once) and the redone steps are not logged a second time."""
    folder = _folder(tmp_path)
    folder.append("checkpoint", trial="t0", step=100)
    first = folder.append("progress", trial="t0", step=150, metrics={"loss": 0.5})
    folder.append("trial_lost", trial="t0", reason="worker lost")
    folder.append("trial_started", trial="t0", step=100)
    folder.append("progress", trial="t0", step=150, metrics={"loss": 0.5, "steps_per_s": 9.0})  # redone
    st = folder.state()
    assert st.trials["t0"].step == 150
    assert st.trials["t0"].logged == {150: (int(first["time"] * 1000), {"loss": 0.5})}
