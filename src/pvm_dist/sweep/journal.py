"""The sweep journal: what a sweep is and everything that happened to it, on the driver's disk.

A sweep lives in ``<root>/<sweep_id>/``:

- ``sweep.json``: the sweep file as loaded (``SweepSpec.to_dict()``) and its trial plan, written once;
- ``journal.jsonl``: one JSON event per line, appended (and flushed to disk) by the driver, its only writer;
- ``trials/<trial_id>/checkpoints/step_*.pvmckpt``: each trial's last few checkpoints and its best;
  ``checkpoint.pvmckpt`` (the latest) and ``best.pvmckpt`` are hard links to two of them
  (:mod:`pvm_dist.sweep.checkpoints`); ``trials/<trial_id>/pictures/``.

Replaying the journal gives the state of every trial (:class:`SweepState`): that is how
``pvm-dist sweep resume`` continues after the driver died, and how ``pvm-dist sweep status`` reads a
running sweep from another terminal. A torn last line (the driver killed while writing) is skipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

#: A trial's status. PENDING and RUNNING trials are the work left; the others are final.
PENDING, RUNNING, FINISHED, STOPPED, FAILED = "PENDING", "RUNNING", "FINISHED", "STOPPED", "FAILED"
FINAL_STATUSES = (FINISHED, STOPPED, FAILED)

DEFAULT_ROOT = Path("pvm-sweeps")


class SweepNotFound(FileNotFoundError):
    """No sweep of that id under the sweeps folder (a user error)."""


def new_sweep_id(name: str) -> str:
    """``<name>-<YYYYmmdd-HHMMSS>-<4 hex>``: sortable by time, unique across drivers."""
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name).strip("-") or "sweep"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@dataclasses.dataclass
class TrialState:
    """One trial as the journal tells it."""

    trial_id: str
    status: str = PENDING
    step: int = 0  # last step reported
    checkpoint_step: int = 0  # step of trials/<id>/checkpoint.pvmckpt (0: none)
    best_step: int = 0  # step of trials/<id>/best.pvmckpt, the best checkpoint by the sweep metric
    best_metric: float | None = None
    run_id: str | None = None  # its nested MLflow run
    metric: float | None = None  # the sweep metric at the last report
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    frames_per_s: float | None = None
    steps_per_s: float | None = None
    node: str | None = None
    gpu: str | None = None
    actor: str | None = None
    starts: int = 0  # how many times it was started (1 + restarts)
    start_cost_s: list[float] = dataclasses.field(default_factory=list)  # on an actor that had run a trial before
    reason: str | None = None  # why it FAILED or STOPPED
    updated: float = 0.0


@dataclasses.dataclass
class SweepState:
    """Every trial's state, the failures so far, the ASHA rungs and the sweep's own status."""

    trials: dict[str, TrialState]
    status: str = RUNNING  # RUNNING, FINISHED, FAILED, INTERRUPTED
    reason: str | None = None
    failures: int = 0
    parent_run_id: str | None = None
    mlflow_uri: str | None = None
    experiment: str | None = None
    driver: dict[str, Any] = dataclasses.field(default_factory=dict)
    rungs: list[tuple[str, int, float]] = dataclasses.field(default_factory=list)  # (trial, milestone, value)
    started: float | None = None
    ended: float | None = None

    def unfinished(self) -> list[str]:
        return [t for t, s in self.trials.items() if s.status not in FINAL_STATUSES]

    def apply(self, ev: dict[str, Any]) -> None:
        """Fold one journal event into the state."""
        kind, t = ev.get("event"), self.trials.get(ev.get("trial", ""))
        now = float(ev.get("time", 0.0))
        if kind == "sweep_started":
            self.status, self.reason = RUNNING, None
            self.parent_run_id = ev.get("parent_run_id") or self.parent_run_id
            self.mlflow_uri, self.experiment = ev.get("mlflow_uri"), ev.get("experiment")
            self.driver = {k: ev.get(k) for k in ("host", "pid")}
            self.started = self.started or now
        elif kind == "sweep_ended":
            self.status, self.reason, self.ended = ev["status"], ev.get("reason"), now
        elif kind == "failure":
            self.failures += 1
        elif kind == "milestone":
            self.rungs.append((ev["trial"], int(ev["step"]), float(ev["value"])))
        if t is None:
            return
        t.updated = now
        if kind == "trial_run":
            t.run_id = ev["run_id"]
        elif kind == "trial_started":
            t.status, t.step, t.starts = RUNNING, int(ev["step"]), t.starts + 1
            t.node, t.gpu, t.actor = ev.get("node"), ev.get("gpu"), ev.get("actor")
            if ev.get("warm"):
                t.start_cost_s.append(float(ev["start_cost_s"]))
        elif kind == "progress":
            t.step = int(ev["step"])
            t.metrics = dict(ev.get("metrics") or {})
            t.metric = ev.get("metric")
            t.frames_per_s, t.steps_per_s = ev.get("frames_per_s"), ev.get("steps_per_s")
        elif kind == "checkpoint":
            t.checkpoint_step = int(ev["step"])
            if ev.get("best"):
                t.best_step, t.best_metric = int(ev["step"]), ev.get("metric")
        elif kind == "trial_lost":
            t.status, t.reason = PENDING, ev.get("reason")
            t.step = t.checkpoint_step
        elif kind == "trial_retry":  # sweep resume --retry-failed: a FAILED trial runs again
            t.status, t.reason, t.step = PENDING, None, t.checkpoint_step
        elif kind == "trial_ended":
            t.status, t.reason = ev["status"], ev.get("reason")
            t.step = int(ev.get("step", t.step))


class SweepFolder:
    """The files of one sweep (see the module docstring)."""

    def __init__(self, root: Path, sweep_id: str) -> None:
        self.root, self.sweep_id = Path(root), sweep_id
        self.path = self.root / sweep_id
        self.journal_file = self.path / "journal.jsonl"
        self.sweep_file = self.path / "sweep.json"

    @classmethod
    def create(cls, root: Path, sweep_id: str, sweep: dict[str, Any], trials: list[dict[str, Any]]) -> SweepFolder:
        folder = cls(root, sweep_id)
        folder.path.mkdir(parents=True, exist_ok=False)
        _write_atomic(folder.sweep_file, json.dumps({"sweep_id": sweep_id, "created": time.time(),
                                                     "sweep": sweep, "trials": trials}, indent=2) + "\n")
        return folder

    @classmethod
    def open(cls, root: Path, sweep_id: str) -> SweepFolder:
        folder = cls(root, sweep_id)
        if not folder.sweep_file.exists():
            known = sorted(p.parent.name for p in Path(root).glob("*/sweep.json"))
            hint = f"; sweeps there: {', '.join(known[-5:])}" if known else ""
            raise SweepNotFound(f"no sweep '{sweep_id}' under {Path(root).resolve()}{hint}")
        return folder

    def definition(self) -> dict[str, Any]:
        return json.loads(self.sweep_file.read_text())

    def trial_dir(self, trial_id: str) -> Path:
        return self.path / "trials" / trial_id

    def checkpoint_file(self, trial_id: str) -> Path:
        return self.trial_dir(trial_id) / "checkpoint.pvmckpt"

    def append(self, event: str, *, durable: bool = True, **fields: Any) -> dict[str, Any]:
        """Append one event. Every event reaches the OS at once, so a killed driver loses none; ``durable``
        ones are also fsynced (a machine crash), which progress reports, re-sent after a resume, skip."""
        record = {"time": time.time(), "event": event, **fields}
        line = json.dumps(record, default=_json_default) + "\n"
        with open(self.journal_file, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        return record

    def events(self) -> list[dict[str, Any]]:
        if not self.journal_file.exists():
            return []
        out = []
        for line in self.journal_file.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line
            if isinstance(rec, dict):
                out.append(rec)
        return out

    def state(self) -> SweepState:
        trials = self.definition()["trials"]
        state = SweepState({t["trial_id"]: TrialState(t["trial_id"]) for t in trials})
        for ev in self.events():
            state.apply(ev)
        return state


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)
