"""``pvm-dist compare``: an MLflow experiment's runs side by side.

Shows the parameters that differ between runs under short names (a spec's own values only where
they vary within one spec), each run's last logged step of the metric and how it ended (finished,
stopped early by ASHA, failed and why, killed), its final metrics and speed. Runs that went the whole
way rank first, best first, as the sweep ranks them: a trial stopped at step 500 is not compared with
one that reached step 1,000. Runs can be grouped over seeds (mean ± std), and the learning curves of
the best runs drawn with their varied values as legends.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from pvm_dist.tracking.defaults import experiment_page, run_page
from pvm_dist.tracking.figures import pyplot, save_figure

#: Metrics where a larger value is better; every other metric sorts ascending (errors, ratios).
HIGHER_IS_BETTER_HINTS = ("iou", "hit", "per_s", "fps")
DEFAULT_METRIC = "ratio_two_step"
SPEED_METRIC = "frames_per_s"


@dataclasses.dataclass
class RunRow:
    run_id: str
    name: str
    status: str
    params: dict[str, str]
    metrics: dict[str, float]
    start_time: int | None
    tags: dict[str, str] = dataclasses.field(default_factory=dict)


#: Short column names of the parameters a sweep or a reader varies most.
SHORT_NAMES = {"initial_learning_rate": "lr", "momentum": "mom", "intermediate_learning_rate": "lr_mid",
               "final_learning_rate": "lr_final", "delay_intermediate_learning_rate": "lr_mid_at",
               "delay_final_learning_rate": "lr_final_at", "delay_each_layer_learning": "layer_delay",
               "hidden_block_size": "hidden", "input_block_size": "block", "layer_shapes": "layers",
               "derivative": "deriv", "spec_name": "spec", "readout_lr": "ro_lr", "readout_from": "ro_from"}


def short_name(param: str) -> str:
    """``varied.initial_learning_rate`` → ``lr``: the prefix dropped, a known name shortened."""
    base = next((param[len(p):] for p in ALIAS_PREFIXES if param.startswith(p)), param)
    return SHORT_NAMES.get(base, base)


def ended(row: RunRow, step: int | None) -> str:
    """How a run ended, from its MLflow status and the sweep's tags."""
    at = "" if step is None else f" at step {step:,}"
    sweep_status, reason = row.tags.get("sweep_status"), row.tags.get("status_reason")
    if sweep_status == "STOPPED":
        return f"stopped by ASHA{at}"
    if row.status == "FAILED" or sweep_status == "FAILED":
        return f"failed{at}: {reason or 'no reason recorded'}"
    if row.status == "KILLED":
        return f"killed{at}"
    if row.status in ("RUNNING", "SCHEDULED"):
        return f"running{at}"
    return "finished"


class CompareError(ValueError):
    """The experiment or metric asked for does not exist (a user error)."""


def higher_is_better(metric: str) -> bool:
    return any(hint in metric for hint in HIGHER_IS_BETTER_HINTS)


def _client(uri: str) -> Any:
    import mlflow

    return mlflow.MlflowClient(tracking_uri=uri)


def load_runs(uri: str, experiment: str, include_nested: bool = True) -> tuple[str, list[RunRow]]:
    """The id of ``experiment`` (name) in the store at ``uri``, and every run of it."""
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise CompareError(f"no experiment named {experiment!r} at {uri} (experiments: {', '.join(names) or 'none'})")
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    rows = []
    for run in runs:
        tags = run.data.tags
        if not include_nested and "mlflow.parentRunId" in tags:
            continue
        if tags.get("pvm_dist.role") == "sweep":  # a sweep's parent run: its trials are the rows
            continue
        rows.append(RunRow(run.info.run_id, run.info.run_name or run.info.run_id[:8], run.info.status,
                           dict(run.data.params), dict(run.data.metrics), run.info.start_time, dict(tags)))
    return exp.experiment_id, rows


#: Param prefixes that repeat one value under several names (a sweep trial logs ``varied.lr``,
#: ``spec.lr`` and ``overrides.lr``); the first of them found is the one shown.
ALIAS_PREFIXES = ("varied.", "spec.", "overrides.")


#: Params that say how a run was set up, not what it is (shown nowhere as columns).
NOT_COLUMNS = ("spec", "overrides", "heldout")


def differing_params(rows: list[RunRow]) -> list[str]:
    """Parameters whose values are not the same in every run (a missing value counts as different),
    each shown once: of ``varied.X``, ``spec.X`` and ``overrides.X`` with equal values, only the first.
    A ``spec.X`` counts only where it differs between runs of one spec (else ``spec_name`` says it all)."""
    keys = sorted({k for r in rows for k in r.params} - set(NOT_COLUMNS))
    by_spec: dict[str | None, list[RunRow]] = {}
    for r in rows:
        by_spec.setdefault(r.params.get("spec_name"), []).append(r)

    def varies(k: str) -> bool:
        groups = by_spec.values() if k.startswith("spec.") else [rows]
        return any(len({r.params.get(k) for r in g}) > 1 for g in groups)

    varying = [k for k in keys if varies(k)]
    def prefix(key: str) -> int:  # index in ALIAS_PREFIXES, -1 for other keys
        return next((i for i, p in enumerate(ALIAS_PREFIXES) if key.startswith(p)), -1)

    shown: set[tuple[str, tuple]] = set()
    out = []
    for k in sorted(varying, key=prefix):
        i = prefix(k)
        if i >= 0:
            alias = (k[len(ALIAS_PREFIXES[i]):], tuple(r.params.get(k) for r in rows))
            if alias in shown:
                continue
            shown.add(alias)
        out.append(k)
    return sorted(out)


def sort_rows(rows: list[RunRow], metric: str, descending: bool | None = None) -> list[RunRow]:
    """Finished runs with the metric first, best first; then stopped, failed or killed ones, best first;
    runs without it last, newest first."""
    desc = higher_is_better(metric) if descending is None else descending
    have = [r for r in rows if metric in r.metrics and math.isfinite(r.metrics[metric])]
    lack = sorted((r for r in rows if r not in have), key=lambda r: -(r.start_time or 0))
    complete = [r for r in have if ended(r, None) == "finished"]
    partial = [r for r in have if r not in complete]
    return (sorted(complete, key=lambda r: r.metrics[metric], reverse=desc)
            + sorted(partial, key=lambda r: r.metrics[metric], reverse=desc) + lack)


def last_step(client: Any, run_id: str, metric: str) -> int | None:
    """The last step at which ``metric`` was logged (a resumed run's too), or None."""
    history = client.get_metric_history(run_id, metric)
    return max((m.step for m in history), default=None)


def label(params: dict[str, Any]) -> str:
    """``lr=0.002 mom=0.9``: the varied values under their short names."""
    return " ".join(f"{short_name(k)}={v}" for k, v in params.items() if v is not None)


def group_by(runs: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Runs that differ only in ``key`` (e.g. ``seed``) as one row: the metric's mean ± std and the count."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        rest = tuple((k, v) for k, v in r["params"].items() if short_name(k) != key)
        groups.setdefault(rest, []).append(r)
    out = []
    for rest, members in groups.items():
        values = [m["metric"] for m in members if m["metric"] is not None]
        mean = sum(values) / len(values) if values else None
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        out.append({"params": dict(rest), "runs": len(members), "metric_mean": mean, "metric_std": std if values else None,
                    "names": [m["name"] for m in members], "run_ids": [m["run_id"] for m in members]})
    return out


def comparison(uri: str, experiment: str, metric: str = DEFAULT_METRIC, descending: bool | None = None) -> dict[str, Any]:
    """Everything ``pvm-dist compare`` shows, as JSON-able data."""
    experiment_id, rows = load_runs(uri, experiment)
    if rows and not any(metric in r.metrics for r in rows):
        known = sorted({m for r in rows for m in r.metrics})
        raise CompareError(f"no run of {experiment!r} has metric {metric!r} (metrics: {', '.join(known) or 'none'})")
    varying = differing_params(rows)
    ordered = sort_rows(rows, metric, descending)
    client = _client(uri)
    runs = []
    for r in ordered:
        step = last_step(client, r.run_id, metric)
        params = {k: r.params.get(k) for k in varying}
        runs.append({"run_id": r.run_id, "name": r.name, "status": r.status, "ended": ended(r, step), "step": step,
                     "params": params, "label": label(params) or r.name, "metric": r.metrics.get(metric),
                     "frames_per_s": r.metrics.get(SPEED_METRIC), "metrics": r.metrics,
                     "mlflow_page": run_page(uri, experiment_id, r.run_id)})
    return {
        "experiment": experiment,
        "mlflow_uri": uri,
        "experiment_id": experiment_id,
        "mlflow_page": experiment_page(uri, experiment_id),
        "metric": metric,
        "descending": higher_is_better(metric) if descending is None else descending,
        "differing_params": varying,
        "columns": {k: short_name(k) for k in varying},
        "runs": runs,
    }


def plot_curves(uri: str, run_ids: list[str], names: list[str], metric: str, path: Path) -> Path:
    """Learning curves (metric against step) of the given runs, as a PNG."""
    plt = pyplot()

    client = _client(uri)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for run_id, name in zip(run_ids, names):
        history = sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)
        if history:
            ax.plot([m.step for m in history], [m.value for m in history], label=name)
    if metric.startswith("ratio"):
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="baseline (ratio 1)")
    ax.set_xlabel("step")
    ax.set_ylabel(metric + (" (MSE ratio, < 1 beats the baseline)" if metric.startswith("ratio") else ""))
    ax.set_title(f"{metric} of the top {len(run_ids)} runs")
    ax.grid(alpha=0.3)
    if run_ids:
        ax.legend(fontsize=8)
    return save_figure(fig, path)
