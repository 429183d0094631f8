"""The sweep's progress as a table: live while the driver runs, and from the journal for ``sweep status``.

Both read the same :class:`~pvm_dist.sweep.journal.SweepState`, so what another terminal shows is what
the driver's terminal shows.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from pvm_dist.sweep.journal import FINAL_STATUSES, RUNNING, SweepState
from pvm_dist.sweep.plan import trial_steps
from pvm_dist.tracking.compare import short_name

FAILED_SHOWN = 5  # failed trials whose reasons the table's caption shows
STATUS_STYLE = {"RUNNING": "cyan", "FINISHED": "green", "STOPPED": "yellow", "FAILED": "red", "PENDING": "dim"}


def rows(state: SweepState, trials: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """One dict per trial: id, varied values, status, step (of its steps), the step of its kept checkpoint (where
    it continues), fps, metric, ETA (s), where it runs."""
    out = []
    for t in trials:
        ts, its_steps = state.trials[t["trial_id"]], trial_steps(t, steps)
        eta = None
        if ts.status == RUNNING and ts.steps_per_s:
            eta = (its_steps - ts.step) / ts.steps_per_s
        out.append({"trial_id": ts.trial_id, "varied": t.get("varied", {}), "status": ts.status, "step": ts.step,
                    "steps": its_steps, "checkpoint_step": ts.checkpoint_step,
                    "frames_per_s": ts.frames_per_s, "metric": ts.metric, "eta_s": eta,
                    "where": f"{ts.node or ''} gpu {ts.gpu}" if ts.gpu and ts.gpu != "cpu" else (ts.node or ""),
                    "run_id": ts.run_id, "starts": ts.starts, "reason": ts.reason})
    return out


def overall_eta(state: SweepState, trials: list[dict[str, Any]], steps: int) -> float | None:
    """Steps left over all unfinished trials divided by the steps/s of those running now."""
    left = sum(trial_steps(t, steps) - state.trials[t["trial_id"]].step for t in trials
               if state.trials[t["trial_id"]].status not in FINAL_STATUSES)
    rate = sum(t.steps_per_s or 0.0 for t in state.trials.values() if t.status == RUNNING)
    if left == 0:
        return 0.0
    return left / rate if rate > 0 else None


def summary(state: SweepState, trials: list[dict[str, Any]], steps: int, metric: str, mode: str) -> dict[str, Any]:
    """What ``sweep status --json`` prints."""
    counts = dict(Counter(t.status for t in state.trials.values()))
    return {"status": state.status, "reason": state.reason, "counts": counts, "failures": state.failures,
            "metric": metric, "mode": mode, "steps": steps, "eta_s": overall_eta(state, trials, steps),
            "parent_run_id": state.parent_run_id, "mlflow_uri": state.mlflow_uri, "experiment": state.experiment,
            "driver": state.driver, "trials": rows(state, trials, steps)}


def table(state: SweepState, trials: list[dict[str, Any]], steps: int, metric: str, title: str, to_ask: int = 0,
          waiting: str | None = None) -> Any:
    """A rich Table of the trials; its caption: the overall ETA, why trials failed, what the sweep waits for;
    ``to_ask``: trials an adaptive search has still to ask for (not in ``trials`` yet)."""
    from rich.table import Table

    varied_keys: list[str] = []
    for t in trials:
        for k in t.get("varied", {}):
            if k not in varied_keys:
                varied_keys.append(k)
    tab = Table(title=title, show_edge=False, header_style="bold")
    for col in ["trial", *[short_name(k) for k in varied_keys], "status", "step", "frames/s", metric, "ETA", "where"]:
        tab.add_column(col, justify="left" if col in ("trial", "status", "where") else "right")
    for r in rows(state, trials, steps):
        style = STATUS_STYLE.get(r["status"], "")
        tab.add_row(r["trial_id"], *[_fmt(r["varied"].get(k)) for k in varied_keys], f"[{style}]{r['status']}[/{style}]",
                    f"{r['step']:,}/{r['steps']:,}", _fmt(r["frames_per_s"], ",.0f"), _fmt(r["metric"], ".4g"),
                    _duration(r["eta_s"]), r["where"])
    done = sum(1 for t in state.trials.values() if t.status in FINAL_STATUSES)
    lines = [f"{done}/{len(trials) + to_ask} trials done · failures {state.failures} · "
             f"overall ETA {_duration(overall_eta(state, trials, steps))}"]
    failed = [t for t in state.trials.values() if t.status == "FAILED"]
    lines += [f"[red]{t.trial_id} failed[/red]: {t.reason}" for t in failed[:FAILED_SHOWN]]
    if len(failed) > FAILED_SHOWN:
        lines.append(f"and {len(failed) - FAILED_SHOWN} more failed (pvm-dist sweep status --json)")
    if waiting:
        lines.append(f"[yellow]{waiting}[/yellow]")
    tab.caption = "\n".join(lines)
    return tab


def log_line(state: SweepState, trials: list[dict[str, Any]], steps: int, metric: str) -> str:
    """One plain line of the sweep's progress (for logs that are not a terminal): trials done, each running
    trial's step and metric, the overall ETA."""
    done = sum(1 for t in state.trials.values() if t.status in FINAL_STATUSES)
    running = [f"{r['trial_id']} {r['step']:,}/{r['steps']:,} {metric} {_fmt(r['metric'], '.4g')}"
               for r in rows(state, trials, steps) if r["status"] == RUNNING]
    return (f"{done}/{len(trials)} trials done · running: {', '.join(running) or 'none'} · "
            f"overall ETA {_duration(overall_eta(state, trials, steps))}")


def _fmt(value: Any, spec: str = "") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and spec:
        return format(value, spec)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return time.strftime("%H:%M:%S", time.gmtime(max(seconds, 0.0))) if seconds < 86400 else f"{seconds / 86400:.1f} d"
