"""The sweep journal: what a sweep is and everything that happened to it, on the driver's disk.

A sweep lives in ``<root>/<sweep_id>/``:

- ``sweep.json``: the sweep file as loaded (``SweepSpec.to_dict()``) and its trial plan, written once;
- ``journal.jsonl``: one JSON event per line, appended (and flushed to disk) by the driver, its only writer;
  an adaptive search's trials, unknown when the sweep starts, enter it as ``trial_added`` events;
- ``search.optuna.log``: an adaptive search's Optuna study (its journal storage);
- ``trials/<trial_id>/exploit.pvmckpt``: a PBT member's copy of its donor's checkpoint, between its
  ``exploit`` event and taking the place of its own;
- ``trials/<trial_id>/checkpoints/step_*.pvmckpt``: each trial's last few checkpoints and its best;
  ``checkpoint.pvmckpt`` (the latest) and ``best.pvmckpt`` are hard links to two of them
  (:mod:`pvm_dist.sweep.checkpoints`); ``trials/<trial_id>/pictures/``.

Replaying the journal gives the state of every trial (:class:`SweepState`): that is how
``pvm-dist sweep resume`` continues after the driver died, and how ``pvm-dist sweep status`` reads a
running sweep from another terminal. Lines are checked on replay: a torn last line (the driver killed
while writing), a line that is not UTF-8 or not JSON, or an event missing what its kind needs is skipped with
a warning naming the line; the next append starts on a fresh line. A sweep folder without its journal is an
error (replaying nothing would start the sweep over beside its MLflow runs).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

from pvm_dist.tracking.fallback import read_json_lines

#: A trial's status. PENDING and RUNNING trials are the work left; the others are final.
PENDING, RUNNING, FINISHED, STOPPED, FAILED = "PENDING", "RUNNING", "FINISHED", "STOPPED", "FAILED"
FINAL_STATUSES = (FINISHED, STOPPED, FAILED)

DEFAULT_ROOT = Path("pvm-sweeps")

log = logging.getLogger(__name__)

#: What each event kind needs to be applied (name: type); kinds not listed are kept and ignored.
_NUMBER = (int, float)
EVENT_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "sweep_started": {}, "sweep_ended": {"status": str}, "failure": {},
    "milestone": {"trial": str, "step": int, "value": _NUMBER}, "trial_run": {"trial": str, "run_id": str},
    "trial_started": {"trial": str, "step": int}, "progress": {"trial": str, "step": int},
    "checkpoint": {"trial": str, "step": int}, "trial_lost": {"trial": str},
    "trial_paused": {"trial": str, "step": int},
    "trial_ended": {"trial": str, "status": str},
}


class SweepNotFound(FileNotFoundError):
    """No sweep of that id under the sweeps folder, or its journal is gone or its definition damaged (a user
    error)."""


def event_problem(rec: Any) -> str | None:
    """Why ``rec`` (a decoded journal line) cannot be replayed, or None when it can."""
    if not isinstance(rec, dict):
        return "not a JSON object"
    kind = rec.get("event")
    if not isinstance(kind, str):
        return "no event kind"
    if not isinstance(rec.get("time", 0.0), _NUMBER):
        return "a time that is not a number"
    for name, kind_type in EVENT_FIELDS.get(kind, {}).items():
        value = rec.get(name)
        if not isinstance(value, kind_type) or isinstance(value, bool):
            return f"{kind} without a valid {name!r}"
    return None


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
    logged: dict[int, tuple[int, dict[str, float]]] = dataclasses.field(default_factory=dict)  # step -> (ms, metrics)
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
    added: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # trials an adaptive search asked for
    exploits: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # PBT: a member copied a donor
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
            self.mlflow_uri = ev.get("mlflow_uri") or self.mlflow_uri
            self.experiment = ev.get("experiment") or self.experiment
            self.driver = {k: ev.get(k) for k in ("host", "pid")}
            self.started = self.started or now
        elif kind == "sweep_ended":
            self.status, self.reason, self.ended = ev["status"], ev.get("reason"), now
        elif kind == "failure":
            self.failures += 1
        elif kind == "milestone":
            self.rungs.append((ev["trial"], int(ev["step"]), float(ev["value"])))
        elif kind == "trial_added" and ev["trial"] not in self.trials:
            self.trials[ev["trial"]] = TrialState(ev["trial"])
            self.added.append(ev["definition"])
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
            t.logged.setdefault(t.step, (int(now * 1000), t.metrics))  # the first report of a step (kept on restarts)
        elif kind == "checkpoint":
            t.checkpoint_step = int(ev["step"])
            if ev.get("best"):
                t.best_step, t.best_metric = int(ev["step"]), ev.get("metric")
        elif kind == "trial_lost":
            t.status, t.reason = PENDING, ev.get("reason")
            t.step = t.checkpoint_step
        elif kind == "trial_paused":  # PBT: gave its worker to a member behind it; goes on from this step
            t.status, t.reason, t.step = PENDING, ev.get("reason"), int(ev["step"])
        elif kind == "trial_retry":  # sweep resume --retry-failed: a FAILED trial runs again
            t.status, t.reason, t.step = PENDING, None, t.checkpoint_step
        elif kind == "trial_ended":
            t.status, t.reason = ev["status"], ev.get("reason")
            t.step = int(ev.get("step", t.step))
        elif kind == "exploit":  # continues from the donor's checkpoint, copied as its own
            t.status, t.step, t.checkpoint_step = PENDING, int(ev["step"]), int(ev["step"])
            self.exploits.append(ev)


class SweepFolder:
    """The files of one sweep (see the module docstring)."""

    def __init__(self, root: Path, sweep_id: str) -> None:
        self.root, self.sweep_id = Path(root), sweep_id
        self.path = self.root / sweep_id
        self.journal_file = self.path / "journal.jsonl"
        self.fsync_s = 0.0  # seconds spent in the journal's fsyncs (the loop's share of a busy disk)
        self.sweep_file = self.path / "sweep.json"

    @classmethod
    def create(cls, root: Path, sweep_id: str, sweep: dict[str, Any], trials: list[dict[str, Any]],
               tracking: dict[str, Any] | None = None) -> SweepFolder:
        """A new sweep folder: ``sweep.json`` (with ``tracking``: where its MLflow runs go, known before any
        run exists) and an empty journal."""
        folder = cls(root, sweep_id)
        folder.path.mkdir(parents=True, exist_ok=False)
        _write_atomic(folder.sweep_file, json.dumps({"sweep_id": sweep_id, "created": time.time(), "sweep": sweep,
                                                     "trials": trials, "tracking": dict(tracking or {})},
                                                    indent=2) + "\n")
        folder.journal_file.touch()
        return folder

    @classmethod
    def open(cls, root: Path, sweep_id: str) -> SweepFolder:
        folder = cls(root, sweep_id)
        if not folder.sweep_file.exists():
            known = sorted(p.parent.name for p in Path(root).glob("*/sweep.json"))
            hint = f"; sweeps there: {', '.join(known[-5:])}" if known else ""
            raise SweepNotFound(f"no sweep '{sweep_id}' under {Path(root).resolve()}{hint}")
        if not folder.journal_file.exists():
            raise SweepNotFound(f"sweep '{sweep_id}' has lost its journal ({folder.journal_file} is missing); "
                                f"it cannot be resumed or shown (starting it over would duplicate its MLflow runs)")
        folder.definition()  # damaged: said now, not where a command first needs a field
        return folder

    def definition(self) -> dict[str, Any]:
        """``sweep.json`` (written once, atomically): :class:`SweepNotFound` naming it if it was damaged since."""
        try:
            data = json.loads(self.sweep_file.read_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            problem = "not UTF-8"
        except json.JSONDecodeError as exc:
            problem = f"not valid JSON ({exc.msg} at line {exc.lineno})"
        else:
            trials = data.get("trials") if isinstance(data, dict) else None
            if (isinstance(data, dict) and isinstance(data.get("sweep"), dict) and isinstance(trials, list)
                    and all(isinstance(t, dict) and isinstance(t.get("trial_id"), str) for t in trials)):
                return data
            problem = "not a sweep definition (a sweep mapping and a list of trials with their ids)"
        raise SweepNotFound(f"sweep '{self.sweep_id}': {self.sweep_file} is damaged: {problem}; it cannot be resumed "
                            f"or shown")

    def trial_dir(self, trial_id: str) -> Path:
        return self.path / "trials" / trial_id

    def checkpoint_file(self, trial_id: str) -> Path:
        return self.trial_dir(trial_id) / "checkpoint.pvmckpt"

    def append(self, event: str, *, durable: bool = True, **fields: Any) -> dict[str, Any]:
        """Append one event. Every event reaches the OS at once, so a killed driver loses none; ``durable``
        ones are also fsynced (a machine crash), which progress reports, re-sent after a resume, skip."""
        record = {"time": time.time(), "event": event, **fields}
        line = (json.dumps(record, default=_json_default) + "\n").encode("utf-8")
        with open(self.journal_file, "a+b") as f:
            if f.seek(0, os.SEEK_END) > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":  # a torn last line: end it, so it does not swallow this event
                    line = b"\n" + line
            f.write(line)
            f.flush()
            if durable:
                t0 = time.perf_counter()
                os.fsync(f.fileno())
                self.fsync_s += time.perf_counter() - t0
        return record

    def events(self) -> list[dict[str, Any]]:
        """The journal's valid events, in order; every other line skipped with a warning naming it."""
        return read_json_lines(self.journal_file, event_problem, log, "sweep journal")

    def state(self) -> SweepState:
        definition = self.definition()
        trials = definition["trials"]
        state = SweepState({t["trial_id"]: TrialState(t["trial_id"]) for t in trials})
        tracking = definition.get("tracking") or {}
        state.mlflow_uri, state.experiment = tracking.get("mlflow_uri"), tracking.get("experiment")
        for ev in self.events():
            state.apply(ev)
        return state

    def trials(self, state: SweepState) -> list[dict[str, Any]]:
        """Every trial of the sweep: the planned ones, then those its search added (``state.added``), each as
        its latest PBT exploit redefined it."""
        latest = {ev["trial"]: ev["definition"] for ev in state.exploits}
        return [latest.get(t["trial_id"], t) for t in [*self.definition()["trials"], *state.added]]


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)
